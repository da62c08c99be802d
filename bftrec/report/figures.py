"""Figures from run directories: values come only from ``metrics.json`` and ``history.csv``, never logs.

    bftrec-report figures --runs results/office_sasrec/runs --out results/office_sasrec/figures

Runs are found, checked (missing cells, duplicates, comparability; ``--grid``, ``--allow-partial``)
and grouped as in ``bftrec-report tables`` (cells of (dataset, model, tag, layer); a tagged BFT
cell is compared with the standard cell of the same tag, else the tag-less one). Writes PNGs whose bytes
do not change on a rerun:

- ``gain_by_bin.png`` / ``gain_by_bin_ndcg.png``: relative gain (%) of every non-standard layer over the
  standard layer in test HR@10 / NDCG@10 with the training seed as the unit — the mean of the per-seed gains
  over the seeds both layers have (``matched_seeds``), its 95% interval as an error bar and
  ``*`` (p_seeds < 0.05) or ``**`` (p_Holm < 0.05 on a pre-registered endpoint), the same numbers as the
  tables' comparisons when the runs have rank tables (else a t interval over seeds), on a symmetric-log
  axis — per stratum
  (item-frequency bins Q0.. of the test target, cold and warm users); one panel per dataset, one bar
  per (backbone, layer). A gain that cannot be computed (the standard layer has no hit) is marked
  "n/a" in a dashed box at 0, never drawn as an empty (+0%) bar.
- ``k_by_bin.png``: mean Kalman gain K of the runs with a mechanism block per stratum, mean ± std over seeds.
- ``training_curves.png``: validation NDCG@10 per epoch, one panel per (dataset, model); thick line =
  mean over seeds on the epochs every seed of the layer reached, faint lines = single seeds.

A figure with nothing to plot (e.g. no BFT runs) is skipped, and the log says which and why. Figures of
a partial run set (``--allow-partial``) or of trial runs (overrides beyond the grid axes) say so in
their title (``run_note``).
"""
from __future__ import annotations

import argparse
import logging
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bftrec.report.runs import baseline, cells, describe_missing, is_counted, run_note, select_runs
from bftrec.report.stats import seed_t_half, seed_t_p
from bftrec.report.tables import _lookup, comparisons, matched_seeds, seed_gain_values

log = logging.getLogger("bftrec.report.figures")
DPI = 120
PANEL = (5.0, 3.6)  # inches per subplot
CURVE_COL = "valid_NDCG@10"


def strata(run: dict, section: str) -> list[tuple[str, dict]]:
    """(name, entry) per stratum of ``run[section]``: item-frequency bins, then cold and warm users."""
    s = run[section]
    return [(b["bin"], b) for b in s["by_item_freq"]] + [("cold", s["cold_users"]), ("warm", s["warm_users"])]


def stats(rs: list[dict], section: str, key: str) -> dict[str, tuple[float, float]]:
    """Per stratum: (mean, std over seeds) of ``key``; NaN where a run has no value."""
    vals: dict[str, list[float]] = {}
    for r in rs:
        for name, entry in strata(r, section):
            v = entry.get(key)
            vals.setdefault(name, []).append(np.nan if v is None else float(v))
    return {n: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0) for n, v in vals.items()}


def tick_labels(run: dict) -> list[str]:
    """Stratum names with their ranges: target-item training count for Q bins, history length for users."""
    labels = [f"{b['bin']}\n{b['lo']}-{b['hi']}" for b in run["test"]["by_item_freq"]]
    cold = run["test"]["cold_users"].get("max_history")
    return labels + ([f"cold\n≤{cold}", f"warm\n>{cold}"] if cold is not None else ["cold", "warm"])


def name(model: str, tag: str, layer: str | None = None) -> str:
    return model + (f" {layer}" if layer not in (None, "standard") else "") + (f" [{tag}]" if tag else "")


def palette(labels) -> dict[str, str]:
    return {lab: f"C{i % 10}" for i, lab in enumerate(sorted(set(labels)))}


def grid(n: int) -> tuple[Figure, list]:
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(PANEL[0] * ncols, PANEL[1] * nrows), dpi=DPI, layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def strata_axis(ax, ticks: list[str]) -> None:
    ax.set_xticks(range(len(ticks)), ticks, fontsize=8)
    ax.axvline(len(ticks) - 2.5, color="grey", ls=":", lw=0.8)  # item bins | user groups
    ax.grid(axis="y", alpha=0.3)


def legend(ax, n: int, below: bool = True) -> None:
    """Below the strata ticks (bars fill the panel), inside for curves; to the right for many series."""
    if n > 4:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif below:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(n, 2), frameon=False)
    else:
        ax.legend(fontsize=8)


