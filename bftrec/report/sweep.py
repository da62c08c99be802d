"""The gain against a swept setting: one row and one point per value, with seed-unit intervals.

    bftrec-report sweep --comparisons results/snr/tables/comparisons.csv --key dataset.inject_rate \
        --out results/snr/sweep

A sweep's runs differ by one override (the SNR sweep's ``dataset.inject_rate``); ``bftrec-report tables``
keeps each value apart as the cells' ``tag`` (``dataset.inject_rate=0.1``) and tests each layer against
``standard`` within it. This reads that ``comparisons.csv`` and lays the pre-registered endpoints (overall,
Q0 and cold-user ``--metric``) out against the value: the gain (mean of the per-seed gains), its 95%
interval (seeds, then users), ``p_seeds``, ``p_holm_seeds``, the gain detectable at power 0.8 and the seeds
it rests on. Writes ``sweep.csv``, ``sweep.md`` and ``sweep.png`` (gain against the value, one panel per
endpoint, one line per layer) into ``--out``.

**Does the gain grow with the value?** With the seed as the unit: for each seed present at every value, the
least-squares slope of its per-seed gains (``seed_gains``) against the value; then the mean slope over seeds,
its 95% t interval and a one-sample t-test over seeds (``trend.csv``, and a second table in ``sweep.md``).
Within a seed both layers see the same injected data, so a seed's slope is paired by construction.

Raises SystemExit (one line): no such file, or one that is not a ``comparisons.csv``; no row whose tag sets
``--key``; a tag value that is not a number; ``--per`` not positive.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from bftrec.report.cells import pct
from bftrec.report.cells import pval as num
from bftrec.report.runs import command_line
from bftrec.report.stats import seed_t_half, seed_t_p

ENDPOINTS = ("overall", "Q0", "cold")
COLUMNS = ["layer", "value", "stratum", "seeds", "gain_seeds", "ci_lo_seeds", "ci_hi_seeds", "p_seeds",
           "p_holm_seeds", "mde_seeds", "test_note", "flags", "seed_gains"]


def sweep_rows(comp: pd.DataFrame, key: str, metric: str = "HR@10") -> pd.DataFrame:
    """The rows of ``comp`` (a ``comparisons.csv``) whose tag is ``key=<number>``, for the pre-registered
    endpoints of ``metric``, with the number as ``value``; sorted by layer, stratum, value.

    Raises:
        SystemExit: no tag sets ``key``, or a value is not a number (one line each).
    """
    tags = comp["tag"].fillna("").astype(str)
    mine = comp[tags.str.startswith(f"{key}=") & (comp["metric"] == metric) & comp["stratum"].isin(ENDPOINTS)]
    if mine.empty:
        have = sorted({t.split("=")[0] for t in tags if "=" in t})
        raise SystemExit(f"bftrec-report sweep: no {metric} row tagged {key}=<value>; tags set: "
                         f"{', '.join(have) or 'none'} (pass one as --key)")
    values = mine["tag"].astype(str).str[len(key) + 1:]
    try:
        mine = mine.assign(value=values.astype(float))
    except ValueError:
        raise SystemExit(f"bftrec-report sweep: --key {key}: values {sorted(set(values))} are not all numbers; "
                         "a sweep figure needs a numeric setting") from None
    order = {s: i for i, s in enumerate(ENDPOINTS)}
    mine = mine.assign(_o=mine["stratum"].map(order)).sort_values(["layer", "_o", "value"])
    return mine.reindex(columns=COLUMNS).reset_index(drop=True)


def parse_seed_gains(text, keep_nan: bool = False) -> dict[int, float]:
    """``"0:+0.0182 1:nan"`` (a ``comparisons.csv`` ``seed_gains`` cell) -> ``{0: 0.0182}`` (nan dropped; kept as
    ``nan`` with ``keep_nan``, for a table that lists every seed compared), in the cell's order."""
    out = {}
    for part in ("" if pd.isna(text) else str(text)).split():
        seed, _, gain = part.partition(":")
        if gain and (keep_nan or gain != "nan"):
            out[int(seed)] = float(gain)
    return out


def trend(rows: pd.DataFrame) -> pd.DataFrame:
    """Per layer and endpoint: the per-seed slopes of the gain against the value (seeds present at every
    value), their mean, 95% t interval and two-sided one-sample t-test p (``seed_t_p``), and the seeds.
    A slope is in relative gain per unit of the value (×0.1 for "per +0.1"). NaN where fewer than 2 seeds, and
    no trend where a value of the endpoint has no test (``test_note`` n/a: too few seeds or baseline hits)."""
    out = []
    for (layer, stratum), g in rows.groupby(["layer", "stratum"], sort=False):
        by_value = {v: parse_seed_gains(s) for v, s in zip(g["value"], g["seed_gains"])}
        seeds = sorted(set.intersection(*(set(d) for d in by_value.values()))) if by_value else []
        xs = np.array(sorted(by_value))
        untested = g["test_note"].map(lambda note: isinstance(note, str) and note.startswith("n/a")).any()
        if untested:  # a gain without a test at some value gets no trend either
            seeds = []
        slopes = [float(np.polyfit(xs, [by_value[x][s] for x in xs], 1)[0]) for s in seeds] if len(xs) > 1 else []
        mean = float(np.mean(slopes)) if slopes else np.nan
        half = seed_t_half(slopes)
        out.append({"layer": layer, "stratum": stratum, "values": len(xs), "seeds": len(slopes),
                    "slope_per_unit": mean, "ci_lo": mean - half, "ci_hi": mean + half,
                    "p_seeds": seed_t_p(slopes) if len(slopes) >= 2 else None,
                    "seed_slopes": " ".join(f"{s}:{b:+.4f}" for s, b in zip(seeds, slopes))})
    return pd.DataFrame(out)


