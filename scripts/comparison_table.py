"""A verdict table for a results README, printed from a ``bftrec-report tables`` folder: one row per (dataset,
backbone), each layer against ``standard`` at the endpoints asked for.

Reads ``<tables>/comparisons.csv`` (the gains and tests) and ``overall.csv`` (the HR@10 means) and prints

    | dataset | backbone | seeds | HR@10 standard | HR@10 <layer> | gain (p_Holm) | Q0 (rarest items) gain (p_Holm) |
      ... | p_seeds (same order) |

Each gain cell is the comparison's ``gain`` (the relative difference of the seed means) with its fixed-seeds
Holm-adjusted Wilcoxon p (``p_holm_fixed_seeds``), **bold** below 0.05; ``(n/a: k hits)`` where the stratum's
``standard`` cell has under 20 HR@10 hits (seed mean), so no test, and ``–`` for the gain where it has none. The
last column gives the test over seeds (``p_seeds``, the seed as the unit: docs/DESIGN.md, statistics) of each gain
column in the same order, which a claim rests on. ``--k`` adds the mean trained Kalman gain K on the rarest and
most popular bins (``summary.csv``, its grouping named). p values: two significant digits (three where two would
cross 0.05; more where even three would), ``1`` from 0.995, scientific below 0.001.
``--by-endpoint`` prints one pair instead, one row per endpoint, in the seed unit: the mean of the per-seed gains,
each seed's gain, the 95% interval, ``p_seeds``, ``p_holm_seeds`` and the gain the test detects at power 0.8 (the
replication and equal-budget READMEs). ``scripts/check_tables.py`` reruns every quoted
``python scripts/comparison_table.py ...`` command and checks that the table right after it is what it prints.

Usage (from the repository root):
    python scripts/comparison_table.py --tables results/paper_main/tables --layer bft --dataset sports \
        --model sasrec --model bert4rec --model hstu --endpoint overall:HR@10 --endpoint Q0:HR@10 \
        --endpoint cold:HR@10

Untagged comparisons only. The HR@10 means are ``overall.csv``'s, over each layer's seeds; where a layer has other
seeds than the gain compares (the seeds both layers have), its mean names its seed count.

Errors (one line, exit 2): no ``comparisons.csv`` or ``overall.csv`` (or, with ``--k``, ``summary.csv``) in
``--tables``; an endpoint not written ``stratum:metric``; a dataset, backbone, layer or endpoint with no comparison
there; a (dataset, backbone) pair named by both ``--dataset`` and ``--model`` with no comparison (unnamed, the
pairs present are printed); a pair with none or several rows for an endpoint, or in ``overall.csv`` /
``summary.csv``; a column those lack.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # scripts/, repo
from _cli import print_table  # noqa: E402

from bftrec.report.sweep import parse_seed_gains  # noqa: E402

NAMES = {"sasrec": "SASRec", "bert4rec": "BERT4Rec", "hstu": "HSTU", "gru4rec": "GRU4Rec", "ml-1m": "ML-1M",
         "ml-100k": "ML-100k"}
STRATA = {"overall": "overall", "Q0": "Q0 (rarest items)", "cold": "cold users", "warm": "warm users"}


def name(key: str) -> str:
    """The display name of a dataset or backbone (``ml-1m`` -> ``ML-1M``, ``beauty`` -> ``Beauty``)."""
    return NAMES.get(key, key[:1].upper() + key[1:])


def p_text(p: float) -> str:
    """A p value as the READMEs print it: two significant digits (more where fewer would cross 0.05), ``1`` from
    0.995, ``2.3e-4`` below 0.001, ``0`` for 0, ``–`` for none (NaN)."""
    if p is None or not math.isfinite(p):
        return "–"
    if p >= 0.995:
        return "1"
    if p <= 0:
        return "0"
    if p < 1e-3:
        mantissa, exp = f"{p:.1e}".split("e")
        return f"{mantissa}e{int(exp)}"
    for sig in range(2, 8):  # more digits where the printed value would read on the other side of 0.05
        r = float(f"{p:.{sig}g}")
        text = f"{r:.{max(sig - 1 - math.floor(math.log10(r)), 0)}f}"
        if (float(text) < 0.05) == (p < 0.05):
            break
    return text


def gain_text(gain: float) -> str:
    """``+1.4%`` / ``−2.8%`` (a true minus sign, as the prose); ``–`` where there is no gain (no baseline hit)."""
    if gain is None or not math.isfinite(gain):
        return "–"
    text = f"{100 * gain:+.1f}%"
    return text.replace("-", "−")


def cell(row: pd.Series) -> str:
    """One gain cell: ``+1.4% (0.42)``, bold below 0.05, or ``−12.5% (n/a: 16 hits)``."""
    gain = gain_text(row["gain"])
    note = row["test_note"]
    if isinstance(note, str) and note.startswith("n/a"):
        if "hits" in note:
            return f"{gain} (n/a: {_hits(row['baseline_hits'])} hits)"
        return f"{gain} ({note.replace('(', '').replace(')', '').replace('n/a ', 'n/a: ')})"  # e.g. too few seeds
    p = row["p_holm_fixed_seeds"]
    if pd.isna(p):
        return f"{gain} (–)"
    text = f"{gain} ({p_text(p)})"
    return f"**{text}**" if p < 0.05 else text


def _mean(text) -> str:
    """The mean of an ``overall.csv`` cell (``0.0942 ± 0.0019`` or ``0.0668 (1 seed)``)."""
    return str(text).split(" ")[0]


def _comparisons(tables: Path, layer: str, endpoints: list[str] | None) -> tuple[pd.DataFrame, list[tuple]]:
    """``comparisons.csv``'s untagged rows of ``layer`` and the (stratum, metric) endpoints asked for (default:
    overall, Q0 and cold HR@10), each checked; a one-line SystemExit otherwise."""
    path = tables / "comparisons.csv"
    if not path.is_file():
        raise SystemExit(f"comparison_table: no {path}; give a bftrec-report tables folder (--tables)")
    comp = pd.read_csv(path)
    comp["tag"] = comp["tag"].astype(object).where(comp["tag"].notna(), "")  # an untagged row reads ""
    comp = comp[(comp["layer"] == layer) & (comp["tag"] == "")]
    if comp.empty:
        raise SystemExit(f"comparison_table: no untagged comparison of layer {layer!r} in {path}")
    ends = []
    for e in endpoints or ["overall:HR@10", "Q0:HR@10", "cold:HR@10"]:
        stratum, _, metric = e.partition(":")
        if not metric:
            raise SystemExit(f"comparison_table: --endpoint {e!r} is not stratum:metric, e.g. Q0:HR@10")
        if not ((comp["stratum"] == stratum) & (comp["metric"] == metric)).any():
            raise SystemExit(f"comparison_table: --endpoint {e!r}: no {stratum} {metric} comparison of {layer}")
        ends.append((stratum, metric))
    return comp, ends


def _one(rows: pd.DataFrame, ds: str, model: str, layer: str, stratum: str, metric: str, tables: Path) -> pd.Series:
    """The one comparison row of an endpoint; none or several is a one-line SystemExit."""
    hit = rows[(rows["stratum"] == stratum) & (rows["metric"] == metric)]
    if len(hit) != 1:
        raise SystemExit(f"comparison_table: {len(hit)} rows for {ds}/{model} {layer} {stratum} {metric} in "
                         f"{tables / 'comparisons.csv'} (one expected); regenerate the tables")
    return hit.iloc[0]


def table(tables: Path, layer: str, datasets: list[str] | None = None, models: list[str] | None = None,
          endpoints: list[str] | None = None, k: bool = False) -> str:
    """The Markdown table (header included); see the module docstring. Raises SystemExit (one line) on bad
    input."""
    paths = {n: tables / f"{n}.csv" for n in ("comparisons", "overall", "summary")}
    comp, ends = _comparisons(tables, layer, endpoints)
    for n in ("overall",) + (("summary",) if k else ()):
        if not paths[n].is_file():
            raise SystemExit(f"comparison_table: no {paths[n]}; give a bftrec-report tables folder (--tables)")
    datasets_given, models_given = bool(datasets), bool(models)
    datasets = datasets or sorted(comp["dataset"].unique())
    models = models or sorted(comp["model"].unique())
    for what, keys, col in (("dataset", datasets, "dataset"), ("backbone", models, "model")):
        for key in keys:
            if key not in set(comp[col]):
                raise SystemExit(f"comparison_table: no {layer} comparison for {what} {key!r} in "
                                 f"{paths['comparisons']}")
    overall = _indexed(paths["overall"])
    summary = _indexed(paths["summary"]) if k else None
    for frame, col in ((overall, "HR@10 standard"), (overall, f"HR@10 {layer}"), (summary, f"K Q0 / Q4 {layer}")):
        if frame is not None and col not in frame.columns:
            raise SystemExit(f"comparison_table: no column {col!r} in {tables}; regenerate the tables (bftrec-report "
                             "tables) or pick another --layer")
    explicit = bool(datasets_given and models_given)
    heads = [f"{'' if m == 'HR@10' else m + ' '}{'' if s == 'overall' else STRATA.get(s, s) + ' '}gain (p_Holm)"
             for s, m in ends]
    lines = ["| dataset | backbone | seeds | HR@10 standard | HR@10 " + layer + " | " + " | ".join(heads)
             + (" | K Q0 / Q4" if k else "") + " | p_seeds (same order) |",
             "|---|---|---|---:|---:|" + "---|" * len(ends) + ("---|" if k else "") + "---|"]
    for ds in datasets:
        for model in models:
            rows = comp[(comp["dataset"] == ds) & (comp["model"] == model)]
            if rows.empty:
                if explicit:  # asked for by name: a missing row is an error, not a shorter table
                    raise SystemExit(f"comparison_table: no {layer} comparison of {ds}/{model} in "
                                     f"{paths['comparisons']}; drop that --dataset or --model")
                continue
            got = [_one(rows, ds, model, layer, stratum, metric, tables) for stratum, metric in ends]
            o = _row(overall, (ds, model), paths["overall"])
            compared = parse_seed_gains(got[0]["seed_gains"], keep_nan=True)  # seed -> gain, every seed compared
            means = []
            for lay_name in ("standard", layer):  # a mean over other seeds than the gain compares says so
                n = _layer_seeds(o["seeds"], lay_name)
                text = _mean(o[f"HR@10 {lay_name}"])
                means.append(text if n is None or n == len(compared) else f"{text} ({_n_seeds(n)})")
            cells = [name(ds), name(model), ", ".join(map(str, compared)), *means, *(cell(r) for r in got)]
            if k:
                cells.append(_k_text(_row(summary, (ds, model), paths["summary"])[f"K Q0 / Q4 {layer}"]))
            cells.append(", ".join("n/a" if pd.isna(r["p_seeds"]) else p_text(r["p_seeds"]) for r in got))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def endpoint_table(tables: Path, layer: str, dataset: str, model: str, endpoints: list[str] | None = None) -> str:
    """One (dataset, backbone) pair, one row per endpoint, in the seed unit (``--by-endpoint``): the mean of the
    per-seed gains, each seed's gain (two decimals: as stored), the 95% interval (seeds, then users, resampled),
    ``p_seeds``, ``p_holm_seeds`` (Holm over the pre-registered endpoints; ``–`` for an exploratory row) and the
    gain the test detects at power 0.8. A row without a test gives its gain and the reason."""
    comp, ends = _comparisons(tables, layer, endpoints)
    rows = comp[(comp["dataset"] == dataset) & (comp["model"] == model)]
    if rows.empty:
        raise SystemExit(f"comparison_table: no {layer} comparison of {dataset}/{model} in "
                         f"{tables / 'comparisons.csv'}")
    lines = ["| endpoint | gain (mean of per-seed gains) | per seed | 95% CI | p_seeds | p_Holm (seeds) | "
             "detectable (power 0.8) |", "|---|---|---|---|---|---|---|"]
    for stratum, metric in ends:
        r = _one(rows, dataset, model, layer, stratum, metric, tables)
        label = f"{STRATA.get(stratum, stratum)} {metric}"
        note = r["test_note"]
        if isinstance(note, str) and note.startswith("n/a"):
            lines.append(f"| {label} | {gain_text(r['gain_seeds'])}, {note} | | | | | |")
            continue
        seeds = ", ".join(map(_seed_gain, parse_seed_gains(r["seed_gains"], keep_nan=True).values()))
        ci = f"[{gain_text(r['ci_lo_seeds'])}, {gain_text(r['ci_hi_seeds'])}]"
        mde = gain_text(r["mde_seeds"]).lstrip("+")
        lines.append(f"| {label} | {gain_text(r['gain_seeds'])} | {seeds} | {ci} | {p_text(r['p_seeds'])} | "
                     f"{p_text(r['p_holm_seeds'])} | {mde} |")
    return "\n".join(lines)


def _seed_gain(value: float) -> str:
    """``+4.05%`` from ``comparisons.csv``'s ``7:+0.0405``: at the precision it is stored in (two decimals of a
    percent), since rounding it again to one decimal could land on the wrong side (0.040516 stored as 0.0405)."""
    return "–" if not math.isfinite(value) else f"{100 * value:+.2f}%".replace("-", "−")


def _n_seeds(n: int) -> str:
    return f"{n} seed" + ("" if n == 1 else "s")


def _layer_seeds(text: str, layer: str) -> int | None:
    """A layer's seed count from ``overall.csv``'s ``seeds`` cell (``3`` for every layer, or ``standard 3, bft 1``);
    None where the cell does not name it."""
    text = str(text).strip()
    if text.isdigit():
        return int(text)
    for part in text.split(","):
        key, _, n = part.strip().rpartition(" ")
        if key == layer and n.isdigit():
            return int(n)
    return None


def _hits(hits: float) -> str:
    """A seed-mean hit count: ``16``, or ``19.7`` (never rounded up to the 20 a test needs)."""
    return f"{hits:.1f}".removesuffix(".0")


def _indexed(path: Path) -> pd.DataFrame:
    """A table of ``bftrec-report tables`` indexed by (dataset, model, tag), all as text."""
    return pd.read_csv(path, keep_default_na=False, dtype=str).set_index(["dataset", "model", "tag"])


def _row(frame: pd.DataFrame, key: tuple, path: Path) -> pd.Series:
    """The untagged row of (dataset, model) in ``frame``; none or several is a one-line SystemExit."""
    full = (*key, "")
    n = int((frame.index == full).sum()) if len(frame) else 0
    if n != 1:
        raise SystemExit(f"comparison_table: {n} untagged rows for {key[0]}/{key[1]} in {path} (one expected); "
                         "regenerate the tables")
    return frame.loc[full]


def _k_text(text: str) -> str:
    """``0.70 / 0.73 (by token)`` from ``summary.csv``'s ``0.6985 / 0.7260 (by token)``."""
    parts = str(text).split(" ")
    try:
        return f"{float(parts[0]):.2f} / {float(parts[2]):.2f}" + (" " + " ".join(parts[3:]) if parts[3:] else "")
    except (IndexError, ValueError):
        return "–"


