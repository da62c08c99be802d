"""Collect the finished cells of a grid run elsewhere into a committed results folder (no checkpoints).

A grid runs into a scratch ``out_root`` (checkpoints are large and never committed). This copies each
cell that finished there into ``--dst`` and appends the cell's ledger line to ``--dst``'s ledger, so
that ``make_tables.py`` / ``make_figures.py`` on ``--dst`` see it and the record of where and at which
commit it ran travels with it. It schedules nothing: Hydra still runs the cells (``bftrec.grid``).

A cell is collected when the source ledger (``<src>/ledger.jsonl``) has a line for it with status
``ran`` or ``resumed`` and its folder holds ``metrics.json``, and that ledger line (cell, written) is
not yet in the destination ledger; of several such lines for one cell (a cell rerun) only the last is
taken, since the folder holds that run. Checkpoints (``*.pt``) and lock files are left behind.

Usage:
    python scripts/collect_cells.py --src /scratch/pm/runs --dst results/paper_main/runs [--commit]

``--commit`` makes one git commit per cell, its message giving test HR@10, the best epoch, the wall
time and the commit the cell ran at. Exit status: 0, also when there is nothing new (it says so).

Errors (one line, exit 2): no source ledger; a torn ledger line; a failed git command; a destination
cell that already holds a different ``metrics.json`` (never overwritten: move it away, or pass
``--replace`` to overwrite it on purpose).
"""
from __future__ import annotations

import argparse
import filecmp
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("collect_cells")
DONE = ("ran", "resumed")
LEFT_BEHIND = ("*.pt", "*.pth", ".lock", "__pycache__")


def read_ledger(path: Path) -> list[tuple[str, dict]]:
    """The (raw line, parsed record) pairs of a ledger; blank lines skipped, a torn line named."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            raise SystemExit(f"collect_cells: {path}:{n} is not a JSON line (a torn write?); "
                             "fix or delete that line and rerun") from None
    return out


def pending(src: Path, dst: Path) -> list[tuple[str, dict]]:
    """Ledger lines of ``src`` for finished cells that ``dst``'s ledger does not hold yet, in order."""
    src_ledger = src / "ledger.jsonl"
    if not src_ledger.exists():
        raise SystemExit(f"collect_cells: no ledger at {src_ledger}; --src must be a grid's runs folder "
                         "(<out_root>/runs)")
    dst_ledger = dst / "ledger.jsonl"
    have = {(r.get("cell"), r.get("written")) for _, r in read_ledger(dst_ledger)} if dst_ledger.exists() else set()
    todo: dict[str, tuple[str, dict]] = {}  # cell -> its last finished line: the folder holds that run
    for line, r in read_ledger(src_ledger):
        if r.get("status") in DONE and (r.get("cell"), r.get("written")) not in have:
            if (src / r["cell"] / "metrics.json").exists():
                todo.pop(r["cell"], None)
                todo[r["cell"]] = (line, r)
            else:
                log.warning("%s: ledger says %s but the folder has no metrics.json; skipped",
                            r["cell"], r["status"])
    return list(todo.values())


def commit_message(record: dict, metrics: dict) -> str:
    """One-line commit message for a collected cell."""
    ds, model, layer, seed = record["cell"].split("/")
    return (f"paper_main: {ds} {model} {layer} {seed} (test HR@10 {metrics['test']['overall']['HR@10']:.4f}, "
            f"best epoch {metrics['best_epoch']} of {metrics['epochs_run']}; {round(record['wall_s']):,} s, "
            f"status {record['status']}, at {str(record.get('git_sha', '?'))[:7]})")


def collect(src: Path, dst: Path, replace: bool = False, commit: bool = False) -> list[str]:
    """Copy each pending cell of ``src`` into ``dst`` and append its ledger line; returns the cells."""
    done = []
    for line, r in pending(src, dst):
        s, d = src / r["cell"], dst / r["cell"]
        if (d / "metrics.json").exists() and not filecmp.cmp(s / "metrics.json", d / "metrics.json", shallow=False):
            if not replace:
                raise SystemExit(f"collect_cells: {d} already holds a different metrics.json; move it away "
                                 "or pass --replace to overwrite it")
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(s, d, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
        dst.mkdir(parents=True, exist_ok=True)
        with (dst / "ledger.jsonl").open("a") as f:
            f.write(line + "\n")
        metrics = json.loads((s / "metrics.json").read_text())
        msg = commit_message(r, metrics)
        if commit:
            subprocess.run(["git", "add", "--", str(d), str(dst / "ledger.jsonl")], check=True)
            subprocess.run(["git", "commit", "-q", "-m", msg], check=True)
        log.info("%s", msg)
        done.append(r["cell"])
    if not done:
        log.info("nothing new to collect from %s", src)
    return done


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--src", type=Path, required=True, help="the grid's scratch runs folder (<out_root>/runs)")
    p.add_argument("--dst", type=Path, required=True, help="the committed runs folder, e.g. results/paper_main/runs")
    p.add_argument("--replace", action="store_true", help="overwrite a destination cell with different metrics")
    p.add_argument("--commit", action="store_true", help="one git commit per collected cell")
    a = p.parse_args(argv)
    try:
        collect(a.src, a.dst, a.replace, a.commit)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"collect_cells: `{' '.join(e.cmd)}` failed (exit {e.returncode}); run it from inside the git "
              "repository that holds --dst, or drop --commit", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
