"""A paper grid's cost, projected from timed epochs before it runs; writes JSON and the slice list.

    BFTREC_DATA_ROOT=../shared/data python scripts/bench_grid_cost.py --grid main \\
        --add "dataset=sports layer=bft_h" --out results/bench/grid_main_cpu.json \\
        --slices-md results/paper_main/slices.md

1. **Timing.** Seed 0 of every (dataset, backbone, layer) of the grid, plus the ``--add`` cells, runs
   through the real grid command (``bftrec-train -m experiment=paper/<grid>``, Hydra multirun with the
   joblib launcher) at its tuned config for ``--epochs`` epochs, ``--n-jobs`` runs side by side with
   ``--threads`` threads each (the way the grid runs on this machine), into a temporary folder.
   s/epoch = mean over the timed epochs of training + validation seconds (``history.csv``); the rest
   of each run's wall time (data, model, test scoring: ``ledger.jsonl``) is its fixed overhead.
2. **Epochs expected.** Nothing is known about a pair before it runs, so the projection uses a stated
   proxy: the mean best epoch (the mean, since a total is projected) of the same backbone and layer
   over the finished CPU grid (``--reference``, default ``results/paper_cpu/runs``), plus the pair's
   patience, raised to the pair's ``trainer.min_epochs`` (no early stop before it) and capped at its
   epoch cap. The worst case (every cell runs to its cap) is reported beside it.
3. **Slices.** Cells are ordered breadth first (seed 0 of every cell; then seeds 1 and 2 of
   ``--first`` datasets; then the rest), grouped by (dataset, seed) and packed into slices of at most
   ``--slice-hours`` of wall time at ``--n-jobs`` runs side by side. Each slice is one command line of
   overrides. A cell longer than the limit is a slice of its own, marked: it resumes from ``last.pt``
   across working periods only where its run folder survives between them (a fresh machine loses it).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

from bftrec.experiment import code_stamp, device_name
from bftrec.grid import AXES, sweep_axes
from bftrec.rundir import override_key

REPO = Path(__file__).resolve().parent.parent


def tuned_budget(dataset: str, model: str, layer: str = "standard", grid: str = "main") -> dict:
    """Epoch cap, patience and ``min_epochs`` (no early stop before it; 0 = off) of a cell, from the
    config the grid command composes for it: ``experiment=paper/<grid>`` with the cell's dataset,
    backbone and layer (configs/tuned/<dataset>_<model>.yaml over the trainer defaults, and whatever
    the grid file itself sets).

    Raises:
        SystemExit: a cell Hydra cannot compose (names the overrides).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    over = [f"experiment=paper/{grid}", f"dataset={dataset}", f"model={model}", f"layer={layer}"]
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = compose("train", overrides=over)
    except (HydraException, OmegaConfBaseException) as e:
        raise SystemExit(f"bench_grid_cost: cannot compose {' '.join(over)}: {e}") from None
    t, m = cfg.trainer, cfg.model
    return {"epochs_cap": int(t.epochs), "patience": int(t.patience), "min_epochs": int(t.get("min_epochs") or 0),
            "max_len": m.get("max_len"), "loss": m.get("loss")}


def check_add(add: str) -> list[str]:
    """The overrides of one ``--add`` cell set: grid axes only (``dataset=sports layer=bft_h``).

    Raises:
        SystemExit: an override of another key (``trainer.patience=50``): such a cell would share the
            grid's run folder (``<dataset>/<model>/<layer>/seed<k>``) and its slice command would not
            carry the override; run such a variant as a grid of its own.
    """
    over = shlex.split(add)
    other = [o for o in over if override_key(o) not in AXES]
    if other:
        raise SystemExit(f"bench_grid_cost: --add {add!r} sets {', '.join(other)}; --add takes grid axes only "
                         f"({', '.join(AXES)}): such a cell shares the grid's run folders and slice commands. "
                         "Run a variant as its own grid (configs/experiment/)")
    return over


