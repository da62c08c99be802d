"""One Markdown row per finished grid cell: what a results README quotes about the cells it took in.

Reads each cell's ``metrics.json`` and its last ``ran``/``resumed`` line in ``<runs>/ledger.jsonl`` (the line
``scripts/collect_cells.py`` copied in with it) and prints, for the cells matching ``--only`` (fnmatch patterns
on the ``dataset/model/layer/[variant/]seedK`` path; every finished cell when none is given):

    | cell | commit | best epoch / run | valid NDCG@10 | test HR@10 | test NDCG@10 | wall s (ledger) |

``commit`` is the ledger line's ``git_sha`` (seven characters), marked ``(resumed)`` when that line's status is
``resumed`` (its ``wall_s`` then covers the last segment only); a cell with no ledger line takes ``env.json``'s
``git_sha`` and ``–`` for the wall time. A runs folder with no ledger (a superseded folder, whose lines stay in
the grid's ledger) gets no wall-time column. Rows are sorted by dataset, model, layer (``standard`` first) and seed.
``scripts/check_tables.py`` reruns every quoted ``python scripts/cell_table.py ...`` command and checks that each
row it prints stands in the markdown file that quotes it.

Usage (from the repository root):
    python scripts/cell_table.py --runs results/paper_main/runs --only 'sports/sasrec/*'

Errors (one line, exit 2): no such runs folder; a torn ledger line; a cell whose ``metrics.json`` is not valid
JSON or lacks a field; an ``--only`` pattern that matches no finished cell.
"""
from __future__ import annotations

import argparse
import json
import sys
from fnmatch import fnmatch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect_cells import DONE, read_ledger  # noqa: E402

HEADER = ("| cell | commit | best epoch / run | valid NDCG@10 | test HR@10 | test NDCG@10 |",
          "|---|---|---:|---:|---:|---:|")
WALL = (" wall s (ledger) |", "---:|")  # the last column, where the runs folder has a ledger
LAYER_ORDER = {"standard": 0, "bft": 1}


def _sort_key(cell: str) -> tuple:
    """``dataset, model, layer (standard, bft, then by name), variant, seed number``."""
    parts = cell.split("/")
    seed = parts[-1].removeprefix("seed")
    return (parts[0], parts[1], LAYER_ORDER.get(parts[2], 2), parts[2], parts[3:-1],
            int(seed) if seed.isdigit() else seed)


def finished_cells(runs: Path) -> list[str]:
    """The ``dataset/model/layer/[variant/]seedK`` paths under ``runs`` that hold a ``metrics.json``."""
    return sorted((str(p.parent.relative_to(runs)) for p in runs.glob("**/seed*/metrics.json")), key=_sort_key)


def row(runs: Path, cell: str, line: dict | None, wall_column: bool = True) -> str:
    """The Markdown row of one cell, from its ``metrics.json`` and its ledger line (``None``: no line); the wall
    time last when ``wall_column``."""
    path = runs / cell / "metrics.json"
    try:
        m = json.loads(path.read_text())
        best, run = m["best_epoch"], m["epochs_run"]
        valid, test = m["valid"]["NDCG@10"], m["test"]["overall"]
        hr, ndcg = test["HR@10"], test["NDCG@10"]
    except json.JSONDecodeError:
        raise SystemExit(f"cell_table: {path} is not valid JSON (a torn write?); rerun that cell") from None
    except (KeyError, TypeError) as e:
        raise SystemExit(f"cell_table: {path} lacks {e}; is it a bftrec-train metrics.json?") from None
    if line is not None:
        commit = f"`{str(line.get('git_sha', ''))[:7]}`" + (" (resumed)" if line["status"] == "resumed" else "")
        wall = f"{round(line['wall_s']):,}" if isinstance(line.get("wall_s"), (int, float)) else "–"
    else:
        env = runs / cell / "env.json"
        sha = json.loads(env.read_text()).get("git_sha", "") if env.is_file() else ""
        commit, wall = (f"`{sha[:7]}`" if sha else "–"), "–"
    return (f"| {cell} | {commit} | {best} / {run} | {valid:.4f} | {hr:.4f} | {ndcg:.4f} |"
            + (f" {wall} |" if wall_column else ""))


def table(runs: Path, only: list[str] | None = None) -> str:
    """The header and one row per finished cell of ``runs`` matching any of ``only`` (all when empty)."""
    if not runs.is_dir():
        raise SystemExit(f"cell_table: no runs folder {runs}; give the folder holding ledger.jsonl and the cells")
    cells = finished_cells(runs)
    for pattern in only or []:
        if not any(fnmatch(c, pattern) for c in cells):
            raise SystemExit(f"cell_table: --only {pattern!r} matches no finished cell of {runs} "
                             "(cells read dataset/model/layer/seedK, e.g. 'beauty/sasrec/*')")
    if only:
        cells = [c for c in cells if any(fnmatch(c, p) for p in only)]
    ledger = runs / "ledger.jsonl"
    has_ledger = ledger.is_file()
    last = {}
    for _, rec in read_ledger(ledger) if has_ledger else []:
        if rec.get("status") in DONE:
            last[rec["cell"]] = rec
    header = [h + w for h, w in zip(HEADER, WALL)] if has_ledger else list(HEADER)
    return "\n".join([*header, *(row(runs, c, last.get(c), has_ledger) for c in cells)])


def parser() -> argparse.ArgumentParser:
    """The command line (``scripts/check_tables.py`` parses quoted commands with it)."""
    ap = argparse.ArgumentParser(prog="cell_table.py", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, required=True, help="a runs folder holding ledger.jsonl and the cells")
    ap.add_argument("--only", action="append", metavar="PATTERN",
                    help="fnmatch pattern on dataset/model/layer/seedK; repeatable")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        sys.stdout.write(table(args.runs, args.only) + "\n")
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