def save(fig: Figure, path: Path, note: str = "") -> Figure:
    """Write the PNG (no timestamp metadata); ``note`` (partial or trial runs) becomes the title."""
    if note:
        fig.suptitle(note, color="firebrick", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    log.info("wrote %s", path)
    return fig


def seed_unit_bar(rs: list[dict], base: list[dict], stratum: str, metric: str, row: dict | None) -> tuple:
    """(gain %, lo %, hi %, mark) of one bar, the training seed as the unit: from the table's comparison row
    (``comparisons``: mean per-seed gain, its seed-and-user interval, ``*`` for p_seeds < 0.05 and
    ``**`` for p_Holm < 0.05 on a pre-registered endpoint) when given, else from metrics.json alone (mean
    per-seed gain and a t interval over seeds, ``*`` for p_seeds < 0.05). NaN where undefined."""
    if row is not None:
        g, lo, hi = (row.get(k) for k in ("gain_seeds", "ci_lo_seeds", "ci_hi_seeds"))
        p, ph = row.get("p_seeds"), row.get("p_holm_seeds")
    else:
        where = next((i for i, b in enumerate(rs[0]["test"]["by_item_freq"]) if b["bin"] == stratum),
                     {"cold": "cold_users", "warm": "warm_users"}.get(stratum, stratum))
        gains = [x for _, x in seed_gain_values(rs, base, where, metric)]
        ok = bool(gains) and all(x is not None and np.isfinite(x) for x in gains)
        g = float(np.mean(gains)) if ok else None
        lo = hi = None
        if ok and len(gains) > 1:
            half = seed_t_half(gains)
            lo, hi = g - half, g + half
        p, ph = (seed_t_p(gains) if ok else None), None
    def num(x):
        return np.nan if x is None or pd.isna(x) else 100 * float(x)
    mark = "**" if ph is not None and not pd.isna(ph) and ph < 0.05 else (
        "*" if p is not None and not pd.isna(p) and p < 0.05 else "")
    return num(g), num(lo), num(hi), mark


def gain_figure(groups: dict, metric: str, path: Path, note: str = "", comp: pd.DataFrame | None = None
                ) -> Figure | None:
    """Per dataset, the gain (%) of every non-standard layer over standard in each stratum, the training seed
    as the unit (``seed_unit_bar``), with its 95% interval as an error bar and ``*``/``**`` for significance;
    a symmetric-log axis (linear within ±10%), so that a tiny stratum's +800% leaves the others readable."""
    look = _lookup(comp) if comp is not None else {}
    panels: dict[str, list] = {}
    for key, rs in sorted(groups.items()):
        ds, model, tag, layer = key
        base = baseline(groups, key) if layer != "standard" else None
        if base:
            rs, base = matched_seeds(rs, base)  # seed s against seed s, as in the tables
            names = [n for n, _ in strata(rs[0], "test")]
            bars = {n: seed_unit_bar(rs, base, n, metric, look.get(key + (n, metric))) for n in names}
            panels.setdefault(ds, []).append((name(model, tag, layer), bars, rs[0], f"{len(rs)} vs {len(base)} seeds"))
    if not panels:
        log.info("skipped %s: no (dataset, model) with both standard and another layer", path.name)
        return None
    colors = palette(series[0] for ss in panels.values() for series in ss)
    fig, axes = grid(len(panels))
    for ax, (ds, series) in zip(axes, panels.items()):
        names = list(series[0][1])
        width = 0.8 / len(series)
        for i, (lab, bars, _, seeds) in enumerate(series):
            x = np.arange(len(names)) + (i - (len(series) - 1) / 2) * width
            vals, lo, hi, marks = (np.array(v, dtype=object if j == 3 else float)
                                   for j, v in enumerate(zip(*[bars[n] for n in names])))
            ax.bar(x, vals, width, label=f"{lab} ({seeds})", color=colors[lab])
            err = ~np.isnan(lo) & ~np.isnan(vals)
            if err.any():
                ax.errorbar(x[err], vals[err], yerr=[vals[err] - lo[err], hi[err] - vals[err]], fmt="none",
                            ecolor="black", elinewidth=0.7, capsize=2)
            for xi, v, h, m in zip(x, vals, np.where(np.isnan(hi), vals, hi), marks):
                if m and not np.isnan(v):
                    ax.text(xi, max(v, h, 0), m, ha="center", va="bottom", fontsize=7)
            for xi in x[np.isnan(vals)]:  # undefined gain: a marked gap, not a bar of height 0
                ax.text(xi, 0, "n/a", ha="center", va="bottom", rotation=90, fontsize=6, color=colors[lab],
                        bbox={"boxstyle": "square,pad=0.2", "fc": "white", "ec": colors[lab], "ls": "--", "lw": 0.6})
        ax.axhline(0, color="black", lw=0.8)
        ax.set_yscale("symlog", linthresh=10)
        strata_axis(ax, tick_labels(series[0][2]))
        ax.set_title(ds)
        ax.set_ylabel(f"gain over standard in {metric} (%)")
        legend(ax, len(series))
    caption = ("bars: 95% CI with the training seed as the unit; * p_seeds < 0.05; ** p_Holm < 0.05 "
               "(pre-registered endpoints); symmetric-log axis, linear within ±10%")
    fig.supxlabel(textwrap.fill(caption, width=int(fig.get_figwidth() * 17)),  # about 17 characters per inch at 7 pt
                  fontsize=7, color="dimgray")  # placed by the figure's layout, below the panels
    return save(fig, path, note)


def k_figure(groups: dict, path: Path, note: str = "") -> Figure | None:
    panels: dict[str, list] = {}
    for (ds, model, tag, layer), rs in sorted(groups.items()):
        rs = [r for r in rs if "mechanism" in r]
        if rs:
            panels.setdefault(ds, []).append((f"{name(model, tag, layer)} ({len(rs)} seeds)",
                                              stats(rs, "mechanism", "K"), rs[0]))
    if not panels:
        log.info("skipped %s: no bft runs with a mechanism section", path.name)
        return None
    colors = palette(lab for series in panels.values() for lab, _, _ in series)
    fig, axes = grid(len(panels))
    for ax, (ds, series) in zip(axes, panels.items()):
        for lab, st, _ in series:
            mean, std = zip(*st.values())
            ax.errorbar(range(len(st)), mean, yerr=std, ls="none", marker="o", ms=4, capsize=3, label=lab,
                        color=colors[lab])
            ax.plot(range(len(st) - 2), mean[:-2], color=colors[lab])  # connect the item bins only
        strata_axis(ax, tick_labels(series[0][2]))
        ax.set_title(ds)
        ax.set_ylabel("mean Kalman gain K")
        legend(ax, len(series))
    return save(fig, path, note)


def history(run: dict) -> pd.Series | None:
    p = run["_ranks"].with_name("history.csv")
    if not p.exists():
        log.info("no history.csv in %s", p.parent)
        return None
    h = pd.read_csv(p)
    if CURVE_COL not in h:
        return None
    # epochs without validation (trainer.eval_every > 1) have no value: drop them, do not break the line
    return h.drop_duplicates("epoch", keep="last").set_index("epoch")[CURVE_COL].dropna()


def curves_figure(groups: dict, path: Path, note: str = "") -> Figure | None:
    panels: dict[tuple, list] = {}
    standard_first = lambda kv: (kv[0][:3], kv[0][3] != "standard", kv[0][3])  # noqa: E731
    for (ds, model, tag, layer), rs in sorted(groups.items(), key=standard_first):
        if is_counted(rs[0]):  # pop, markov: one validation, no training curve
            continue
        hs = [h for r in sorted(rs, key=lambda r: r["seed"]) if (h := history(r)) is not None]
        if hs:
            panels.setdefault((ds, model), []).append((layer + (f" [{tag}]" if tag else ""), hs))
    if not panels:
        log.info("skipped %s: no run has a history.csv with %s", path.name, CURVE_COL)
        return None
    fig, axes = grid(len(panels))
    for ax, ((ds, model), series) in zip(axes, panels.items()):
        for i, (lab, hs) in enumerate(series):
            for h in hs:
                ax.plot(h.index, h.to_numpy(), color=f"C{i % 10}", lw=0.7, alpha=0.3)
            mean = pd.concat(hs, axis=1, join="inner").mean(axis=1)
            ax.plot(mean.index, mean.to_numpy(), color=f"C{i % 10}", lw=1.8, label=f"{lab} ({len(hs)} seeds)",
                    marker="." if len(mean) < 3 else None)  # a one-epoch curve is still visible
        ax.set_title(f"{ds} / {model}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("valid NDCG@10")
        ax.grid(alpha=0.3)
        legend(ax, len(series), below=False)
    return save(fig, path, note)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-report figures", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True,
                    help="folder(s) searched for metrics.json; several: their union")
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    ap.add_argument("--grid", type=Path, action="append",
                    help="grid config whose cells are expected (configs/experiment/paper/*.yaml); repeat for a union")
    ap.add_argument("--allow-partial", action="store_true", help="draw despite missing cells")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        runs, missing, _ = select_runs(args.runs, args.grid, args.allow_partial, prog="bftrec-report figures")
    except SystemExit as e:
        raise SystemExit(str(e).replace("bftrec-report:", "bftrec-report figures:")) from None
    if missing:
        log.warning("partial: %d cells missing (%s)", len(missing), "; ".join(describe_missing(missing)))
    groups = cells(runs)
    note = run_note(runs, missing)
    ranked = all(r["_ranks"].exists() for rs in groups.values() for r in rs)
    comp = comparisons(groups) if ranked else None  # the tables' seed-unit rows, when ranks exist
    gain_figure(groups, "HR@10", args.out / "gain_by_bin.png", note, comp)
    gain_figure(groups, "NDCG@10", args.out / "gain_by_bin_ndcg.png", note, comp)
    k_figure(groups, args.out / "k_by_bin.png", note)
    curves_figure(groups, args.out / "training_curves.png", note)


if __name__ == "__main__":
    main()
