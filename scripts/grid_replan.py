"""A grid's cost measured on its finished cells, and the rest projected again from them; writes JSON.

    python scripts/grid_replan.py --runs results/paper_main/runs \\
        --estimate results/bench/grid_main_cpu.json --out results/bench/grid_main_replan.json \\
        --slices-md results/paper_main/slices_left.md \\
        --epochs-from results/windows/runs/ml-1m/sasrec/standard/windows=last

``scripts/bench_grid_cost.py`` projects a grid before it runs, from 2 timed epochs per (dataset,
backbone, layer) and a proxy for the number of epochs. This script compares that projection with the
cells that have finished (``metrics.json`` present) and projects the missing cells again:

1. **Finished cells** (every cell of the estimate with a ``metrics.json`` under ``--runs``): epochs
   run and the best epoch (``history.csv``, ``metrics.json``), s/epoch = the median over epochs of
   training + validation seconds, run seconds = their sum, each beside the estimate's figure and
   their ratio. The run seconds leave out data loading and test scoring, and they include whatever
   shared the cores at the time (a third run, a pause): the ratio says how far the estimate was from
   what the grid met on the machine, not what a cell costs alone. Only cells whose every epoch ran on
   the CPU are timed (``train.log``: each process logs its device, a resumed one its first epoch); a
   cell run wholly or partly on a GPU counts for its epochs only (``devices`` names where they ran).
2. **Missing cells**, one rule each, stated in the JSON:
   - s/epoch: the median measured s/epoch of the finished cells of the same (dataset, backbone,
     layer); else that of the same (dataset, backbone) in another layer, times the median ratio of
     the two layers' s/epoch over the datasets where this backbone finished in both; else the
     estimate's s/epoch times the median measured/estimated ratio of the finished cells of the same
     backbone and layer; else of the same backbone; else of all finished cells;
   - epochs: the mean epochs run by the finished cells of the same (dataset, backbone, layer); else of
     the same (dataset, backbone) in any layer (how long a backbone trains depends more on the data
     than on the layer: ML-1M BERT4Rec ran 145 epochs, its other datasets 44-96); else of the runs
     of the same (dataset, backbone) at the same tuned config found under ``--epochs-from`` (committed
     runs outside the grid, such as the windows study's ML-1M SASRec: 91 epochs, where SASRec's
     other datasets ran 22-32; the rule checks the tuned config's name, not other overrides, so pass
     only runs at the grid's recipe); else of the same backbone and layer on any dataset; else the
     estimate's proxy; never above the epoch cap;
   - fixed overhead: the estimate's, scaled by the same ratio as s/epoch.
   The worst case (every missing cell to its epoch cap) is reported beside it.
3. **Slices** of the missing cells, breadth first, of at most ``--slice-hours`` each at ``--n-jobs``
   runs side by side (``bench_grid_cost.slices``).

Raises SystemExit (one line) on a missing estimate or runs folder, or an estimate without cells.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd

from bftrec.grid import epoch_devices

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_grid_cost as cost  # noqa: E402  (a sibling script, not a package)

KEY = ["dataset", "model", "layer"]


def finished_cells(runs: Path, grid: pd.DataFrame, device: str = "cpu") -> pd.DataFrame:
    """One row per cell of ``grid`` finished under ``runs``: epochs run, best epoch, measured seconds.

    Args:
        runs: a grid's runs folder, ``<runs>/<dataset>/<model>/<layer>/seed<k>/``.
        grid: the estimate's cells (columns dataset, model, layer, seed, s_per_epoch, expected_s, ...).
        device: the device type the estimate is for; a cell with an epoch elsewhere is not timed (its
            seconds columns are NaN; ``devices`` says where its epochs ran).
    """
    rows = []
    for g in grid.to_dict("records"):
        d = runs / g["dataset"] / g["model"] / g["layer"] / f"seed{g['seed']}"
        if not (d / "metrics.json").exists():
            continue
        h = pd.read_csv(d / "history.csv")
        per_epoch = h["train_seconds"] + h["eval_seconds"].fillna(0)  # (epochs,) s
        devs = epoch_devices(d / "train.log", len(h))
        timed = all(x in (device, "?") for x in devs)  # "?": no log to say otherwise
        s, run_s = (float(per_epoch.median()), float(per_epoch.sum())) if timed else (float("nan"),) * 2
        rows.append({**{k: g[k] for k in [*KEY, "seed"]}, "epochs_run": int(len(h)),
                     "best_epoch": int(json.loads((d / "metrics.json").read_text())["best_epoch"]),
                     "devices": ", ".join(f"{x} {devs.count(x)} epochs" for x in dict.fromkeys(devs)),
                     "s_per_epoch": round(s, 2), "s_per_epoch_estimated": g["s_per_epoch"],
                     "ratio_s_per_epoch": round(s / g["s_per_epoch"], 3),
                     "run_s": round(run_s, 1), "expected_s": g["expected_s"],
                     "ratio_run_s": round(run_s / g["expected_s"], 3),
                     "epochs_expected": g["epochs_expected"]})
    return pd.DataFrame(rows)


def reference_epochs(folders: list[Path]) -> pd.DataFrame:
    """Epochs run by committed runs outside the grid: one row per ``metrics.json`` under ``folders``
    (columns dataset, model, layer, tuned_config, epochs_run, path); runs without ``epochs_run`` or
    ``tuned_config`` are skipped (the rule needs both: same data and recipe).

    Raises SystemExit (one line) on a folder that does not exist."""
    rows = []
    for f in folders:
        if not f.is_dir():
            raise SystemExit(f"grid_replan: no folder {f} for --epochs-from; pass folders of committed runs")
        for mj in sorted(f.rglob("metrics.json")):
            m = json.loads(mj.read_text())
            if m.get("epochs_run") and m.get("tuned_config"):
                rows.append({k: m.get(k) for k in ("dataset", "model", "layer", "tuned_config", "epochs_run")}
                            | {"path": mj.parent.as_posix()})
    return pd.DataFrame(rows, columns=["dataset", "model", "layer", "tuned_config", "epochs_run", "path"])


def _same_recipe(ref: pd.DataFrame | None, cell: dict) -> pd.DataFrame:
    """The reference runs of ``cell``'s (dataset, backbone) at its tuned config (none when ``ref`` is None)."""
    if ref is None:
        return pd.DataFrame()
    return ref[(ref["dataset"] == cell["dataset"]) & (ref["model"] == cell["model"])
               & (ref["tuned_config"] == f"{cell['dataset']}_{cell['model']}")]


