"""Do the hand-written tables of the results READMEs hold the numbers of the runs and tables they name?

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

Tables of means over runs are checked another way: where the text above a table (up to the previous table or
heading) cites generated tables in backticks (``tables/variants.md``, or a study folder: its files and its
``tables/``; relative to the README, or else to the root), every ``mean ± SD`` the table prints must be one of
those files' ``mean ± SD`` values rounded to the printed precision (signs and thousands included; a mean under 1
needs three decimals), and every interval of percentages (``[−8.9%, +2.7%]``) must be printed in one of them.
The row and column are not matched (a value copied into the wrong row can pass), and a gain printed before its
interval is not checked. Only hand-written files are read (READMEs, docs/, a pre-registration) and only generated
ones count as sources; a table below a quoted printer command is left to check_tables.

A metric printed with fewer than three decimals differs (``0.1`` could hide any value), as does one the run does
not hold. A cell holding a mean over runs (``±``) or not starting with a number (after ``**``, ``+``, ``≈``) is not
compared, and a row with no compared cell is not counted as checked. Rows whose first cell names no such folder
(runs that were never committed, means over seeds) are not run rows; they are counted, not checked. Only the
headers above are read: a table that spells them otherwise is not checked.

Usage (from the repository root):
    python scripts/check_run_rows.py [--only SUBSTRING]

``scripts/check_tables.py`` runs the same check (one outcome per table checked). Exit status 1 when a compared
cell differs from its run's ``metrics.json`` or its cited tables, or a run's ``metrics.json`` cannot be read.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from pathlib import Path

log = logging.getLogger("check_run_rows")
PATH = re.compile(r"`([^`\s]+)`")
NUMBER = re.compile(r"^[−-]?\d+(?:\.\d+)?")
MIN_DECIMALS = 3  # a metric printed coarser than this could hide any difference ("0.1" for 0.0947)
COLUMNS = {"valid NDCG@10": ("valid", "NDCG@10"), "valid HR@10": ("valid", "HR@10"),
           "test HR@10": ("test", "HR@10"), "test NDCG@10": ("test", "NDCG@10"), "test MRR": ("test", "MRR")}


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row; an escaped pipe (``\\|``, e.g. inside a quoted command) is not a border."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(md: Path) -> list[tuple[int, list[str], list[list[str]], str]]:
    """``(line number of the header, header cells, rows of cells, the text above)`` for every Markdown table in
    ``md``; the text above runs up to the previous table or heading (the heading included)."""
    lines = md.read_text(errors="replace").split("\n")
    out, i = [], 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|\s*:?-", lines[i + 1]):
            head, rows, k = _cells(lines[i]), [], i + 2
            while k < len(lines) and lines[k].startswith("|"):
                rows.append(_cells(lines[k]))
                k += 1
            j = i - 1
            while j > 0 and not lines[j].startswith(("|", "#")):
                j -= 1
            above = "\n".join(lines[j + 1 if lines[j].startswith("|") else j:i])
            out.append((i + 1, head, rows, above))
            i = k
        else:
            i += 1
    return out


PRINTERS = ("cell_table", "comparison_table", "verdict_table", "floor_table")  # the table printers check_tables runs
PRINTED = re.compile(rf"`python\s+scripts/(?:{'|'.join(PRINTERS)})\.py\s")  # a table below a quoted printer command
SIGNED = r"(?<![\d.,])([+−–-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)"  # signed, thousands (9,214) whole
MEAN_SD = re.compile(SIGNED + r" ± (\d+(?:\.\d+)?)")
INTERVAL = re.compile(r"\[" + SIGNED + r" ?%, " + SIGNED + r" ?%\]")  # a printed 95% CI of a gain, in percent


def hand_written(md: Path) -> bool:
    """A Markdown file people write (a README, docs/, a pre-registration); every other one under results/ was
    written by a command (tables, summaries, readouts), which check_tables reruns where a README quotes it."""
    return md.name in ("README.md", "preregistration.md") or "docs" in md.parts


def cited_files(above: str, md: Path, root: Path) -> list[Path]:
    """The generated tables the text above a table cites in backticks (``tables/variants.md``; a folder: its .md
    and .csv files and those of its ``tables/``), relative to ``md``'s folder or else to ``root``; hand-written
    files never count as sources."""
    files = []
    for name in re.findall(r"`([^`\s]{1,200})`", above):
        for base in (md.parent, root):
            path = base / name
            if path.is_file() and path.suffix in (".md", ".csv"):
                files.append(path)
                break
            if path.is_dir():  # a study folder: its own files and its tables/
                files += [f for d in (path, path / "tables") for f in sorted(d.glob("*.md")) + sorted(d.glob("*.csv"))]
                break
    return [f for f in dict.fromkeys(files) if not hand_written(f)]


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _minus(text: str) -> str:
    """A printed number as Python reads it: any minus sign as ``-``, no thousands separator."""
    return text.replace("−", "-").replace("–", "-").replace(",", "")


def _rounds_to(value: float, printed: str) -> bool:
    """``value`` printed at ``printed``'s precision is ``printed`` (either rounding of a half: 0.0745 -> 0.074 or
    0.075, since a table may round the decimal and not the binary value)."""
    d = _decimals(printed)
    target = float(_minus(printed))
    return abs(value - target) <= 0.5 * 10 ** -d + 1e-12


def check_means(rows: list[list[str]], files: list[Path]) -> tuple[int, list[str]]:
    """``(mean ± SD values and gain intervals in rows, those no cited file holds)``: a ``mean ± SD`` is held when
    some ``M ± S`` of a file rounds to it at the precision it is printed with (``0.741 ± 0.019`` from ``0.7407 ±
    0.0190``), signs included; a mean under 1 printed with fewer than ``MIN_DECIMALS`` decimals (``0.1 ± 0.0``)
    is too coarse to check, and differs; an interval of percentages (``[−8.9%, +2.7%]``) is held when a file
    prints the same interval (any minus sign)."""
    texts = [f.read_text(errors="replace") for f in files]
    source = [(float(_minus(m)), float(_minus(sd))) for t in texts for m, sd in MEAN_SD.findall(t)]
    cells = [c.replace("*", "") for row in rows for c in row]
    values = [(m, sd) for c in cells for m, sd in MEAN_SD.findall(c)]
    missing = []
    for m, sd in values:
        if abs(float(_minus(m))) < 1 and _decimals(m) < MIN_DECIMALS:
            missing.append(f"{m} ± {sd} (too coarse to check)")
        elif not any(_rounds_to(a, m) and _rounds_to(b, sd) for a, b in source):
            missing.append(f"{m} ± {sd}")
    printed = "\n".join(texts).replace(" %", "%").replace("−", "-").replace("–", "-")
    intervals = [(lo, hi) for c in cells for lo, hi in INTERVAL.findall(c)]
    missing += [f"[{lo}%, {hi}%]" for lo, hi in intervals if f"[{_minus(lo)}%, {_minus(hi)}%]" not in printed]
    return len(values) + len(intervals), missing


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
    """The number a cell prints (``0.0704`` from ``**0.0704 (+14.1%)**``, ``+0.0704``, ``≈0.0704``); None for a
    mean (±) or a cell that does not start with a number."""
    text = cell.replace("*", "").strip().lstrip("+≈~").strip()
    if "±" in text:
        return None
    m = NUMBER.match(text)
    return m.group(0).replace("−", "-") if m else None


def _same(printed: str, value: float) -> bool:
    """``value`` formatted at ``printed``'s precision is ``printed`` (a run's metric: Python's rounding)."""
    decimals = _decimals(printed)
    return f"{value:.{decimals}f}" == f"{float(printed):.{decimals}f}"


