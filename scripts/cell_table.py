"""One Markdown row per finished grid cell: what a results README quotes about the cells it took in.

Reads each cell's ``metrics.json`` and its last ``ran``/``resumed`` line in ``<runs>/ledger.jsonl`` (the line
``scripts/collect_cells.py`` copied in with it) and prints, for the cells matching ``--only`` (fnmatch patterns
on the ``dataset/model/layer/[variant/]seedK`` path; every finished cell when none is given):

    | cell | commit | best epoch / run | valid NDCG@10 | test HR@10 | test NDCG@10 | wall s (ledger) |

``commit`` is the ledger line's ``git_sha`` (seven characters), marked ``(resumed)`` when that line's status is
``resumed`` (its ``wall_s`` then covers the last segment only) and ``(dirty)`` when its ``git_dirty`` (else
``env.json``'s) is true: the working tree held uncommitted changes when the cell ran, so the commit is not all of
the code it ran; a cell with no ledger line (or a line without a commit) takes ``env.json``'s ``git_sha``, and a
wall time that is not a finite number reads ``–``. A runs folder with no ledger (a superseded folder, whose lines
stay in the grid's ledger) gets no wall-time column. Rows are sorted by dataset, model, layer (``standard``
first), variant and seed. ``scripts/check_tables.py`` reruns every
quoted ``python scripts/cell_table.py ...`` command and checks that the table right below it is the one it prints.

Usage (from the repository root):
    python scripts/cell_table.py --runs results/paper_main/runs --only 'sports/sasrec/*'

Errors (one line, exit 2): no such runs folder, or one a level too deep or too shallow (a cell that is not
``dataset/model/layer/[variant/]seedK`` below it); a torn ledger line; a ``metrics.json`` or ``env.json`` that is
not readable JSON, or a ``metrics.json`` missing a field or holding a non-number there; a ledger line whose commit
is not the one in the cell's ``env.json`` (the folder was replaced after the line); a ``metrics.json`` whose
dataset, model and layer are not its path's (``--runs`` a level off); an ``--only`` pattern that matches no
finished cell.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import print_table  # noqa: E402
from collect_cells import DONE, read_ledger  # noqa: E402

HEADER = ("| cell | commit | best epoch / run | valid NDCG@10 | test HR@10 | test NDCG@10 |",
          "|---|---|---:|---:|---:|---:|")
WALL = (" wall s (ledger) |", "---:|")  # the last column, where the runs folder has a ledger
LAYER_ORDER = {"standard": 0, "bft": 1}


SEED = re.compile(r"seed\d+")


def _sort_key(cell: str) -> tuple:
    """``dataset, model, layer (standard, bft, then by name), variant, seed number``."""
    parts = cell.split("/")
    return (parts[0], parts[1], LAYER_ORDER.get(parts[2], 2), parts[2], parts[3:-1], int(parts[-1][4:]))


def finished_cells(runs: Path) -> list[str]:
    """The ``dataset/model/layer/[variant/]seedK`` paths under ``runs`` that hold a ``metrics.json`` (folders not
    named ``seed<digits>``, as ``seed0.bak``, are not cells); a ``runs`` one level too deep or too shallow is refused
    in one line."""
    cells = [p.parent.relative_to(runs) for p in runs.glob("**/seed*/metrics.json") if SEED.fullmatch(p.parent.name)]
    for c in cells:
        if len(c.parts) not in (4, 5):
            raise SystemExit(f"cell_table: --runs {runs} holds {c}, not dataset/model/layer/[variant/]seedK below it; "
                             "give the runs folder whose subfolders are the datasets")
    return sorted((c.as_posix() for c in cells), key=_sort_key)


def _read_json(path: Path, what: str):
    """A JSON file, or a one-line SystemExit naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"cell_table: {path} is not readable JSON ({type(e).__name__}); {what}") from None