def timed_runs(grid: str, overrides: list[str], epochs: int, n_jobs: int, threads: int) -> pd.DataFrame:
    """Run the cells ``overrides`` select for ``epochs`` epochs; one row per run with its timings."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bftrec.train", f"--config-dir={REPO / 'configs'}", "-m",
               f"experiment=paper/{grid}", *overrides, f"trainer.epochs={epochs}",
               f"trainer.patience={epochs}", "trainer.min_epochs=0", "trainer.device=cpu",
               f"trainer.num_threads={threads}", f"hydra.launcher.n_jobs={n_jobs}", f"out_root={tmp}"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"bench_grid_cost: the timed runs failed (exit {out.returncode}): "
                             f"{out.stderr.strip()[-800:]}")
        runs = Path(tmp) / "runs"
        ledger = {r["cell"]: r for r in map(json.loads, (runs / "ledger.jsonl").read_text().splitlines())}
        rows = []
        for cell, rec in ledger.items():
            h = pd.read_csv(runs / cell / "history.csv")
            if h.empty:
                raise SystemExit(f"bench_grid_cost: {cell} wrote no epoch to history.csv; see its train.log")
            per_epoch = h["train_seconds"] + h["eval_seconds"].fillna(0)  # (epochs,) s
            dataset, model, layer, _ = cell.split("/")
            rows.append({"dataset": dataset, "model": model, "layer": layer,
                         "s_per_epoch": round(float(per_epoch.mean()), 2),
                         "s_epochs": [round(float(x), 2) for x in per_epoch],
                         "overhead_s": round(float(rec["wall_s"] - per_epoch.sum()), 2)})
    df = pd.DataFrame(rows)
    df.attrs["wall_s"] = round(wall, 1)
    return df


def reference_best_epochs(runs: Path) -> dict:
    """{(model, layer): mean best epoch} over the finished cells under ``runs``."""
    rows = []
    for m in runs.rglob("metrics.json"):
        if m.parent.name.startswith("eval_"):
            continue  # a re-score (bftrec-eval) in a run's folder is not another cell
        d = json.loads(m.read_text())
        if "best_epoch" in d:
            rows.append({"model": d["model"], "layer": d["layer"], "best_epoch": d["best_epoch"]})
    if not rows:
        raise SystemExit(f"bench_grid_cost: no finished cells under {runs}; pass --reference <runs folder>")
    return pd.DataFrame(rows).groupby(["model", "layer"])["best_epoch"].mean().to_dict()


LAYER_ORDER = ("standard", "bft", "bft_h")


def layer_rank(layer: str) -> int:
    """Position of a layer in ``LAYER_ORDER`` (an unknown layer sorts last)."""
    return LAYER_ORDER.index(layer) if layer in LAYER_ORDER else len(LAYER_ORDER)


def _proxy(best: dict, model: str, layer: str) -> float:
    """Mean best epoch of (model, layer) in the reference; else of the model over its layers there."""
    if (model, layer) in best:
        return best[(model, layer)]
    same = [v for (m, _), v in best.items() if m == model]
    if not same:
        raise SystemExit(f"bench_grid_cost: the reference has no finished {model} cell to take the epochs from; "
                         "pass --reference <a runs folder with that backbone>")
    return float(sum(same) / len(same))


def project(timed: pd.DataFrame, seeds: list[int], best: dict, grid: str = "main") -> pd.DataFrame:
    """One row per grid cell: epochs expected (proxy) and cap, seconds expected and worst case; the
    budget is ``tuned_budget`` of the cell under ``grid``.

    Raises:
        SystemExit: a timed run without a finite s/epoch; a backbone the reference never ran.
    """
    rows = []
    for r in timed.to_dict("records"):
        if not (r["s_per_epoch"] > 0):  # NaN or 0: a run that timed no epoch
            raise SystemExit(f"bench_grid_cost: {r['dataset']}/{r['model']}/{r['layer']} timed no epoch "
                             f"(s/epoch {r['s_per_epoch']}); rerun with --epochs >= 1")
        b = tuned_budget(r["dataset"], r["model"], r["layer"], grid)
        proxy = _proxy(best, r["model"], r["layer"])
        expected = min(b["epochs_cap"], max(b["min_epochs"], int(round(proxy)) + b["patience"]))
        for s in seeds:
            rows.append({**r, "seed": s, **b, "proxy_best_epoch": proxy, "epochs_expected": expected,
                         "expected_s": round(expected * r["s_per_epoch"] + r["overhead_s"], 1),
                         "cap_s": round(b["epochs_cap"] * r["s_per_epoch"] + r["overhead_s"], 1)})
    return pd.DataFrame(rows)


def makespan(durations: list[float], n_jobs: int) -> float:
    """Wall seconds of running ``durations`` in this order on ``n_jobs`` workers, each cell handed to
    the first free worker (the joblib launcher's behaviour)."""
    free = [0.0] * n_jobs
    for d in durations:
        i = free.index(min(free))
        free[i] += d
    return max(free)


def slices(cells: pd.DataFrame, first: list[str], n_jobs: int, limit_s: float) -> list[dict]:
    """Breadth-first slices of at most ``limit_s`` wall seconds each (see the module docstring).

    Datasets, backbones and seeds are those of ``cells`` (in their order there); every cell lands in
    exactly one slice. Backbones are packed into one slice only when they share the layer set, since
    a slice's ``model=a,b layer=x,y`` runs the whole product.
    """
    datasets = list(dict.fromkeys(cells["dataset"]))
    models = list(dict.fromkeys(cells["model"]))
    seeds = sorted(set(int(x) for x in cells["seed"]))
    first = [d for d in first if d in datasets]
    order = [(d, seeds[0]) for d in datasets] + [(d, s) for d in first for s in seeds[1:]] + \
            [(d, s) for d in datasets if d not in first for s in seeds[1:]]

    def layers(g: pd.DataFrame) -> tuple:
        return tuple(sorted(g["layer"].unique(), key=layer_rank))

    def wall(g: pd.DataFrame) -> float:
        g = g.assign(_m=g["model"].map(models.index), _l=g["layer"].map(layer_rank))
        return makespan(list(g.sort_values(["_m", "_l"])["expected_s"]), n_jobs)

    out = []
    for d, s in order:
        g = cells[(cells["dataset"] == d) & (cells["seed"] == s)]
        pack: list[str] = []
        for m in models:
            gm = g[g["model"] == m]
            if gm.empty:
                continue
            if pack and (layers(gm) != layers(g[g["model"] == pack[0]])
                         or wall(g[g["model"].isin(pack + [m])]) > limit_s):
                out.append(_slice(g[g["model"].isin(pack)], d, s, pack, wall, limit_s))
                pack = []
            if wall(gm) > limit_s:  # one backbone's layers alone exceed the limit: one slice per layer
                out += [_slice(gm[gm["layer"] == lay], d, s, [m], wall, limit_s) for lay in layers(gm)]
            else:
                pack.append(m)
        if pack:
            out.append(_slice(g[g["model"].isin(pack)], d, s, pack, wall, limit_s))
    sliced = sum(x["cells"] for x in out)
    if sliced != len(cells):
        raise SystemExit(f"bench_grid_cost: the slices hold {sliced} cells, the grid {len(cells)}; a bug: report it")
    return out


def _slice(g: pd.DataFrame, d: str, s: int, models: list[str], wall, limit_s: float) -> dict:
    lays = sorted(g["layer"].unique(), key=layer_rank)
    w = wall(g)
    return {"overrides": [f"dataset={d}", f"model={','.join(models)}", f"seed={s}", f"layer={','.join(lays)}"],
            "cells": int(len(g)), "expected_wall_h": round(w / 3600, 2), "over_limit": bool(w > limit_s)}


def slices_md(result: dict) -> str:
    """The slice list as a markdown table (results/paper_main/slices.md)."""
    lines = [f"# Slices of the `{result['grid']}` grid on this machine ({result['device']})", "",
             f"Generated by `{result['command']}` on {result['date']}; cost model in "
             f"`{result['out']}`. Each slice: `bftrec-train -m experiment=paper/{result['grid']} "
             f"{' '.join(result['cpu_overrides'])} <overrides>`. Expected wall time at "
             f"{result['n_jobs']} runs side by side, {result['threads']} thread each; a slice marked "
             "over the limit holds a cell that alone takes longer: it resumes from `last.pt` across "
             "working periods only where its run folder survives between them (a fresh machine loses "
             "it), so run it on a GPU, or alone with more threads.", "",
             "| # | overrides | cells | expected wall (h) | over the limit |", "|---:|---|---:|---:|---|"]
    for i, s in enumerate(result["slices"], 1):
        lines.append(f"| {i} | `{' '.join(s['overrides'])}` | {s['cells']} | {s['expected_wall_h']:.2f} | "
                     f"{'yes' if s['over_limit'] else ''} |")
    t = result["totals"]
    lines += ["", f"Total: {t['cells']} cells, {t['expected_core_h']:.1f} core-hours expected "
                  f"({t['expected_wall_h']:.1f} h of wall time at {result['n_jobs']} jobs); worst case "
                  f"(every cell to its epoch cap) {t['cap_core_h']:.1f} core-hours.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="main", help="grid name under configs/experiment/paper/")
    ap.add_argument("--add", action="append", default=[],
                    help="extra cells beyond the grid's sweep, as overrides (e.g. 'dataset=sports layer=bft_h')")
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs per run")
    ap.add_argument("--n-jobs", type=int, default=2, help="runs side by side (the grid's n_jobs here)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--reference", type=Path, default=REPO / "results" / "paper_cpu" / "runs",
                    help="finished grid whose mean best epoch per (backbone, layer) is the proxy")
    ap.add_argument("--first", default="sports,instruments", help="datasets whose seeds 1-2 come first")
    ap.add_argument("--slice-hours", type=float, default=2.5, help="wall-time limit of one slice")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--slices-md", type=Path, help="markdown file for the slice list")
    args = ap.parse_args(argv)
    path = REPO / "configs" / "experiment" / "paper" / f"{args.grid}.yaml"
    if not path.exists():
        raise SystemExit(f"bench_grid_cost: no grid {args.grid!r} ({path}); choose a file of {path.parent}")
    axes = sweep_axes(path)
    best = reference_best_epochs(args.reference)
    adds = [check_add(add) for add in args.add]  # before any timing: a refused --add costs nothing
    timed = [timed_runs(args.grid, ["seed=0"], args.epochs, args.n_jobs, args.threads)]
    for over in adds:
        timed.append(timed_runs(args.grid, ["seed=0", *over], args.epochs, args.n_jobs, args.threads))
    t = pd.concat(timed, ignore_index=True)
    order = {k: list(dict.fromkeys([*axes[k], *t[k]])) for k in ("dataset", "model")}  # the grid's order
    t = t.assign(_d=t["dataset"].map(order["dataset"].index), _m=t["model"].map(order["model"].index)) \
        .sort_values(["_d", "_m"]).drop(columns=["_d", "_m"]).reset_index(drop=True)
    cells = project(t, [int(s) for s in axes["seed"]], best, args.grid)
    limit = args.slice_hours * 3600
    sl = slices(cells, args.first.split(","), args.n_jobs, limit)
    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now().isoformat(timespec="seconds"), "grid": args.grid, "out": str(args.out),
        "device": device_name(torch.device("cpu")), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "n_jobs": args.n_jobs, "threads": args.threads, "timed_epochs": args.epochs,
        "timing_wall_s": [x.attrs["wall_s"] for x in timed],
        "cpu_overrides": ["trainer.device=cpu", f"trainer.num_threads={args.threads}",
                          f"hydra.launcher.n_jobs={args.n_jobs}"],
        "epochs_expected_rule": "min(epoch cap, max(min_epochs, mean best epoch of the same backbone and "
                                f"layer over {args.reference} + the pair's patience)): a proxy, not a "
                                "measurement",
        "proxy_best_epoch": {f"{m}/{lay}": v for (m, lay), v in best.items()},
        "totals": {"cells": int(len(cells)),
                   "expected_core_h": round(cells["expected_s"].sum() * args.threads / 3600, 1),
                   "expected_wall_h": round(cells["expected_s"].sum() / args.n_jobs / 3600, 1),
                   "cap_core_h": round(cells["cap_s"].sum() * args.threads / 3600, 1)},
        "slices": sl,
        "cells": cells.to_dict("records"),
        **code_stamp(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.slices_md:
        args.slices_md.parent.mkdir(parents=True, exist_ok=True)
        args.slices_md.write_text(slices_md(result))
    print(f"wrote {args.out}" + (f" and {args.slices_md}" if args.slices_md else ""))


if __name__ == "__main__":
    main()
