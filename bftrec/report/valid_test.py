"""Validation against test, run by run: what a protocol that selects the epoch on the item it reports would give.

    bftrec-report valid-test results/paper_main/runs/ml-1m/hstu/standard \
        results/paper_main/runs/ml-1m/sasrec/standard --out results/protocol/ml-1m_valid_vs_test.md

Our protocol (``README.md``, Evaluation protocol) selects the epoch on validation (each user's
second-to-last item) and scores test (the last item) once. Some references have no validation split:
HSTU's (``meta-recsys/generative-recommenders``) trains on every item but the last and evaluates on the
last after every epoch. The nearest figure in our runs, with no retraining, is the best per-epoch
validation figure: an item no epoch trained on, scored with the history before it, the epoch picked on
that same item. It is a proxy, not the reference's protocol: one item earlier in each sequence, with one
item less of training data per user.

Per run (one row; ``history.csv`` and ``metrics.json`` of each run folder found below the arguments):
epochs run; the selected epoch (``metrics.json`` ``best_epoch``, selected on the run's
``trainer.select_metric``) with the validation value of ``--metric`` there; the best per-epoch
validation value of ``--metric`` and its epoch; the value of the last validated epoch (what a reference
that trains a fixed number of epochs and reports the last one, as HSTU's, would give under this proxy); and
the test value at the selected epoch. Then one mean
row per (dataset, model, layer, tag). Writes a markdown table (``--out``) or prints it.

Raises SystemExit (one line) when a folder holds no run folder with both files, or when ``--metric`` is not
a validation column of a ``history.csv`` or a test metric of a ``metrics.json``. Runs are found by
``bftrec.report.runs.load_runs``, as the tables find them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from bftrec.report.runs import add_roots, command_line, given_roots, load_runs


def run_row(run: dict, metric: str) -> dict:
    """One run's row (``run``: a ``bftrec.report.runs.load_runs`` entry, its metrics.json plus ``_dir``):
    ``{dataset, model, layer, tag, seed, epochs_run, selected_epoch, valid_at_selected, best_valid,
    best_valid_epoch, last_valid, test}`` (floats are the run's own values, unrounded; ``last_valid``: the
    last validated epoch's value).

    Raises:
        SystemExit: ``history.csv`` has no ``valid_<metric>`` column, or metrics.json no test ``<metric>``.
    """
    hist = pd.read_csv(run["_dir"] / "history.csv")
    col = f"valid_{metric}"
    if col not in hist.columns:
        have = ", ".join(c[len("valid_"):] for c in hist.columns if c.startswith("valid_"))
        raise SystemExit(f"bftrec-report valid-test: {run['_dir'] / 'history.csv'} has no {col}; "
                         f"pick --metric from: {have}")
    test = run.get("test", {}).get("overall", {})
    if metric not in test:
        raise SystemExit(f"bftrec-report valid-test: {run['_dir'] / 'metrics.json'} has no test {metric}; "
                         f"pick --metric from: {', '.join(test)}")
    epochs_run = int(hist["epoch"].max())  # before dropping the epochs that were not validated (eval_every > 1)
    hist = hist.dropna(subset=[col])
    sel = hist[hist["epoch"] == run["best_epoch"]]
    best = hist.loc[hist[col].idxmax()]
    return {"dataset": run["dataset"], "model": run["model"], "layer": run["layer"], "tag": run["tag"],
            "seed": run["seed"], "epochs_run": epochs_run, "selected_epoch": int(run["best_epoch"]),
            "valid_at_selected": float(sel[col].iloc[0]) if len(sel) else float("nan"),
            "best_valid": float(best[col]), "best_valid_epoch": int(best["epoch"]),
            "last_valid": float(hist[col].iloc[-1]), "test": float(test[metric])}


def history_runs(roots: list[Path], script: str) -> list[dict]:
    """The runs (``bftrec.report.runs.load_runs`` entries) below ``roots`` whose folder has a ``history.csv``; a run
    reached from two roots counts once. Shared with ``bftrec.report.seconds`` (``script`` names the caller in errors).

    Raises:
        SystemExit: a root does not exist or holds no run folder with both ``metrics.json`` and ``history.csv``.
    """
    runs: list[dict] = []
    for root in roots:
        try:
            found = [r for r in load_runs(root) if (r["_dir"] / "history.csv").exists()]
        except SystemExit:  # load_runs: no such folder, or no metrics.json below it
            found = []
        if not found:
            raise SystemExit(f"{script}: no run folder (metrics.json + history.csv) below {root}")
        seen = {q["_dir"] for q in runs}
        runs += [r for r in found if r["_dir"] not in seen]  # a root given twice counts once
    return runs


def write_markdown(df: pd.DataFrame, sub: str, argv: list[str] | None, out: Path | None) -> None:
    """Write ``df`` as a markdown table headed by the command that made it (``bftrec-report <sub>
    <args>``) to ``out``, or print it when ``out`` is None. Shared with ``bftrec.report.seconds``."""
    cmd = command_line(sub, argv)
    text = f"Made by `{cmd}`.\n\n{df.to_markdown(index=False, disable_numparse=True)}\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    else:
        print(text, end="")


def table(roots: list[Path], metric: str) -> pd.DataFrame:
    """Every run below ``roots`` (``run_row``), sorted, plus a ``mean`` row after each (dataset, model, layer, tag).

    Raises:
        SystemExit: a root holds no run folder with both ``metrics.json`` and ``history.csv``.
    """
    runs = history_runs(roots, "bftrec-report valid-test")
    keys = ["dataset", "model", "layer", "tag"]
    df = pd.DataFrame([run_row(r, metric) for r in runs]).sort_values([*keys, "seed"])
    means = df.groupby(keys, sort=False).mean(numeric_only=True).reset_index().assign(seed="mean")
    order = pd.concat([df.assign(_mean=0), means.assign(_mean=1)], ignore_index=True)
    return order.sort_values([*keys, "_mean"], kind="stable").drop(columns="_mean").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bftrec-report valid-test", description=__doc__.splitlines()[0])
    add_roots(ap)
    ap.add_argument("--metric", default="HR@10", help="a validation column of history.csv (default HR@10)")
    ap.add_argument("--out", type=Path, help="markdown file to write (default: print)")
    args = ap.parse_args(argv)
    df = table(given_roots(ap, args), args.metric)
    for c in ("valid_at_selected", "best_valid", "last_valid", "test"):
        df[c] = df[c].map(lambda v: f"{v:.4f}")
    mean = df["seed"] == "mean"
    for c in ("epochs_run", "selected_epoch", "best_valid_epoch"):  # the mean row gives epochs to 0.1
        df[c] = [f"{v:.1f}" if is_mean else f"{v:.0f}" for v, is_mean in zip(df[c], mean)]
    df = df.rename(columns={"valid_at_selected": f"valid {args.metric} at selected",
                            "best_valid": f"best valid {args.metric}",
                            "last_valid": f"valid {args.metric} at last validated epoch",
                            "test": f"test {args.metric}"})
    write_markdown(df, "valid-test", argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