def _ratio(done: pd.DataFrame, cell: dict) -> tuple[float, str]:
    """Measured/estimated s/epoch ratio for a cell with no measurement of its own, and its source."""
    for cols, what in ((["model", "layer"], "backbone and layer"), (["model"], "backbone")):
        same = done
        for c in cols:
            same = same[same[c] == cell[c]]
        if len(same):
            rule = f"estimate x median ratio of its {what} ({len(same)} cells)"
            return float(same["ratio_s_per_epoch"].median()), rule
    return float(done["ratio_s_per_epoch"].median()), f"estimate x median ratio of all ({len(done)} cells)"


def _from_other_layer(done: pd.DataFrame, cell: dict) -> tuple[float, str] | None:
    """s/epoch of a cell whose (dataset, backbone) finished in another layer, scaled by the layer ratio.

    The ratio is the median over datasets of (this layer's s/epoch) / (the other layer's s/epoch) for
    the same backbone; None when no dataset has both, or the cell's (dataset, backbone) has no other layer.
    """
    m = done[done["model"] == cell["model"]]
    mine = m[m["layer"] == cell["layer"]].groupby("dataset")["s_per_epoch"].median()  # (datasets,) s
    here = m[(m["dataset"] == cell["dataset"]) & (m["layer"] != cell["layer"])]
    for other in sorted(set(here["layer"])):
        theirs = m[m["layer"] == other].groupby("dataset")["s_per_epoch"].median()
        both = mine.index.intersection(theirs.index)
        if len(both):
            r = float((mine[both] / theirs[both]).median())
            base = float(here[here["layer"] == other]["s_per_epoch"].median())
            return base * r, (f"measured {other} on the same dataset x median {cell['layer']}/{other} "
                              f"s/epoch of its backbone ({len(both)} datasets)")
    return None


