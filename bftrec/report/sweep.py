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

Raises SystemExit (one line): no such file; no row whose tag sets ``--key``; a tag value that is not a number.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from bftrec.report.runs import command_line

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


def markdown(rows: pd.DataFrame, key: str, metric: str, command: str) -> str:
    def pct(x) -> str:
        return "–" if pd.isna(x) else f"{x * 100:+.1f}%"

    def num(x) -> str:
        return "–" if pd.isna(x) else f"{x:.3g}"

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
    return "\n".join(lines) + "\n"


def figure(rows: pd.DataFrame, key: str, metric: str, path: Path) -> None:
    """Gain against the value, one panel per endpoint, error bars = the seed-unit 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ENDPOINTS), figsize=(4 * len(ENDPOINTS), 3.2), sharey=False)
    for ax, stratum in zip(axes, ENDPOINTS):
        for layer, g in rows[rows["stratum"] == stratum].groupby("layer"):
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
    ap.add_argument("--out", required=True, help="folder for sweep.csv, sweep.md, sweep.png")
    args = ap.parse_args(argv)
    path = Path(args.comparisons)
    if not path.is_file():
        raise SystemExit(f"bftrec-report sweep: --comparisons {path}: no such file; run bftrec-report tables first")
    rows = sweep_rows(pd.read_csv(path), args.key, args.metric)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "sweep.csv", index=False)
    (out / "sweep.md").write_text(markdown(rows, args.key, args.metric, command_line("sweep", argv)))
    figure(rows, args.key, args.metric, out / "sweep.png")
