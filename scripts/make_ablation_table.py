"""The τ ablation table (issue: BFT for SASRec, item 6) from run directories.

    python scripts/make_ablation_table.py --runs results/office_sasrec/ablation --out results/office_sasrec/tau_ablation

Reads each run's ``metrics.json``. Runs made before the trainer logged the initial mean Kalman gain
carry it in ``gain_first_batch.json`` next to ``metrics.json``, written once by
``bftrec.evaluate.replay_gain`` (which rebuilds the model with the run's seed, calibrates on the same
batch, then loads the run's checkpoint); a run without either file is replayed now, which needs its
``checkpoint.pt`` and the data root. One row per cell (tau.scale x tau.kind x tau.freq_slope); the row with the best
validation NDCG@10 is marked: that choice sets the defaults of ``configs/layer/bft.yaml``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tables import header, load_runs  # noqa: E402


def first_batch_gain(run: dict) -> dict:
    """Initial/final K on the first batch: from metrics.json, else from the run's
    ``gain_first_batch.json`` (committed), else replayed from its checkpoint and written there."""
    gain = run.get("mechanism", {}).get("gain_first_batch")
    if gain is not None:
        return gain
    cached = run["_ranks"].parent / "gain_first_batch.json"
    if cached.exists():
        return json.loads(cached.read_text())
    from bftrec.evaluate import replay_gain  # needs the run's checkpoint.pt and the data root

    gain = replay_gain(run["_ranks"].parent)
    cached.write_text(json.dumps(gain, indent=2) + "\n")
    return gain


def row(run: dict) -> dict:
    tau = run["layer_config"]["tau"]
    mech = run.get("mechanism", {})
    gain = first_batch_gain(run)
    k_list = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    return {
        "tau.scale": tau["scale"], "tau.kind": tau["kind"], "tau.freq_slope": tau["freq_slope"],
        "valid HR@10": run["valid"]["HR@10"], "valid NDCG@10": run["valid"]["NDCG@10"],
        "test HR@10": run["test"]["overall"]["HR@10"], "test NDCG@10": run["test"]["overall"]["NDCG@10"],
        "Q0 test HR@10": run["test"]["by_item_freq"][0]["HR@10"],
        "cold test HR@10": run["test"]["cold_users"]["HR@10"],
        "initial K (per layer)": k_list(gain["initial_K_per_layer"]),
        "final K (per layer)": k_list(gain["final_K_per_layer"]),
        "final K test histories": k_list([layer["K"] for layer in mech["per_layer"]]),
        "best epoch": run["best_epoch"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="path without suffix; writes .md and .csv")
    args = ap.parse_args(argv)
    runs = load_runs(args.runs)
    df = pd.DataFrame([row(r) for r in runs]).sort_values(["tau.scale", "tau.kind", "tau.freq_slope"])
    best = df["valid NDCG@10"].idxmax()
    df["chosen"] = ""
    df.loc[best, "chosen"] = "best valid NDCG@10"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out.with_suffix(".csv"), index=False)
    cells = ", ".join(f"{k}={df.loc[best, k]}" for k in ("tau.scale", "tau.kind", "tau.freq_slope"))
    text = (f"# τ ablation (SASRec + BFT, one seed per cell)\n\n{header(runs)}\n"
            f"- K: mean Kalman gain over real tokens; 'initial'/'final' on the first training batch (after "
            f"calibration / at the best checkpoint; from metrics.json or the run's gain_first_batch.json, "
            f"replayed from its checkpoint), 'test histories' on the test inputs\n"
            f"- chosen by validation NDCG@10: {cells}\n\n"
            f"{df.to_markdown(index=False, floatfmt='.4f')}\n")
    args.out.with_suffix(".md").write_text(text)
    print(json.dumps({"chosen": {k: df.loc[best, k] for k in ("tau.scale", "tau.kind", "tau.freq_slope")}},
                     default=str))


if __name__ == "__main__":
    main()
