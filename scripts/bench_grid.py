"""Grid throughput: how fast a paper grid runs, measured, never assumed; writes JSON.

    python scripts/bench_grid.py --grid cpu --n-jobs 1,2 --out results/bench/grid_cpu.json \\
        --finished results/paper_cpu/runs
    python scripts/bench_grid.py --grid main --slice dataset=sports seed=0 --n-jobs 1,4,8 \\
        --out results/bench/grid_gpu.json          # on a GPU machine

Two parts:

- **live**: the slice (default: the grid's first dataset, seed 0, all backbones and layers) is run
  through the real grid command (``bftrec-train -m experiment=paper/<grid>``, Hydra multirun with the
  joblib launcher) for a fixed number of epochs, once per ``--n-jobs`` value, into a temporary folder.
  Reported: wall time, summed per-run training and validation seconds (history.csv), and the
  parallel speedup over the first ``--n-jobs`` value. Ratios come from one invocation on one machine.
- **finished** (``--finished <runs folder>``): the actual cost of a finished grid from its
  ``ledger.jsonl`` and ``history.csv`` files: cells, epochs, summed run time and wall time from the
  first start to the last end, per device.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

from bftrec.experiment import code_stamp, device_name
from bftrec.grid import sweep_axes
from bftrec.trainer import resolve_device

REPO = Path(__file__).resolve().parent.parent


def grid_axes(grid: str) -> tuple[str, dict]:
    """(name, sweep axes) of a grid given by name (``cpu``) or path (``configs/experiment/paper/cpu.yaml``)."""
    name = Path(grid).stem
    path = REPO / "configs" / "experiment" / "paper" / f"{name}.yaml"
    if not path.exists():
        names = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise SystemExit(f"bench_grid: no grid {grid!r}; choose one of {', '.join(names)}")
    try:
        return name, sweep_axes(path)
    except SystemExit as e:
        raise SystemExit(f"bench_grid: {e}") from None


def live(grid: str, slice_: list[str], n_jobs: int, epochs: int, extra: list[str]) -> dict:
    """Run the slice once with ``n_jobs`` parallel runs; return wall time and per-run epoch seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bftrec.train", f"--config-dir={REPO / 'configs'}", "-m",
               f"experiment=paper/{grid}", *slice_, f"trainer.epochs={epochs}", f"trainer.patience={epochs}",
               f"out_root={tmp}", f"hydra.launcher.n_jobs={n_jobs}", *extra]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"bench_grid: the slice failed (exit {out.returncode}): {out.stderr.strip()[-500:]}")
        hist = [pd.read_csv(h) for h in sorted(Path(tmp).rglob("history.csv"))]
    return {"n_jobs": n_jobs, "runs": len(hist), "epochs_per_run": epochs, "wall_s": round(wall, 2),
            "sum_train_s": round(float(sum(h["train_seconds"].sum() for h in hist)), 2),
            "sum_eval_s": round(float(sum(h["eval_seconds"].fillna(0).sum() for h in hist)), 2)}


def finished(runs: Path) -> dict:
    """Actual cost of a finished grid from its ledger and history files."""
    ledger_path = runs / "ledger.jsonl"
    if not ledger_path.exists():
        raise SystemExit(f"bench_grid: no ledger.jsonl in {runs}; launch the grid with experiment=paper/<grid>")
    led = pd.DataFrame([json.loads(x) for x in ledger_path.read_text().splitlines() if x.strip()])
    ran = led[led["status"].isin(["ran", "resumed"])].copy()
    ran["start"] = pd.to_datetime(ran["started"])
    ran["end"] = ran["start"] + pd.to_timedelta(ran["wall_s"], unit="s")
    hist = {str(h.parent.relative_to(runs)): pd.read_csv(h) for h in runs.rglob("history.csv")}
    out = {}
    for device, g in ran.groupby("device"):
        epochs = [len(hist[c]) for c in g["cell"] if c in hist]
        out[device] = {"cells_run": int(len(g)), "epochs": int(sum(epochs)),
                       "mean_epochs_per_cell": round(sum(epochs) / max(len(epochs), 1), 1),
                       "sum_run_s": round(float(g["wall_s"].sum()), 1),
                       "wall_s": round((g["end"].max() - g["start"].min()).total_seconds(), 1),
                       "hosts": sorted(g["host"].unique().tolist())}
    out["_statuses"] = led["status"].value_counts().to_dict()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="cpu", help="grid name (cpu, main) or its configs/experiment/paper/*.yaml")
    ap.add_argument("--skip-live", action="store_true", help="only the --finished summary, no live runs")
    ap.add_argument("--slice", nargs="*", default=None,
                    help="overrides choosing the cells (default: first dataset, seed 0)")
    ap.add_argument("--n-jobs", default="1,2", help="comma-separated parallel run counts to compare")
    ap.add_argument("--epochs", type=int, default=3, help="fixed epochs per run in the live part")
    ap.add_argument("--extra", nargs="*", default=[], help="further overrides, e.g. trainer.device=cpu")
    ap.add_argument("--finished", type=Path, help="runs folder of a finished grid (its ledger.jsonl)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    name, axes = grid_axes(args.grid)
    slice_ = args.slice if args.slice is not None else [f"dataset={axes['dataset'][0]}", "seed=0"]
    lives = [] if args.skip_live else [live(name, slice_, int(j), args.epochs, args.extra)
                                       for j in args.n_jobs.split(",")]
    for r in lives:
        r["speedup_vs_first"] = round(lives[0]["wall_s"] / r["wall_s"], 2)
    cells = 1
    for v in axes.values():
        cells *= len(v)
    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now().isoformat(timespec="seconds"), "grid": name, "grid_cells": cells,
        "device": device_name(resolve_device("auto")),
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "live": {"slice": slice_, "extra": args.extra, "runs": lives,  # the code the live runs timed
                 **code_stamp()} if lives else None,
        "finished": finished(args.finished) if args.finished else None,  # each ledger line names its own commit
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