def markdown(rows: pd.DataFrame, key: str, metric: str, command: str, slopes: pd.DataFrame | None = None,
             per: float = 1.0) -> str:
    lines = [f"# {metric} gain over `standard` against `{key}`", "",
             f"- Made by `{command}` from a `bftrec-report tables` folder's `comparisons.csv`.",
             "- gain: mean of the per-seed relative gains; 95% CI: two-stage bootstrap (seeds, then users); p_seeds: "
             "paired test over seeds; p_Holm: Holm over the three endpoints of one comparison; detectable: the gain "
             "a test over these seeds finds with power 0.8.", "",
             f"| layer | stratum | {key} | seeds | gain | 95% CI | p_seeds | p_Holm | detectable | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        ci = "–" if pd.isna(r.ci_lo_seeds) else f"[{pct(r.ci_lo_seeds)}, {pct(r.ci_hi_seeds)}]"
        note = " ".join(str(x) for x in (r.test_note, r.flags) if not pd.isna(x) and str(x))
        lines.append(f"| {r.layer} | {r.stratum} | {r.value:g} | {r.seeds} | {pct(r.gain_seeds)} | {ci} | "
                     f"{num(r.p_seeds)} | {num(r.p_holm_seeds)} | {pct(r.mde_seeds)} | {note} |")
    if slopes is not None and len(slopes):
        lines += ["", f"## Does the gain grow with `{key}`? (seed-unit trend, `trend.csv`)", "",
                  f"Per seed present at every value, the least-squares slope of its gain against `{key}`; the mean "
                  f"over seeds, its 95% t interval and a one-sample t-test over seeds, per +{per:g} of `{key}`.", "",
                  f"| layer | stratum | values | seeds | gain change per +{per:g} | 95% CI | p_seeds |",
                  "|---|---|---|---|---|---|---|"]
        for r in slopes.itertuples():
            ci = "–" if pd.isna(r.ci_lo) else f"[{pct(r.ci_lo * per)}, {pct(r.ci_hi * per)}]"
            lines.append(f"| {r.layer} | {r.stratum} | {r.values} | {r.seeds} | {pct(r.slope_per_unit * per)} | {ci} "
                         f"| {num(r.p_seeds)} |")
    return "\n".join(lines) + "\n"


def figure(rows: pd.DataFrame, key: str, metric: str, path: Path) -> None:
    """Gain against the value, one panel per endpoint, error bars = the seed-unit 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ENDPOINTS), figsize=(4 * len(ENDPOINTS), 3.2), sharey=False)
    for ax, stratum in zip(axes, ENDPOINTS):
        here = rows[rows["stratum"] == stratum]
        if here["gain_seeds"].isna().all():  # e.g. Q0 with too few hits: say so instead of an empty panel
            note = "; ".join(sorted({str(x) for x in here["test_note"].dropna() if str(x)})) or "no gain defined"
            ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, fontsize=9)
        for layer, g in here.groupby("layer"):
            y = g["gain_seeds"] * 100
            lo = (g["gain_seeds"] - g["ci_lo_seeds"]).fillna(0) * 100
            hi = (g["ci_hi_seeds"] - g["gain_seeds"]).fillna(0) * 100
            ax.errorbar(g["value"], y, yerr=[lo, hi], marker="o", capsize=3, label=layer)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(f"{stratum} {metric}")
        ax.set_xlabel(key)
    axes[0].set_ylabel("gain over standard (%)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-report sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--comparisons", required=True, help="a comparisons.csv written by bftrec-report tables")
    ap.add_argument("--key", required=True, help="the swept override, as the tag names it (dataset.inject_rate)")
    ap.add_argument("--metric", default="HR@10")
    ap.add_argument("--per", type=float, default=1.0, help="show the trend per this step of the value (0.1 for rates)")
    ap.add_argument("--out", required=True, help="folder for sweep.csv, sweep.md, sweep.png")
    args = ap.parse_args(argv)
    path = Path(args.comparisons)
    if not path.is_file():
        raise SystemExit(f"bftrec-report sweep: --comparisons {path}: no such file; run bftrec-report tables first")
    if not args.per > 0:
        raise SystemExit(f"bftrec-report sweep: --per {args.per}: must be > 0 (the step of the value, 0.1 for rates)")
    try:
        comp = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise SystemExit(f"bftrec-report sweep: --comparisons {path}: not a readable CSV ({type(e).__name__}); "
                         "pass the comparisons.csv that bftrec-report tables wrote") from None
    lacking = [c for c in ("tag", "metric", "stratum", *COLUMNS) if c not in comp.columns and c != "value"]
    if lacking:
        raise SystemExit(f"bftrec-report sweep: --comparisons {path} lacks {', '.join(dict.fromkeys(lacking))}; "
                         "pass the comparisons.csv that bftrec-report tables wrote")
    rows = sweep_rows(comp, args.key, args.metric)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "sweep.csv", index=False)
    slopes = trend(rows)
    slopes.to_csv(out / "trend.csv", index=False)
    (out / "sweep.md").write_text(markdown(rows, args.key, args.metric, command_line("sweep", argv), slopes,
                                           args.per))
    figure(rows, args.key, args.metric, out / "sweep.png")
