"""The τ ablation table (issue: BFT for SASRec, item 6) from run directories.

    python scripts/make_ablation_table.py --runs results/office_sasrec/ablation --out results/office_sasrec/tau_ablation

Reads each run's ``metrics.json`` (and, for runs made before the trainer logged it, replays the
initial mean Kalman gain with ``bftrec.evaluate.replay_gain``, which rebuilds the model with the run's
seed and checkpoint). One row per cell (tau.scale x tau.kind x tau.freq_slope); the row with the best
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


def row(run: dict) -> dict:
    tau = run["layer_config"]["tau"]
    mech = run.get("mechanism", {})
    gain = mech.get("gain_first_batch")
    if gain is None:
        from bftrec.evaluate import replay_gain

        gain = replay_gain(run["_ranks"].parent)
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
            f"calibration / at the best checkpoint), 'test histories' on the test inputs\n"
            f"- chosen by validation NDCG@10: {cells}\n\n"
            f"{df.to_markdown(index=False, floatfmt='.4f')}\n")
    args.out.with_suffix(".md").write_text(text)
    print(json.dumps({"chosen": {k: df.loc[best, k] for k in ("tau.scale", "tau.kind", "tau.freq_slope")}},
                     default=str))


if __name__ == "__main__":
    main()
