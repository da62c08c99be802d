"""Do the hand-written run rows of the results READMEs hold the numbers of the runs they name?

Many READMEs under ``results/`` describe one run per table row in words (``| `ce_tune/d128/` | CE, D=128 | 7 / 17 |
0.0342 | ...``): such rows cannot come from a printer, but their numbers can be checked. A row is a **run row** when
a backticked path in its first cell is a folder holding ``metrics.json``, read relative to the README's folder, or
else to the repository root (the first such path counts). In a run row, each cell under one of these headers is
compared with the run's ``metrics.json`` at the precision it is printed with (``**bold**`` and a trailing note
such as ``(+14.1%)`` or ``(p 0.14)`` are ignored):

    valid NDCG@10 / valid HR@10        valid[metric]
    test HR@10 / test NDCG@10 (or test MRR)   test.overall[metric]
    best epoch / run                   best_epoch / epochs_run
    best epoch                         best_epoch

A cell holding a mean over runs (``±``) or no number is not compared. Rows whose first cell names no such folder
(runs that were never committed, means over seeds) are not run rows; they are counted, not checked.

Usage (from the repository root):
    python scripts/check_run_rows.py [--only SUBSTRING]

``scripts/check_tables.py`` runs the same check (one outcome per README table with run rows). Exit status 1 when
a compared cell differs from its run's ``metrics.json``, or a run's ``metrics.json`` cannot be read.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

log = logging.getLogger("check_run_rows")
PATH = re.compile(r"`([^`\s]+)`")
NUMBER = re.compile(r"^[−-]?\d+(?:\.\d+)?")
COLUMNS = {"valid NDCG@10": ("valid", "NDCG@10"), "valid HR@10": ("valid", "HR@10"),
           "test HR@10": ("test", "HR@10"), "test NDCG@10": ("test", "NDCG@10"), "test MRR": ("test", "MRR")}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(md: Path) -> list[tuple[int, list[str], list[list[str]]]]:
    """``(line number of the header, header cells, rows of cells)`` for every Markdown table in ``md``."""
    lines = md.read_text(errors="replace").split("\n")
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|\s*:?-", lines[i + 1]):
            head, rows, k = _cells(lines[i]), [], i + 2
            while k < len(lines) and lines[k].startswith("|"):
                rows.append(_cells(lines[k]))
                k += 1
            out.append((i + 1, head, rows))
            i = k
        else:
            i += 1
    return out


def run_folder(first_cell: str, md: Path, root: Path) -> Path | None:
    """The run a row names: the first backticked path of its first cell that is a folder with ``metrics.json``,
    relative to ``md``'s folder or else to ``root``; None where there is none."""
    for m in PATH.finditer(first_cell):
        for base in (md.parent, root):
            folder = base / m.group(1)
            if (folder / "metrics.json").is_file():
                return folder
    return None


def _printed(cell: str) -> str | None:
    """The number a cell prints (``0.0704`` from ``**0.0704 (+14.1%)**``); None for a mean (±) or no number."""
    text = cell.replace("*", "").strip()
    if "±" in text:
        return None
    m = NUMBER.match(text)
    return m.group(0).replace("−", "-") if m else None


def _same(printed: str, value: float) -> bool:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return f"{value:.{decimals}f}" == f"{float(printed):.{decimals}f}"


def check_row(head: list[str], row: list[str], metrics: dict) -> list[str]:
    """The cells of ``row`` that differ from ``metrics`` (a run's ``metrics.json``), as ``column: printed, run
    value``."""
    wrong = []
    for col, cell in zip(head, row):
        if col in COLUMNS:
            split, metric = COLUMNS[col]
            value = (metrics["valid"] if split == "valid" else metrics["test"]["overall"]).get(metric)
            printed = _printed(cell)
            if printed is not None and value is not None and not _same(printed, value):
                wrong.append(f"{col}: {printed}, run {value:.4f}")
        elif col in ("best epoch / run", "best epoch"):
            got = re.findall(r"\d+", cell.replace("*", ""))
            want = [metrics["best_epoch"], metrics["epochs_run"]][:2 if "/ run" in col else 1]
            if got and "±" not in cell and [int(g) for g in got[:len(want)]] != want:
                wrong.append(f"{col}: {' / '.join(got[:len(want)])}, run {' / '.join(map(str, want))}")
    return wrong


def check_markdown(md: Path, root: Path) -> list[dict]:
    """One outcome per table of ``md`` with run rows: ``same`` or ``differs`` (the rows by their first cell, and
    the cells), or ``failed`` where a run's ``metrics.json`` cannot be read."""
    out = []
    for line_no, head, rows in tables(md):
        if not any(c in COLUMNS or c.startswith("best epoch") for c in head):
            continue
        checked, wrong = 0, []
        for row in rows:
            folder = run_folder(row[0], md, root) if row else None
            if folder is None:
                continue
            try:
                metrics = json.loads((folder / "metrics.json").read_text())
            except (OSError, ValueError) as e:
                out.append({"command": f"{md}:{line_no}: run rows", "result": "failed",
                            "why": f"{folder / 'metrics.json'}: {e}"})
                break
            checked += 1
            bad = check_row(head, row, metrics)
            if bad:
                wrong.append(f"{row[0][:60]} ({'; '.join(bad)})")
        else:
            if checked:
                label = f"{md}:{line_no}: run rows ({checked} of {len(rows)} checked)"
                out.append({"command": label, "result": "differs", "files": wrong} if wrong
                           else {"command": label, "result": "same"})
    return out


def check_all(root: Path, only: str = "") -> list[dict]:
    """``check_markdown`` over the READMEs under ``root/results`` (and ``docs/``, README.md) whose path holds
    ``only``."""
    sources = [*(root / "results").rglob("*.md"), *(root / "docs").rglob("*.md"), root / "README.md"]
    return [o for md in sorted(p for p in sources if p.is_file() and only in str(p)) for o in check_markdown(md, root)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="check only Markdown files whose path contains this text")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    outcomes = check_all(Path("."), args.only)
    for res in outcomes:
        log.info("%-8s %s%s", res["result"], res["command"],
                 f" ({res['why']})" if "why" in res else f": {', '.join(res['files'])}" if res.get("files") else "")
    bad = [o for o in outcomes if o["result"] != "same"]
    log.info("%d tables with run rows: %d differ or failed", len(outcomes), len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
