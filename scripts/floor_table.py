"""The floor at a glance: one row per dataset from a ``bftrec-report tables`` folder's ``floor.csv`` (every model's
``standard`` layer side by side, mean over its seeds), for docs/results.md §3.0.

Columns: test HR@10 overall for every model (the counted ones, ``pop`` and ``markov``, first; then the trained
ones), HR@10 on the rarest items (Q0) for ``markov`` and every trained model, and cold-user HR@10 for ``markov``
and for the best trained model (named). The models are the ``HR@10 <model>`` columns ``floor.csv`` has, so a
model that joins the tables (GRU4Rec) joins this table by itself. Rows follow the main grid's dataset order.

``--best`` prints instead how often each model is best, over every untagged row of ``floor.csv`` (its ``best
HR@10`` column: every dataset's overall, Q0–Q4, cold and warm rows; a tie counts for each model in it, marked),
naming the rows of each model that is best in a few (``–``: no model has a hit there). Values are read as
``floor.csv`` writes them: ``–`` for none, and a value with a note (other users) is printed but never best.

Usage (from the repository root):
    python scripts/floor_table.py --tables results/paper_main/tables
    python scripts/floor_table.py --tables results/paper_main/tables --best

Errors (one line, exit 2): no ``floor.csv`` in ``--tables``; no ``markov`` column or no trained model; a dataset
without its overall, Q0 or cold row.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # scripts/, repo
from _cli import print_table  # noqa: E402
from comparison_table import name  # noqa: E402

ORDER = ("pop", "markov", "sasrec", "bert4rec", "hstu", "gru4rec")  # the columns' order; other models follow, sorted
DATASETS = ("sports", "instruments", "beauty", "toys", "yelp", "ml-1m")  # the main grid's order; others follow
KEY_CELLS = 1  # the leading cell that names a row (the dataset), for check_tables' reports


def _floor(tables: Path) -> tuple[Path, pd.DataFrame]:
    """``floor.csv``'s path and its untagged rows, all as text; a missing file is a one-line SystemExit."""
    path = tables / "floor.csv"
    if not path.is_file():
        raise SystemExit(f"floor_table: no {path}; run bftrec-report tables with a counted model (pop, markov) "
                         "in the runs, or give its --out folder (--tables)")
    frame = pd.read_csv(path, keep_default_na=False, dtype=str)
    return path, frame[frame["tag"] == ""]


def _is_counted(model: str) -> bool:
    """A statistical model (``trainable = False`` in its class, ``bftrec.models``: pop, markov): counted, not
    trained. A name the registry does not know (a backbone of one's own, from ``--config-dir``) is trained."""
    from bftrec.models import MODELS

    return model in MODELS and not MODELS.get(model).trainable


def _label(model: str) -> str:
    """A column's model name: a counted model as its config name (``markov``), a trained one as the field writes it
    (``SASRec``)."""
    return model if _is_counted(model) else name(model)


def _models(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """``floor.csv``'s (counted, trained) models, each in ``ORDER``, others after it by name."""
    found = [c.removeprefix("HR@10 ") for c in frame.columns if c.startswith("HR@10 ") and c != "best HR@10"]
    models = [m for m in ORDER if m in found] + sorted(set(found) - set(ORDER))
    return [m for m in models if _is_counted(m)], [m for m in models if not _is_counted(m)]


def table(tables: Path) -> str:
    """The Markdown table (see the module docstring); a one-line SystemExit on bad input."""
    path, frame = _floor(tables)
    counted, trained = _models(frame)
    if "markov" not in counted or not trained:
        raise SystemExit(f"floor_table: {path} needs markov and a trained model; it has {counted + trained}")
    head = ([_label(m) for m in counted + trained] + [f"Q0: {_label(m)}" for m in ["markov"] + trained]
            + ["cold: markov", "cold: best trained model"])
    lines = ["| dataset | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    datasets = [d for d in DATASETS if d in set(frame["dataset"])] + sorted(set(frame["dataset"]) - set(DATASETS))
    for ds in datasets:
        rows = {}
        for stratum in ("overall", "Q0", "cold"):
            hit = frame[(frame["dataset"] == ds) & (frame["stratum"] == stratum)]
            if len(hit) != 1:
                raise SystemExit(f"floor_table: {len(hit)} untagged {stratum} rows for {ds} in {path} (one "
                                 "expected); regenerate the tables")
            rows[stratum] = hit.iloc[0]
        cells = ([rows["overall"][f"HR@10 {m}"] or "–" for m in counted + trained]
                 + [rows["Q0"][f"HR@10 {m}"] or "–" for m in ["markov"] + trained]
                 + [rows["cold"]["HR@10 markov"] or "–", _best_cell(rows["cold"], trained)])
        lines.append(f"| {name(ds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plain(text: str) -> float | None:
    """A floor.csv value as a number; None for ``–``, an empty cell, or a value with a note (``0.0123 (1200
    users)``: on other users than the row's, so not comparable, as ``bftrec.report.floor`` leaves it out of best)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _best_cell(row: pd.Series, trained: list[str]) -> str:
    """The best trained model's value on ``row`` with its name (ties: every name), ``–`` where none has a hit."""
    values = {m: _plain(row[f"HR@10 {m}"]) for m in trained}
    values = {m: v for m, v in values.items() if v is not None}
    top = max(values.values(), default=0.0)
    if top <= 0:
        return "–"
    return f"{top:.4f} ({', '.join(name(m) for m, v in values.items() if v == top)})"


NAMED = 8  # a model best in at most this many rows has them named


def best_table(tables: Path) -> str:
    """How often each model is best (``--best``; see the module docstring)."""
    path, frame = _floor(tables)
    if "best HR@10" not in frame.columns or frame.empty:
        raise SystemExit(f"floor_table: {path} has no untagged rows with a 'best HR@10' column; regenerate it")
    where: dict[str, list[str]] = {}
    for ds, stratum, best in zip(frame["dataset"], frame["stratum"], frame["best HR@10"]):
        models = [m.strip() for m in str(best).split(",") if m.strip()] or ["–"]
        for m in models:  # a tie counts for every model in it
            where.setdefault(m, []).append(f"{name(ds)} {stratum}" + (" (tie)" if len(models) > 1 else ""))
    lines = ["| best HR@10 | rows | where |", "|---|---:|---|"]
    for model, rows in sorted(where.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        label = "– (no hit)" if model == "–" else _label(model)
        lines.append(f"| {label} | {len(rows)} of {len(frame)} | {', '.join(rows) if len(rows) <= NAMED else ''} |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line (``scripts/check_tables.py`` parses quoted commands with it)."""
    ap = argparse.ArgumentParser(prog="floor_table.py", description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=Path, required=True, help="a bftrec-report tables folder with floor.csv")
    ap.add_argument("--best", action="store_true", help="how often each model is best instead")
    return ap


def render(args: argparse.Namespace) -> str:
    """What ``main`` prints for parsed ``args`` (``check_tables`` calls it)."""
    return best_table(args.tables) if args.best else table(args.tables)


def inputs(args: argparse.Namespace) -> list[Path]:
    """The paths a command reads (``check_tables``: a command whose inputs are not in the checkout fails)."""
    return [args.tables]


def main(argv: list[str] | None = None) -> int:
    return print_table(parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