def _run_value(metrics: dict, path: tuple[str, ...]):
    """``metrics[path[0]][path[1]]...`` as a finite number, or None where the run lacks it (or it is no number)."""
    value = metrics
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def check_row(head: list[str], row: list[str], metrics: dict) -> tuple[int, list[str]]:
    """``(cells compared, the cells of row that differ from metrics)``, ``metrics`` being a run's ``metrics.json``;
    a difference reads ``column: printed, run value``. A metric printed with fewer than ``MIN_DECIMALS`` decimals,
    or one the run does not hold, differs."""
    compared, wrong = 0, []
    for col, cell in zip(head, row):
        if col in COLUMNS:
            split, metric = COLUMNS[col]
            printed = _printed(cell)
            if printed is None:
                continue
            compared += 1
            value = _run_value(metrics, ("valid", metric) if split == "valid" else ("test", "overall", metric))
            decimals = _decimals(printed)
            if value is None:
                wrong.append(f"{col}: {printed}, the run has no such number")
            elif decimals < MIN_DECIMALS:
                wrong.append(f"{col}: {printed}, printed with {decimals} decimals (the run: {value:.4f})")
            elif not _same(printed, value):
                wrong.append(f"{col}: {printed}, run {value:.4f}")
        elif col in ("best epoch / run", "best epoch"):
            got = re.findall(r"\d+", cell.replace("*", ""))
            keys = ("best_epoch", "epochs_run")[:2 if "/ run" in col else 1]
            if not got or "±" in cell:
                continue
            compared += 1
            want = [_run_value(metrics, (k,)) for k in keys]
            if None in want:
                wrong.append(f"{col}: {' / '.join(got[:len(keys)])}, the run has no {' or '.join(keys)}")
            elif [int(g) for g in got[:len(keys)]] != want:
                wrong.append(f"{col}: {' / '.join(got[:len(keys)])}, run {' / '.join(map(str, want))}")
    return compared, wrong


def check_markdown(md: Path, root: Path) -> list[dict]:
    """One outcome per table of ``md`` with run rows: ``same`` or ``differs`` (the rows by their first cell, and
    the cells), or ``failed`` where a run's ``metrics.json`` cannot be read."""
    out = []
    for line_no, head, rows, above in tables(md):
        files = cited_files(above, md, root)
        if files and not PRINTED.search(above):  # a printed table is checked by check_tables against its printer
            n, missing = check_means(rows, files)
            if n:
                against = ", ".join(sorted({f.name for f in files}))
                label = f"{md}:{line_no}: means and intervals ({n}, against {against})"
                out.append({"command": label, "result": "differs", "files": missing} if missing
                           else {"command": label, "result": "same"})
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
            if not isinstance(metrics, dict):
                out.append({"command": f"{md}:{line_no}: run rows", "result": "failed",
                            "why": f"{folder / 'metrics.json'} holds no JSON object"})
                break
            compared, bad = check_row(head, row, metrics)
            checked += bool(compared)
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
    hand = sorted(p for p in sources if p.is_file() and only in str(p) and hand_written(p))
    return [o for md in hand for o in check_markdown(md, root)]


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
    log.info("%d hand-written tables checked: %d differ or failed", len(outcomes), len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