def project_missing(grid: pd.DataFrame, done: pd.DataFrame, ref: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per missing cell: s/epoch, epochs, expected and cap seconds, with the rule used (module doc).

    ``ref``: ``reference_epochs``' runs outside the grid (None: that rule is skipped)."""
    have = set(map(tuple, done[[*KEY, "seed"]].values.tolist())) if len(done) else set()
    timed = done[done["s_per_epoch"].notna()] if len(done) else done  # seconds: CPU-only cells
    rows = []
    for g in grid.to_dict("records"):
        if (g["dataset"], g["model"], g["layer"], g["seed"]) in have:
            continue
        same = done[(done["dataset"] == g["dataset"]) & (done["model"] == g["model"])
                    & (done["layer"] == g["layer"])] if len(done) else done
        same_t = same[same["s_per_epoch"].notna()] if len(same) else same
        if len(same_t):
            spe, ratio, src = float(same_t["s_per_epoch"].median()), float(same_t["ratio_s_per_epoch"].median()), \
                f"measured ({len(same_t)} cells)"
        elif len(timed) and (o := _from_other_layer(timed, g)) is not None:
            spe, src = o
            ratio = spe / g["s_per_epoch"]
        elif len(timed):
            ratio, src = _ratio(timed, g)
            spe = g["s_per_epoch"] * ratio
        else:
            spe, ratio, src = g["s_per_epoch"], 1.0, "estimate (no cell finished)"
        ml = done[(done["model"] == g["model"]) & (done["layer"] == g["layer"])] if len(done) else done
        dm = done[(done["dataset"] == g["dataset"]) & (done["model"] == g["model"])] if len(done) else done
        if len(same):
            ep, ep_src = float(same["epochs_run"].mean()), f"mean epochs run, same cell ({len(same)})"
        elif len(dm):
            ep, ep_src = float(dm["epochs_run"].mean()), f"mean epochs run, same dataset and backbone ({len(dm)})"
        elif len(rf := _same_recipe(ref, g)):
            ep = float(rf["epochs_run"].mean())
            ep_src = (f"mean epochs run, {len(rf)} reference runs at the same tuned "
                      f"config ({', '.join(sorted(set(rf['path'])))})")
        elif len(ml):
            ep, ep_src = float(ml["epochs_run"].mean()), f"mean epochs run, same backbone and layer ({len(ml)})"
        else:
            ep, ep_src = float(g["epochs_expected"]), "the estimate's proxy"
        ep = min(ep, g["epochs_cap"])
        over = g["overhead_s"] * ratio
        rows.append({**{k: g[k] for k in [*KEY, "seed"]}, "s_per_epoch": round(spe, 2), "s_per_epoch_rule": src,
                     "epochs": round(ep, 1), "epochs_rule": ep_src, "epochs_cap": g["epochs_cap"],
                     "expected_s": round(ep * spe + over, 1), "cap_s": round(g["epochs_cap"] * spe + over, 1)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="the grid's runs folder")
    ap.add_argument("--estimate", type=Path, required=True, help="bench_grid_cost.py's JSON for the grid")
    ap.add_argument("--n-jobs", type=int, default=2, help="runs side by side when projecting wall time")
    ap.add_argument("--first", default="sports,instruments", help="datasets whose seeds 1-2 come first")
    ap.add_argument("--slice-hours", type=float, default=2.5, help="wall-time limit of one slice")
    ap.add_argument("--epochs-from", type=Path, nargs="*", default=[],
                    help="folders of committed runs outside the grid, at the grid's recipe, whose epochs run "
                    "inform the projection (module doc, rule 2)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--slices-md", type=Path, help="markdown file for the slices of the missing cells")
    args = ap.parse_args(argv)
    if not args.runs.is_dir():
        raise SystemExit(f"grid_replan: no runs folder {args.runs}; pass the grid's <out_root>/runs")
    if not args.estimate.exists():
        raise SystemExit(f"grid_replan: no estimate {args.estimate}; make it with scripts/bench_grid_cost.py")
    est = json.loads(args.estimate.read_text())
    if not est.get("cells"):
        raise SystemExit(f"grid_replan: {args.estimate} lists no cells; is it bench_grid_cost.py's JSON?")
    grid = pd.DataFrame(est["cells"])
    done = finished_cells(args.runs, grid)
    ref = reference_epochs(args.epochs_from) if args.epochs_from else None
    left = project_missing(grid, done, ref)
    sl = cost.slices(left, args.first.split(","), args.n_jobs, args.slice_hours * 3600) if len(left) else []
    summary = {}
    if len(done):
        timed = done[done["s_per_epoch"].notna()]
        summary = {"cells": int(len(done)), "cells_timed": int(len(timed)),
                   "run_core_h": round(timed["run_s"].sum() / 3600, 2),
                   "expected_core_h": round(timed["expected_s"].sum() / 3600, 2),
                   "median_ratio_s_per_epoch": float(timed["ratio_s_per_epoch"].median()),
                   "median_ratio_epochs": float((done["epochs_run"] / done["epochs_expected"]).median())}
    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now().isoformat(timespec="seconds"), "grid": est["grid"], "out": str(args.out),
        "estimate": {"file": str(args.estimate), "date": est["date"], "device": est["device"]},
        "device": est["device"], "n_jobs": args.n_jobs, "threads": est.get("threads", 1),
        "cpu_overrides": est.get("cpu_overrides", []),
        "finished": summary,
        "totals": {"cells": int(len(left)),
                   "expected_core_h": round(left["expected_s"].sum() / 3600, 1) if len(left) else 0.0,
                   "expected_wall_h": round(left["expected_s"].sum() / args.n_jobs / 3600, 1) if len(left) else 0.0,
                   "cap_core_h": round(left["cap_s"].sum() / 3600, 1) if len(left) else 0.0},
        "slices": sl,
        "finished_cells": done.astype(object).where(done.notna(), None).to_dict("records"),
        "missing_cells": left.to_dict("records"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.slices_md:
        args.slices_md.parent.mkdir(parents=True, exist_ok=True)
        args.slices_md.write_text(cost.slices_md(result).replace(
            "# Slices of the", "# Slices of the missing cells of the", 1))
    print(f"wrote {args.out}" + (f" and {args.slices_md}" if args.slices_md else ""))


if __name__ == "__main__":
    main()
