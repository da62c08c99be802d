"""Training and validation seconds of finished runs, from their ``history.csv``: the source of every
single-run time quoted in the READMEs.

    bftrec-report seconds results/paper_main/runs/ml-1m/bert4rec/bft --from-epoch 76
    bftrec-report seconds results/bert4rec_ml1m/runs --out results/bert4rec_ml1m/seconds.md

Per run (every run folder with ``metrics.json`` and ``history.csv`` below the arguments, found by
``bftrec.report.runs.load_runs`` as the tables find them, via ``bftrec.report.valid_test.history_runs``): epochs run,
the selected epoch (``metrics.json`` ``best_epoch``), then over the epochs counted (all, or those from
``--from-epoch`` on, e.g. the part of a run that resumed on another machine): how many, the sum of
``train_seconds`` (training, s), of ``eval_seconds`` (full-ranking validation, s), their total, and
the median seconds per epoch (training plus validation). Wall seconds of a process (data loading,
test scoring, waits) are not in ``history.csv`` and not here; these are the epochs' own seconds, as
measured beside whatever else shared the machine (the run's ``train.log`` and ``env.json`` say which
device each process used).

Raises SystemExit (one line) when a folder holds no run folder with both files, when a ``history.csv``
lacks the seconds columns, or when ``--from-epoch`` is past a run's last epoch.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from bftrec.report.runs import add_roots, given_roots
from bftrec.report.valid_test import history_runs, write_markdown

COLUMNS = ("epoch", "train_seconds", "eval_seconds")


def run_row(run: dict, from_epoch: int = 1) -> dict:
    """One run's row (``run``: a ``bftrec.report.runs.load_runs`` entry): ``{dataset, model, layer, tag, seed, run,
    epochs_run, best_epoch, epochs_counted, train_s, eval_s, total_s, median_s_per_epoch}`` (``run``: the run
    folder's name, which tells apart runs of one tag and seed, e.g. the variants of a sweep; seconds as floats,
    unrounded; an epoch that was not validated counts 0 validation seconds).

    Raises:
        SystemExit: ``history.csv`` lacks a column of ``COLUMNS``, or ``from_epoch`` is past its last epoch.
    """
    path = run["_dir"] / "history.csv"
    hist = pd.read_csv(path)
    missing = [c for c in COLUMNS if c not in hist.columns]
    if missing:
        raise SystemExit(f"bftrec-report seconds: {path} has no column {', '.join(missing)}; "
                         "it is not a bftrec history.csv")
    epochs_run = int(hist["epoch"].max())
    part = hist[hist["epoch"] >= from_epoch]
    if part.empty:
        raise SystemExit(f"bftrec-report seconds: --from-epoch {from_epoch} is past the last epoch ({epochs_run}) of "
                         f"{path}; pick an epoch from 1 to {epochs_run}")
    train = part["train_seconds"].astype(float)
    valid = part["eval_seconds"].astype(float).fillna(0.0)
    return {"dataset": run["dataset"], "model": run["model"], "layer": run["layer"], "tag": run["tag"],
            "seed": run["seed"], "run": run["_dir"].name, "epochs_run": epochs_run,
            "best_epoch": int(run["best_epoch"]), "epochs_counted": len(part), "train_s": float(train.sum()),
            "eval_s": float(valid.sum()), "total_s": float(train.sum() + valid.sum()),
            "median_s_per_epoch": float((train + valid).median())}


def table(roots: list[Path], from_epoch: int = 1) -> pd.DataFrame:
    """Every run below ``roots`` (``run_row``), sorted by (dataset, model, layer, tag, seed, run).

    Raises:
        SystemExit: a root holds no run folder with both ``metrics.json`` and ``history.csv``, or ``run_row``'s.
    """
    df = pd.DataFrame([run_row(r, from_epoch) for r in history_runs(roots, "bftrec-report seconds")])
    return df.sort_values(["dataset", "model", "layer", "tag", "seed", "run"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bftrec-report seconds", description=__doc__.splitlines()[0])
    add_roots(ap)
    ap.add_argument("--from-epoch", type=int, default=1, help="count epochs from this one on (default 1: all)")
    ap.add_argument("--out", type=Path, help="markdown file to write (default: print)")
    args = ap.parse_args(argv)
    if args.from_epoch < 1:
        ap.error(f"--from-epoch {args.from_epoch}: epochs count from 1; pick 1 or more")
    df = table(given_roots(ap, args), args.from_epoch)
    for c in ("train_s", "eval_s", "total_s"):
        df[c] = df[c].map(lambda v: f"{v:,.0f}")
    df["median_s_per_epoch"] = df["median_s_per_epoch"].map(lambda v: f"{v:.1f}")
    df = df.rename(columns={"epochs_run": "epochs run", "best_epoch": "best epoch",
                            "epochs_counted": f"epochs counted (from {args.from_epoch})",
                            "train_s": "training (s)", "eval_s": "validation (s)", "total_s": "total (s)",
                            "median_s_per_epoch": "median s per epoch"})
    write_markdown(df, "seconds", argv, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