KEY_CELLS = 2  # the leading cells that name a row (dataset and backbone), for check_tables' reports


def parser() -> argparse.ArgumentParser:
    """The command line (``scripts/check_tables.py`` parses quoted commands with it)."""
    ap = argparse.ArgumentParser(prog="comparison_table.py", description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=Path, required=True, help="a bftrec-report tables folder")
    ap.add_argument("--layer", required=True, help="the layer compared with standard (bft, bft_h)")
    ap.add_argument("--dataset", action="append", help="a dataset, in row order; repeatable (default: all)")
    ap.add_argument("--model", action="append", help="a backbone, in row order; repeatable (default: all)")
    ap.add_argument("--endpoint", action="append", metavar="STRATUM:METRIC",
                    help="a gain column, e.g. Q0:HR@10; repeatable (default: overall, Q0 and cold HR@10)")
    ap.add_argument("--k", action="store_true", help="add the mean trained K on Q0 / Q4 (summary.csv)")
    ap.add_argument("--by-endpoint", action="store_true",
                    help="one pair (one --dataset, one --model), one row per endpoint, in the seed unit")
    return ap


def render(args: argparse.Namespace) -> str:
    """What ``main`` prints for parsed ``args`` (``check_tables`` calls it)."""
    if args.by_endpoint:
        if len(args.dataset or []) != 1 or len(args.model or []) != 1 or args.k:
            raise SystemExit("comparison_table: --by-endpoint takes one --dataset and one --model (and no --k)")
        return endpoint_table(args.tables, args.layer, args.dataset[0], args.model[0], args.endpoint)
    return table(args.tables, args.layer, args.dataset, args.model, args.endpoint, args.k)


def inputs(args: argparse.Namespace) -> list[Path]:
    """The paths a command reads (``check_tables``: a command whose inputs are not in the checkout fails)."""
    return [args.tables]


def main(argv: list[str] | None = None) -> int:
    return print_table(parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