def _number(value, path: Path, name: str) -> float:
    """A finite real number from ``metrics.json``, or a one-line SystemExit naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SystemExit(f"cell_table: {path}: {name} is {value!r}, not a number; rerun or re-score that cell")
    return value


def _sha(value) -> str:
    return value[:7] if isinstance(value, str) and value.strip() else ""


def row(runs: Path, cell: str, line: dict | None, wall_column: bool = True) -> str:
    """The Markdown row of one cell, from its ``metrics.json`` and its ledger line (``None``: no line); the wall
    time last when ``wall_column``. The commit is the ledger line's, checked against ``env.json``'s where both
    have one (a folder replaced by hand after its line was written is refused, in one line)."""
    path = runs / cell / "metrics.json"
    m = _read_json(path, "rerun that cell")
    try:
        best, run = m["best_epoch"], m["epochs_run"]
        valid, test = m["valid"]["NDCG@10"], m["test"]["overall"]
        hr, ndcg = test["HR@10"], test["NDCG@10"]
    except (KeyError, TypeError, IndexError) as e:
        raise SystemExit(f"cell_table: {path} lacks {e!s:.60}; is it a bftrec-train metrics.json?") from None
    where = tuple(cell.split("/")[:3])
    if where != (m.get("dataset"), m.get("model"), m.get("layer")):
        raise SystemExit(f"cell_table: {path} is a run of {m.get('dataset')}/{m.get('model')}/{m.get('layer')}, not "
                         f"of {'/'.join(where)}: --runs {runs} is a level too deep or too shallow (give the grid's "
                         "runs folder, whose subfolders are the datasets)")
    nums = [_number(v, path, n) for v, n in ((best, "best_epoch"), (run, "epochs_run"), (valid, "valid NDCG@10"),
                                             (hr, "test HR@10"), (ndcg, "test NDCG@10"))]
    env_path = runs / cell / "env.json"
    env = _read_json(env_path, "rewrite it or delete it") if env_path.is_file() else {}
    env = env if isinstance(env, dict) else {}  # a foreign env.json (not an object) tells nothing
    env_sha = _sha(env.get("git_sha"))
    sha, wall = env_sha, "–"
    if line is not None:
        sha = _sha(line.get("git_sha")) or env_sha
        if env_sha and sha != env_sha:
            raise SystemExit(f"cell_table: {runs / 'ledger.jsonl'} says {cell} ran at {sha}, its env.json at "
                             f"{env_sha}: the folder was replaced after its ledger line; collect it again "
                             "(scripts/collect_cells.py --replace) or mend the line")
        w = line.get("wall_s")
        if not isinstance(w, bool) and isinstance(w, (int, float)) and math.isfinite(w):
            wall = f"{round(w):,}"
    source = line if line is not None and "git_dirty" in line else env
    resumed = line is not None and line["status"] == "resumed"
    marks = [m for m, on in (("resumed", resumed), ("dirty", source.get("git_dirty") is True)) if on]
    commit = (f"`{sha}`" if sha else "–") + (f" ({', '.join(marks)})" if marks else "")
    best, run, valid, hr, ndcg = nums
    return (f"| {cell} | {commit} | {best} / {run} | {valid:.4f} | {hr:.4f} | {ndcg:.4f} |"
            + (f" {wall} |" if wall_column else ""))


def table(runs: Path, only: list[str] | None = None) -> str:
    """The header and one row per finished cell of ``runs`` matching any of ``only`` (all when empty)."""
    if not runs.is_dir():
        raise SystemExit(f"cell_table: no runs folder {runs}; give the folder whose subfolders are the datasets")
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
            last[PurePosixPath(rec["cell"]).as_posix()] = rec  # 'a/b/c/seed0/' names the same cell
    header = [h + w for h, w in zip(HEADER, WALL)] if has_ledger else list(HEADER)
    return "\n".join([*header, *(row(runs, c, last.get(c), has_ledger) for c in cells)])


KEY_CELLS = 1  # the leading cells that name a row (the cell path), for check_tables' reports


def parser() -> argparse.ArgumentParser:
    """The command line (``scripts/check_tables.py`` parses quoted commands with it)."""
    ap = argparse.ArgumentParser(prog="cell_table.py", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=Path, required=True,
                    help="a runs folder: its subfolders are the datasets (ledger.jsonl beside them, if any)")
    ap.add_argument("--only", action="append", metavar="PATTERN",
                    help="fnmatch pattern on dataset/model/layer/seedK; repeatable")
    return ap


def render(args: argparse.Namespace) -> str:
    """What ``main`` prints for parsed ``args`` (``check_tables`` calls it)."""
    return table(args.runs, args.only)


def inputs(args: argparse.Namespace) -> list[Path]:
    """The paths a command reads (``check_tables``: a command whose inputs are not in the checkout fails)."""
    return [args.runs]


def main(argv: list[str] | None = None) -> int:
    return print_table(parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
