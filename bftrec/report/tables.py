"""Tables from run directories: numbers come only from ``metrics.json`` and ``ranks.csv.gz``, never logs.

``config.yaml``, ``env.json`` and ``.hydra/overrides.yaml`` are read too, for the comparability check,
the cell names and the header.

    bftrec-report tables --runs results/office_sasrec/runs --out results/office_sasrec/tables
    bftrec-report tables --runs results/paper_cpu/runs --grid configs/experiment/paper/cpu.yaml \
        --out results/paper_cpu/tables

``--runs`` is any folder: one run directory, a Hydra multirun folder (any sweep) or a grid's ``runs/``;
give several (``--runs a b``, or a shell glob) to table a chosen subset of a folder, e.g. the seeds of one
tuned config without the one-seed tuning runs beside them.
Runs of one (dataset, model, tag, layer, seed) cell launched with different command-line overrides
(a sweep over ``trainer.lr``) are told apart by those overrides, which then act as their tag.

Missing cells are never papered over: with ``--grid`` the expected cells are the grid config's
``hydra.sweeper.params`` (dataset x model x layer x seed); without it, every (dataset, model, tag,
layer) found is expected for every seed found, and, when the folder holds standard runs at all, an
untagged non-standard cell expects its standard twin. A missing cell stops the script with the list
(``--allow-partial`` writes the tables anyway and lists the missing cells in every header). Runs
outside ``--grid`` are left out and named in the header. Always an error: two runs of one cell, and
runs compared with each other (seeds of a cell; a layer and its standard baseline) whose protocol or
config differ beyond the layer (across layers only), seed and tag. A key missing from one run's
config (an older run) counts as the key's current default (``default_config``), after the legacy
rules of ``normalise_config``.

Writes ``overall``, ``strata``, ``mechanism`` and ``summary`` tables as markdown and csv (and, where the runs hold
a counted model beside others, ``floor``: every model's standard layer side by side by stratum,
``bftrec.report.floor``), and
``comparisons.csv`` (one numeric row per comparison, metric and stratum). A cell groups runs by
(dataset, model, tag, layer); values are mean ± std over seeds. EVERY non-standard layer is compared
with the standard layer of the same (dataset, model) and tag, else the untagged one, side by side in
one row, over the seeds both have (``matched_seeds``). The training seed is the unit of replication
(``comparisons``): the mean of the per-seed relative gains, a t-test over them, Holm over three
pre-registered endpoints, and a 95% interval whose standard error adds retraining and test-user noise
(``bftrec.report.stats``); the per-user Wilcoxon test at fixed seeds stays as the secondary
``*_fixed_seeds`` columns. Every table opens with a short header; ``protocol.md`` beside it holds the
protocol, commits, hardware and dates of the runs and what the statistics are.
"""
from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import wilcoxon

from bftrec.report.beyond import beyond_table, beyond_tests
from bftrec.report.cells import fmt, pct, pval
from bftrec.report.floor import floor_note, floor_table
from bftrec.report.runs import (
    METRICS,
    STANDARD,
    baseline,
    cells,
    command_line,
    grid_drift,
    header,
    layers_of,
    own_values_note,
    preregistration_notes,
    run_note,
    select_runs,
    strata_of,
    stratum_value,
    trial_overrides,
)
from bftrec.report.stats import (
    MIN_BASELINE_HITS,
    MIN_SEEDS,
    interval_se,
    mde_seeds,
    random_effects,
    seed_t_p,
    seed_user_ci,
)

log = logging.getLogger("bftrec.report.tables")


# ---------------------------------------------------------------------------------------------
# paired statistics over users
# ---------------------------------------------------------------------------------------------
@functools.cache
def rank_table(path: Path) -> pd.DataFrame:
    """A run's ranks.csv.gz, read once (every stratum, metric and comparison reuses it; do not mutate)."""
    return pd.read_csv(path)


BOOT_B, BOOT_SEED, BOOT_LEVEL = 1000, 0, 0.95  # bootstrap resamples, generator seed, interval level


def per_user(run: dict, metric: str) -> pd.Series:
    """Per-user 0/1 hit or NDCG at 10 from the run's rank table, indexed by user."""
    r = rank_table(run["_ranks"])
    k = int(metric.split("@")[1])
    val = (r["rank"] <= k).astype(float)
    if metric.startswith("NDCG"):
        val = val / np.log2(r["rank"] + 1)
    return pd.Series(val.to_numpy(), index=r["user"].to_numpy())


def matched_seeds(runs_a: list[dict], runs_b: list[dict]) -> tuple[list[dict], list[dict]]:
    """The runs of each side at the seeds both sides have; all runs when they share none.

    A comparison pairs seed s of a layer with seed s of its baseline. With unequal seed sets (a
    partial grid: ``bft_h`` at seed 0 against ``standard`` at seeds 0 and 1) the gain would set one
    seed against a mean of two, and the per-user test would see seed noise on one side only.
    """
    common = {r["seed"] for r in runs_a} & {r["seed"] for r in runs_b}
    if not common:
        logging.warning("%s/%s %s vs %s share no seed (%s vs %s): compared over all seeds of each side",
                        runs_a[0]["dataset"], runs_a[0]["model"], runs_a[0]["layer"], runs_b[0]["layer"],
                        sorted({r["seed"] for r in runs_a}), sorted({r["seed"] for r in runs_b}))
        return runs_a, runs_b
    return [r for r in runs_a if r["seed"] in common], [r for r in runs_b if r["seed"] in common]


@functools.cache
def _seed_mean(ranks: tuple[Path, ...], metric: str) -> pd.Series:
    """Per-user metric averaged over the runs whose rank tables are ``ranks`` (do not mutate)."""
    return pd.concat([per_user({"_ranks": p}, metric) for p in ranks], axis=1).mean(axis=1)


def paired_users(runs_a: list[dict], runs_b: list[dict], metric: str, users=None) -> tuple[np.ndarray, np.ndarray]:
    """(a, b): (n,) float64 per-user metric averaged over the seeds of each side that the other side
    has too (``matched_seeds``), on the users both sides scored (restricted to ``users`` when given),
    in user order."""
    runs_a, runs_b = matched_seeds(runs_a, runs_b)
    a = _seed_mean(tuple(r["_ranks"] for r in runs_a), metric)
    b = _seed_mean(tuple(r["_ranks"] for r in runs_b), metric)
    a, b = a.align(b, join="inner")
    if users is not None:
        a, b = a[a.index.isin(users)], b[b.index.isin(users)]
    return a.to_numpy(), b.to_numpy()


def paired_p(runs_a: list[dict], runs_b: list[dict], metric: str, users=None) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value over users of seed-averaged per-user metrics (None if undefined)."""
    return wilcoxon_p(*paired_users(runs_a, runs_b, metric, users))


def wilcoxon_p(a: np.ndarray, b: np.ndarray) -> float | None:
    if len(a) == 0 or np.all(a == b):
        return None
    return float(wilcoxon(a, b).pvalue)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (Holm 1979, Scand. J. Statist. 6:65-70), same order.

    With the m defined p-values sorted ascending, p_(i) becomes max over j <= i of
    min(1, (m - j + 1) p_(j)); rejecting where the adjusted p < α controls the family-wise error
    rate at α. None (no test) stays None and is not counted in m.
    """
    defined = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[float | None] = [None] * len(pvalues)
    running, m = 0.0, len(defined)
    for j, (p, i) in enumerate(defined):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


def _weight_chunks(n: int, n_boot: int, seed: int):
    """Bootstrap resamples of n users as (chunk, n) float64 counts (how often each user is drawn),
    drawn by ``np.random.default_rng(seed)`` in chunks of bounded memory."""
    rng = np.random.default_rng(seed)
    step = max(1, min(n_boot, 4_000_000 // n))
    for lo in range(0, n_boot, step):
        m = min(step, n_boot - lo)
        idx = rng.integers(0, n, size=(m, n))  # (m, n) drawn user positions
        flat = (np.arange(m)[:, None] * n + idx).ravel()
        yield np.bincount(flat, minlength=m * n).reshape(m, n).astype(np.float64)


@functools.lru_cache(maxsize=8)
def _cached_weights(n: int, n_boot: int, seed: int) -> tuple:
    """The same resamples for every comparison on n users (a stratum of one dataset)."""
    return tuple(_weight_chunks(n, n_boot, seed))


def bootstrap_gain_ci(a: np.ndarray, b: np.ndarray, n_boot: int = BOOT_B, seed: int = BOOT_SEED,
                      level: float = BOOT_LEVEL) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the relative gain (mean a - mean b) / mean b.

    Users are resampled with replacement, pairs kept together, ``n_boot`` times with
    ``np.random.default_rng(seed)``. a, b: (n,) float per-user metrics (seed-averaged). A resample
    whose mean b is 0 counts as gain +inf (0 where mean a is 0 too). None when n = 0 or mean b = 0.
    """
    n = len(a)
    if n == 0 or not b.mean():
        return None
    ab = np.stack([a, b], axis=1).astype(np.float64)  # (n, 2)
    chunks = _cached_weights(n, n_boot, seed) if n * n_boot <= 6_000_000 else _weight_chunks(n, n_boot, seed)
    sums = np.concatenate([w @ ab for w in chunks])  # (n_boot, 2): resampled sums of a, b
    sa, sb = sums[:, 0], sums[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = np.where(sb > 0, (sa - sb) / np.where(sb > 0, sb, 1), np.where(sa > 0, np.inf, 0))
    lo_q, hi_q = np.quantile(gains, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")  # no inf - inf
    return float(lo_q), float(hi_q)


def stratum_users(run: dict, where) -> np.ndarray | None:
    """Users of a stratum from the run's rank table (None: all users)."""
    if where == "overall":
        return None
    r = rank_table(run["_ranks"])
    if isinstance(where, int):
        b = run["test"]["by_item_freq"][where]
        if b["lo"] is None:
            return np.array([], dtype=np.int64)
        return r["user"][(r["target_count"] >= b["lo"]) & (r["target_count"] <= b["hi"])].to_numpy()
    thr = run["test"]["cold_users"]["max_history"]
    sel = r["history_len"] <= thr if where == "cold_users" else r["history_len"] > thr
    return r["user"][sel].to_numpy()


def relative_gain(vals: list, base: list) -> float | None:
    b = np.mean([x for x in base if x is not None])
    return float((np.mean([x for x in vals if x is not None]) - b) / b) if b else None


def seed_gain_values(runs: list[dict], base: list[dict], where, metric: str) -> list[tuple[int, float | None]]:
    """``[(seed, gain), ...]``: the relative gain of each seed that both sides have, seed by seed (None
    where the baseline seed has no hit); empty when they share no seed."""
    by_seed = {r["seed"]: r for r in base}
    return [(r["seed"], relative_gain([stratum_value(r, where, metric)],
                                      [stratum_value(by_seed[r["seed"]], where, metric)]))
            for r in sorted(runs, key=lambda r: r["seed"]) if r["seed"] in by_seed]


def seed_gains(values: list[tuple[int, float | None]]) -> str:
    """``"0:+0.0182 1:+0.0306"``: ``seed_gain_values``' pairs as text (``nan`` where the baseline seed
    has no hit); empty when they share no seed."""
    return " ".join(f"{s}:{'nan' if g is None else format(g, '+.4f')}" for s, g in values)


def same_sign(gain: float | None, gains: list[float | None]) -> bool | None:
    """Whether every matched seed's gain (``seed_gain_values``' numbers, not their 4-decimal text) is
    defined and has the sign of the pooled ``gain`` (an exact zero counts as no sign); None with fewer than
    two seeds or no pooled gain. A seed-level check that the per-user test cannot make: it sees users at
    fixed training seeds, not retrainings."""
    if gain is None or pd.isna(gain) or len(gains) < 2:
        return None
    return all(g is not None and not np.isnan(g) and np.sign(g) == np.sign(gain) != 0 for g in gains)


ENDPOINTS = ("overall", "Q0", "cold")  # the pre-registered endpoints, in HR@10 (issue 46 item 1)
TOO_FEW_SEEDS, TOO_FEW_HITS = "n/a (too few seeds)", "n/a (too few hits)"


def seed_user_pairs(runs: list[dict], base: list[dict], users) -> tuple[list, list[int]]:
    """Per seed both sides have: (a, b), each (n, 2) float64 per-user HR@10 and NDCG@10 of the layer and of
    its baseline at that seed, on the users every one of these runs scored (restricted to ``users`` when
    given), in user order: paired across layers and across seeds (``seed_user_ci``); and the seeds, in order."""
    by_seed = {r["seed"]: r for r in base}
    mine = [r for r in sorted(runs, key=lambda r: r["seed"]) if r["seed"] in by_seed]
    frames = [(pd.concat([per_user(r, m) for m in METRICS], axis=1),
               pd.concat([per_user(by_seed[r["seed"]], m) for m in METRICS], axis=1)) for r in mine]
    common = None
    for a, b in frames:
        idx = a.index.intersection(b.index)
        common = idx if common is None else common.intersection(idx)
    if common is not None and users is not None:
        common = common[common.isin(users)]
    pairs = [(a.loc[common].to_numpy(dtype=np.float64), b.loc[common].to_numpy(dtype=np.float64)) for a, b in frames]
    return pairs, [r["seed"] for r in mine]


def baseline_hits(base: list[dict], where) -> float:
    """Mean over the baseline's seeds of its HR@10 hits in the stratum (n_users x HR@10)."""
    return float(np.mean([stratum_value(r, where, "HR@10") * stratum_value(r, where, "n_users") for r in base]))


def cell_flags(runs: list[dict]) -> str:
    """What makes a comparison a trial or cut short, for the table body: ``TRIAL: <override>`` for
    command-line overrides beyond the grid axes (``trial_overrides``: ``trainer.amp`` and an override equal to
    today's grid config of the cell aside), and
    ``capped: <layer> s<seed> (best e of E)`` for a run that ran to its epoch cap (not stopped early)
    with its best validation epoch among its last two: validation still rose when the cap stopped it."""
    extra = sorted({o.split(" (")[0] for o in trial_overrides(runs)})
    flags = [f"TRIAL: {'; '.join(extra)}"] if extra else []
    capped = [f"{r['layer']} s{r['seed']} (best {r['best_epoch']} of {r['epochs_run']})" for r in runs
              if r.get("stopped_early") is False and r.get("best_epoch") is not None
              and r.get("epochs_run") is not None and r["best_epoch"] >= r["epochs_run"] - 1]
    if capped:
        flags.append("capped while validation rose: " + ", ".join(sorted(capped)))
    return "; ".join(flags)


def comparisons(groups: dict) -> pd.DataFrame:
    """One row per (non-standard cell with a baseline, stratum, metric), over the seeds both cells have
    (``matched_seeds``). The training seed is the unit of replication:

    - gain_seeds: the mean of the per-seed relative gains (seed_gains, ``seed:gain`` pairs); sd_seeds their
      SD; p_seeds: two-sided one-sample t-test of those gains (``bftrec.report.stats.seed_t_p``): do the
      retrainings agree on this test set; ci_lo_seeds, ci_hi_seeds: 95% interval of gain_seeds whose standard
      error (se_seeds) adds retraining and test-user sampling (``seed_user_ci``: a user bootstrap shared by
      all seeds); mde_seeds: the gain the t-test detects at power 0.8, α 0.05, from the seed SD (``mde_seeds``);
    - endpoint: ``pre-registered`` for HR@10 overall, on the rarest item bin (Q0) and on cold users, else
      ``exploratory``; p_holm_seeds: Holm over the three pre-registered rows of the comparison (an untestable
      endpoint enters the family as p = 1), blank on exploratory rows;
    - test_note: ``n/a (too few seeds)`` (fewer than 2) or ``n/a (too few hits)`` (the baseline has under 20
      HR@10 hits in the stratum, seed mean): then no p value at all; flags: ``cell_flags``;
    - fixed seeds (secondary): p_fixed_seeds, a Wilcoxon signed-rank test over users of the per-user metric
      averaged over seeds; p_holm_fixed_seeds, Holm over all rows of one layer, metric and stratum;
      ci_lo_fixed_seeds, ci_hi_fixed_seeds, a bootstrap over users of the gain of the seed means (gain).
      It sees users at fixed training seeds, not retrainings.
    """
    rows = []
    for key, rs_all in sorted(groups.items()):
        base = baseline(groups, key) if key[3] != STANDARD else None
        if not base:
            continue
        rs, base = matched_seeds(rs_all, base)
        flags = cell_flags(rs + base)
        for name, where, _ in strata_of(rs[0]):
            users = stratum_users(rs[0], where)
            pairs, seeds = seed_user_pairs(rs, base, users)
            cis = seed_user_ci(pairs) if pairs else [None] * len(METRICS)
            hits = baseline_hits(base, where)
            note = TOO_FEW_SEEDS if len(seeds) < MIN_SEEDS else TOO_FEW_HITS if hits < MIN_BASELINE_HITS else ""
            for j, m in enumerate(METRICS):
                a, b = paired_users(rs, base, m, users)
                ci = bootstrap_gain_ci(a, b)
                per_seed = seed_gain_values(rs, base, where, m)
                g = [x for _, x in per_seed]
                defined = bool(g) and all(x is not None and np.isfinite(x) for x in g)
                gain = relative_gain([stratum_value(r, where, m) for r in rs],
                                     [stratum_value(r, where, m) for r in base])
                ci_s = cis[j] if not note else None
                rows.append({
                    "dataset": key[0], "model": key[1], "tag": key[2], "layer": key[3], "stratum": name, "metric": m,
                    "endpoint": "pre-registered" if m == "HR@10" and name in ENDPOINTS else "exploratory",
                    "flags": flags, "seeds": len(rs), "baseline_seeds": len(base), "n_users": len(a),
                    "baseline_hits": round(hits, 1), "gain": gain,
                    "gain_seeds": float(np.mean(g)) if defined else None,
                    "sd_seeds": float(np.std(g, ddof=1)) if defined and len(g) > 1 else None,
                    "seed_gains": seed_gains(per_seed), "seeds_same_sign": same_sign(gain, g),
                    "p_seeds": None if note else seed_t_p(g), "p_holm_seeds": None,
                    "ci_lo_seeds": ci_s[0] if ci_s else None, "ci_hi_seeds": ci_s[1] if ci_s else None,
                    "se_seeds": interval_se(ci_s, len(seeds)),
                    "mde_seeds": mde_seeds(g) if defined else None, "test_note": note,
                    "p_fixed_seeds": None if note == TOO_FEW_HITS else wilcoxon_p(a, b), "p_holm_fixed_seeds": None,
                    "ci_lo_fixed_seeds": ci[0] if ci else None, "ci_hi_fixed_seeds": ci[1] if ci else None})
    df = pd.DataFrame(rows)
    if len(df):
        df["p_holm_fixed_seeds"] = df["p_holm_fixed_seeds"].astype(object)
        for _, idx in df.groupby(["layer", "metric", "stratum"], sort=False).groups.items():
            df.loc[idx, "p_holm_fixed_seeds"] = holm([None if pd.isna(p) else p for p in df.loc[idx, "p_fixed_seeds"]])
        holm_seeds(df)
    return df


def holm_seeds(df: pd.DataFrame) -> None:
    """Fill ``p_holm_seeds`` in place: Holm over the pre-registered rows of each comparison (dataset,
    model, tag, layer), a family of ``len(ENDPOINTS)`` always: an endpoint without a p value (too few
    seeds or hits, or absent) enters as p = 1, so that it never makes the others' adjustment milder.
    Exploratory rows and rows without a p value stay blank."""
    df["p_holm_seeds"] = None
    df["p_holm_seeds"] = df["p_holm_seeds"].astype(object)
    pre = df[df["endpoint"] == "pre-registered"]
    for _, idx in pre.groupby(["dataset", "model", "tag", "layer"], sort=False).groups.items():
        ps = [1.0 if pd.isna(p) else float(p) for p in df.loc[idx, "p_seeds"]]
        adj = holm(ps + [1.0] * (len(ENDPOINTS) - len(ps)))[:len(ps)]
        df.loc[idx, "p_holm_seeds"] = [None if pd.isna(p) else a for p, a in zip(df.loc[idx, "p_seeds"], adj)]


def _num(x) -> bool:
    return x is not None and not pd.isna(x)


def gain_cell(c: dict | None) -> str:
    """``+4.1% (p_seeds, p_Holm_seeds, [lo, hi])`` with the seed as the unit (``comparisons``): the mean
    per-seed gain, its t-test over seeds, Holm over the three pre-registered endpoints (``–`` on an
    exploratory row) and the 95% interval (retraining and test-user noise); ``+4.1%, n/a (too few seeds)``
    where there is no information for a test. Empty when there is no comparison."""
    if c is None:
        return ""
    g = c["gain_seeds"] if _num(c["gain_seeds"]) else None  # never the gain of the means in its place
    if c["test_note"]:
        return f"{pct(g)}, {c['test_note']}"
    ci = f"[{pct(c['ci_lo_seeds'])}, {pct(c['ci_hi_seeds'])}]" if _num(c["ci_lo_seeds"]) else "–"
    return f"{pct(g)} ({pval(c['p_seeds'])}, {pval(c['p_holm_seeds'])}, {ci})"


def gain_col(metric: str, layer: str, stratum: str = "") -> str:
    return f"{stratum + ' ' if stratum else ''}{metric} gain {layer} (p_seeds, p_Holm, 95% CI)"


def row_flags(look: dict, k3: tuple, layers: list[str]) -> str:
    """The flags (``cell_flags``) of a row's comparisons, by layer when they differ."""
    found = {layer: look[k3 + (layer, "overall", "HR@10")]["flags"] for layer in layers
             if k3 + (layer, "overall", "HR@10") in look}
    found = {k: v for k, v in found.items() if isinstance(v, str) and v}
    return "; ".join(sorted(set(found.values())))


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------
def fmt_epochs(epochs: list[int]) -> str:
    return f"{epochs[0]} (1 seed)" if len(epochs) == 1 else fmt(epochs, digits=1)


def row_keys(groups: dict) -> list[tuple]:
    return sorted({k[:3] for k in groups})


def _lookup(comp: pd.DataFrame) -> dict:
    if not len(comp):
        return {}
    return {tuple(r[k] for k in ("dataset", "model", "tag", "layer", "stratum", "metric")): r
            for r in comp.to_dict("records")}


def _seeds(groups: dict, key3: tuple, layers: list[str]) -> str:
    n = {layer: len(groups[key3 + (layer,)]) for layer in [STANDARD] + layers if key3 + (layer,) in groups}
    return str(next(iter(n.values()))) if len(set(n.values())) == 1 else ", ".join(f"{k} {v}" for k, v in n.items())


def overall_table(groups: dict, comp: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, tag); per metric the standard layer, then each other layer with
    its gain cell; then validation NDCG@10 and best epoch per layer."""
    layers, look = layers_of(groups), _lookup(comp)
    rows = []
    for k3 in row_keys(groups):
        row = {"dataset": k3[0], "model": k3[1], "tag": k3[2], "seeds": _seeds(groups, k3, layers)}
        for m in METRICS:
            for layer in [STANDARD] + layers:
                rs = groups.get(k3 + (layer,))
                row[f"{m} {layer}"] = fmt([r["test"]["overall"][m] for r in rs]) if rs else "–"
                if layer != STANDARD:
                    row[gain_col(m, layer)] = gain_cell(look.get(k3 + (layer, "overall", m)))
        for layer in [STANDARD] + layers:
            rs = groups.get(k3 + (layer,))
            # a bftrec-eval re-score has no validation block; its best epoch is the checkpoint's
            row[f"valid NDCG@10 {layer}"] = fmt([(r.get("valid") or {}).get("NDCG@10") for r in rs]) if rs else "–"
            epochs = [r.get("best_epoch") for r in rs or [] if r.get("best_epoch") is not None]
            row[f"best epoch {layer}"] = fmt_epochs(epochs) if epochs else "–"
        row["flags"] = row_flags(look, k3, layers)
        rows.append(row)
    return pd.DataFrame(rows)


def strata_table(groups: dict, comp: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, tag, stratum): the item-frequency bins of the test target, cold and
    warm users; per metric the standard layer, then each other layer with its gain cell."""
    layers, look = layers_of(groups), _lookup(comp)
    rows = []
    for k3 in row_keys(groups):
        first = next(groups[k3 + (layer,)] for layer in [STANDARD] + layers if k3 + (layer,) in groups)[0]
        for name, where, rng in strata_of(first)[1:]:
            row = {"dataset": k3[0], "model": k3[1], "tag": k3[2], "stratum": name, "range": rng,
                   "users": stratum_value(first, where, "n_users")}
            for m in METRICS:
                for layer in [STANDARD] + layers:
                    rs = groups.get(k3 + (layer,))
                    row[f"{m} {layer}"] = fmt([stratum_value(r, where, m) for r in rs]) if rs else "–"
                    if layer != STANDARD:
                        row[gain_col(m, layer)] = gain_cell(look.get(k3 + (layer, name, m)))
            row["flags"] = row_flags(look, k3, layers)
            rows.append(row)
    return pd.DataFrame(rows)


def _mech_rows(run: dict) -> list[tuple[str, str, str, object]]:
    """(grouping, stratum, range, getter) of the mechanism table's rows for a run like ``run``: at the
    target (when the run has ``at_target``), by history token, then per block. ``getter(metrics)`` ->
    the entry (a dict with K, lam0) or None where a run lacks that grouping."""
    mech = run["mechanism"]
    rows = []
    if "at_target" in mech:
        at = lambda m: m.get("at_target")  # noqa: E731
        rows.append(("at target", "overall", "", lambda m, at=at: at(m) and at(m)["overall"]))
        rows += [("at target", b["bin"], f"{b['lo']}-{b['hi']}",
                  lambda m, i=i, at=at: at(m) and at(m)["by_target_freq"][i])
                 for i, b in enumerate(mech["at_target"]["by_target_freq"])]
        rows += [("at target", n, "", lambda m, k=k, at=at: at(m) and at(m)[k])
                 for n, k in (("cold", "cold_users"), ("warm", "warm_users"))]
    rows += [("history tokens", b["bin"], f"{b['lo']}-{b['hi']}", lambda m, i=i: m["by_item_freq"][i])
             for i, b in enumerate(mech["by_item_freq"])]
    rows += [("history tokens", n, "", lambda m, k=k: m[k])
             for n, k in (("cold", "cold_users"), ("warm", "warm_users"))]
    rows += [("block", f"layer {b['layer']}", "all tokens", None) for b in mech["per_layer"]]
    return rows


def mechanism_table(groups: dict) -> pd.DataFrame:
    """One row per (dataset, model, tag, grouping, stratum); per layer with a mechanism block: mean K and
    mean λ0 (seed mean ± std). Groupings: ``at target`` (the scoring position of each test user, by the
    test target's item-frequency bin and cold/warm user: the grouping of the metric strata), ``history
    tokens`` (every history token by its own item's bin), ``block`` (per block, all tokens, with K at
    init on the first training batch)."""
    layers = [layer for layer in layers_of(groups)
              if any("mechanism" in r for k, rs in groups.items() if k[3] == layer for r in rs)]
    rows = []
    for k3 in row_keys(groups):
        cells_ = {layer: [r for r in groups.get(k3 + (layer,), []) if "mechanism" in r] for layer in layers}
        cells_ = {layer: rs for layer, rs in cells_.items() if rs}
        if not cells_:
            continue
        richest = max((r for rs in cells_.values() for r in rs), key=lambda r: "at_target" in r["mechanism"])
        for grouping, name, rng, get in _mech_rows(richest):
            row = {"dataset": k3[0], "model": k3[1], "tag": k3[2], "grouping": grouping, "stratum": name, "range": rng}
            for layer in layers:
                rs = cells_.get(layer)
                if not rs:
                    row.update({f"K {layer}": "–", f"λ0 {layer}": "", f"K at init {layer}": ""})
                elif get is None:
                    j = int(name.split()[1])
                    init = [(r["mechanism"].get("gain_first_batch") or {}).get("initial_K_per_layer") for r in rs]
                    row.update({f"K {layer}": fmt([r["mechanism"]["per_layer"][j]["K"] for r in rs]), f"λ0 {layer}": "",
                                f"K at init {layer}": fmt([k[j] if k else None for k in init], digits=5)})
                else:
                    entries = [get(r["mechanism"]) for r in rs]
                    row.update({f"K {layer}": fmt([e["K"] if e else None for e in entries]),
                                f"λ0 {layer}": fmt([e["lam0"] if e else None for e in entries]),
                                f"K at init {layer}": ""})
            rows.append(row)
    return pd.DataFrame(rows)


def _k_ends(mech: list[dict]) -> tuple[str, str] | None:
    """(grouping label, ``K Q0 / K Qn`` text) of the seed-mean K on the rarest and most popular bin: at the
    target where every run has ``at_target`` (issue 46 item 4), else by history token; None without runs."""
    if not mech:
        return None
    at = all("at_target" in m for m in mech)
    key, label = ("by_target_freq", "at target") if at else ("by_item_freq", "by token")
    vals = [np.mean([(m["at_target"] if at else m)[key][i]["K"] for m in mech])
            if all((m["at_target"] if at else m)[key][i]["K"] is not None for m in mech) else None for i in (0, -1)]
    return label, " / ".join(f"{v:.4f}" if v is not None else "–" for v in vals)


def summary_table(groups: dict, comp: pd.DataFrame) -> pd.DataFrame:
    """One row per (dataset, model, tag) with a comparison: the three pre-registered endpoints for every
    layer against standard (overall, rarest item bin and cold-user HR@10 gains, seed-unit statistics) and
    K on the rarest and the most popular bin (at the target where the runs have it, else by token; the
    column says which). NDCG@10, λ0 and every other stratum: ``overall``, ``strata``, ``mechanism``."""
    layers, look = layers_of(groups), _lookup(comp)
    rows = []
    for k3 in row_keys(groups):
        present = [layer for layer in layers if k3 + (layer, "overall", "HR@10") in look]
        if not present:
            continue
        first = groups[k3 + (present[0],)][0]
        bins = [b["bin"] for b in first["test"]["by_item_freq"]]
        q0, qn = bins[0], bins[-1]
        std = baseline(groups, k3 + (present[0],))
        row = {"dataset": k3[0], "model": k3[1], "tag": k3[2], "seeds": _seeds(groups, k3, layers),
               "HR@10 standard": fmt([r["test"]["overall"]["HR@10"] for r in std])}
        for layer in layers:
            rs = groups.get(k3 + (layer,))
            row[f"HR@10 {layer}"] = fmt([r["test"]["overall"]["HR@10"] for r in rs]) if rs else "–"
            for st in ("overall", q0, "cold"):
                col = gain_col("HR@10", layer, "" if st == "overall" else st)
                row[col] = gain_cell(look.get(k3 + (layer, st, "HR@10")))
            ends = _k_ends([r["mechanism"] for r in rs or [] if "mechanism" in r])
            row[f"K {q0} / {qn} {layer}"] = f"{ends[1]} ({ends[0]})" if ends else ""
        row["flags"] = row_flags(look, k3, layers)
        rows.append(row)
    return pd.DataFrame(rows)


STATS = ("- gain (the unit of replication is the training seed): the mean over seeds of each seed's relative gain "
         "(layer − standard) / standard, seed s against seed s of the standard layer of the same dataset, backbone and "
         "tag (else the untagged one); the means and ± std columns use every seed of a cell\n"
         "- p_seeds: two-sided one-sample t-test of the per-seed gains; p_Holm: Holm over the comparison's three "
         "pre-registered endpoints (HR@10 overall, on the rarest item bin Q0 and on cold users; an untestable one "
         "counts as p = 1), `–` on exploratory rows; 95% CI: mean gain ± t(0.975, seeds − 1) · se_seeds, se_seeds² = "
         "(SD of the per-seed gains)² / seeds + the variance of the mean gain over a bootstrap of the test users "
         f"(one draw of users shared by every seed, as all seeds score the same users; B={BOOT_B}, numpy seed "
         f"[{BOOT_SEED}, users]): p_seeds asks whether retrainings agree on this test set, the interval also counts "
         "the sampling of its users, so a row can have p_seeds < 0.05 and an interval over 0; `n/a (too few ...)`: "
         f"fewer than {MIN_SEEDS} seeds, or under {MIN_BASELINE_HITS} baseline HR@10 hits in the stratum: no test\n"
         "- comparisons.csv also has, per row: endpoint, flags, seed_gains, sd_seeds, se_seeds (the standard error "
         "behind the interval; meta.csv weights pairs by it), mde_seeds (the gain a t-test over "
         "as many seeds detects at power 0.8, α 0.05, from the seed SD), and the secondary fixed-seeds statistics: "
         "p_fixed_seeds (Wilcoxon signed-rank over users of the seed-averaged per-user metric), p_holm_fixed_seeds "
         "(Holm over one layer, metric and stratum across the tables) and ci_*_fixed_seeds (bootstrap over users of "
         "the gain of the seed means, gain); these see users at fixed training seeds, not retrainings\n"
         "- flags: TRIAL (overrides beyond the grid axes) or capped (a run stopped by its epoch cap while validation "
         "still rose): such a row is no verdict")


META_KEYS = ("gain", "ci_lo", "ci_hi", "p", "tau2", "i2", "q", "mde")


def meta_table(comp: pd.DataFrame) -> pd.DataFrame:
    """Random-effects meta-analysis over (dataset, backbone) pairs, per layer (and tag), pre-registered
    endpoint and scope (all backbones, then each backbone): does the layer gain across pairs, as the paper
    claims, in one test (``bftrec.report.stats.random_effects``). A pair's effect is gain_seeds, its
    variance se_seeds² (the standard error of ``seed_user_ci``: retraining and test-user noise both; the
    seed SD alone, from 3 seeds of one test set, can be near 0 by chance and leaves the test users' noise
    out); pairs with a test_note or no standard error are left out and counted in ``pairs_left_out``."""
    rows = []
    pre = comp[comp["endpoint"] == "pre-registered"].fillna({"tag": "", "test_note": "", "flags": ""}) if len(comp) \
        else comp
    for (layer, tag, stratum), g in (pre.groupby(["layer", "tag", "stratum"], sort=True) if len(pre) else []):
        for scope in ["all"] + sorted(g["model"].unique()):
            sub = g if scope == "all" else g[g["model"] == scope]
            ok = sub[(sub["test_note"] == "") & (sub["flags"] == "") & sub["se_seeds"].notna()
                     & sub["gain_seeds"].notna()]  # a trial or capped comparison is no evidence
            ok = ok[ok["se_seeds"].astype(float) > 0]
            res = random_effects(ok["gain_seeds"].astype(float), ok["se_seeds"].astype(float) ** 2) if len(ok) else None
            rows.append({"layer": layer, "tag": tag, "endpoint": f"HR@10 {stratum}", "backbones": scope,
                         "pairs": len(ok), "pairs_left_out": len(sub) - len(ok),
                         **({k: res[k] for k in META_KEYS} if res else {k: None for k in META_KEYS}),
                         "note": "" if res else "n/a (fewer than 2 pairs)"})
    out = pd.DataFrame(rows)
    if len(out):  # Holm over the three pre-registered endpoints of one layer, tag and scope (p = 1 if untestable)
        out["p_holm"] = None
        out["p_holm"] = out["p_holm"].astype(object)
        for _, idx in out.groupby(["layer", "tag", "backbones"], sort=False).groups.items():
            ps = [1.0 if pd.isna(p) else float(p) for p in out.loc[idx, "p"]]
            adj = holm(ps + [1.0] * (len(ENDPOINTS) - len(ps)))[:len(ps)]
            out.loc[idx, "p_holm"] = [None if pd.isna(p) else a for p, a in zip(out.loc[idx, "p"], adj)]
        out = out[[c for c in out.columns if c != "note"] + ["note"]]
    return out


def meta_markdown(meta: pd.DataFrame) -> pd.DataFrame:
    """The meta table with gains and intervals as percentages, p, τ² and I² rounded."""
    out = meta.copy()
    for c in ("gain", "ci_lo", "ci_hi"):
        out[c] = [pct(x) for x in out[c]]
    out["mde"] = ["–" if not _num(x) else f"{100 * x:.1f}%" for x in out["mde"]]
    out["p"] = [pval(x) for x in out["p"]]
    out["p_holm"] = [pval(x) for x in out["p_holm"]]
    out["tau2"] = ["–" if not _num(x) else f"{x:.2g}" for x in out["tau2"]]
    out["i2"] = ["–" if not _num(x) else f"{100 * x:.0f}%" for x in out["i2"]]
    names = {"tau2": "τ²", "i2": "I²", "ci_lo": "95% CI lo", "ci_hi": "95% CI hi", "mde": "MDE (power 0.8)"}
    return out.drop(columns=["q"]).rename(columns=names)


def write(df: pd.DataFrame, out: Path, name: str, title: str, head: str, numparse: bool = True) -> list[Path]:
    """``<out>/<name>.csv`` and ``.md`` (title, header lines, the table); ``numparse=False`` keeps numbers that are
    text as written (``0.0090``, not ``0.009``)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.csv", out / f"{name}.md"]
    df.to_csv(paths[0], index=False)
    paths[1].write_text(f"# {title}\n\n{head}\n\n{df.to_markdown(index=False, disable_numparse=not numparse)}\n")
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-report tables", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True,
                    help="folder(s) searched for metrics.json: one run, a multirun folder or a grid's runs/; "
                         "several: their union")
    ap.add_argument("--out", type=Path, required=True, help="folder for the tables")
    ap.add_argument("--grid", type=Path, action="append",
                    help="grid config whose cells are expected (configs/experiment/paper/*.yaml); repeat for a union")
    ap.add_argument("--allow-partial", action="store_true",
                    help="write tables despite missing cells (listed in the header)")
    ap.add_argument("--own-values", default="", metavar="KEYS",
                    help="comma-separated config keys at which each layer keeps its own value (each tuned on its "
                         "own, bftrec-tune); named with the values in the header")
    args = ap.parse_args(argv)
    own = tuple(k for k in args.own_values.split(",") if k)
    runs, missing, ignored = select_runs(args.runs, args.grid, args.allow_partial, own_values=own)
    groups = cells(runs)
    comp = comparisons(groups)
    prereg = preregistration_notes(args.runs, runs)
    drift = grid_drift(runs, args.grid) if args.grid else {}  # a tuned config changed since cells ran
    for n in prereg + list(drift.values()):
        log.warning("%s", n.replace("**", ""))
    cmd = command_line("tables", argv)
    full = header(runs, missing, ignored, prereg + list(drift.values()) + ([own_values_note(runs, own)] if own else []),
                  command=cmd)
    drift_note = [f"grid config since changed at {', '.join(drift)} for some runs (protocol.md)"] if drift else []
    drift_note += [f"each layer at its own tuned {', '.join(own)} (protocol.md)"] if own else []
    note = "; ".join([n for n in [run_note(runs, missing)] if n] + [n.replace("**", "") for n in prereg] + drift_note)
    head = (f"- {len(runs)} runs{'; **' + note + '**' if note else ''}; generated by `{cmd}`\n"
            "- protocol, commits, hardware, budgets and the statistics: [protocol.md](protocol.md)")
    stat_head = (f"{head}\n- gain cells: mean per-seed gain (p_seeds: t-test over seeds; p_Holm over the three "
                 "pre-registered endpoints; 95% CI: seeds, then users, resampled)") if len(comp) else head
    mech_note = ("- K: mean Kalman gain at the best checkpoint on the test histories (strata: mean over "
                 "blocks); λ0: mean initial precision. Grouping `at target`: at the scoring position, one value per "
                 "test "
                 "user, by the test target's item-frequency bin and cold/warm user (the grouping of the metric strata; "
                 "runs older than this grouping show –); `history tokens`: every real history token by its own item's "
                 "bin; `block`: per block over all tokens, with K at init on the first training batch after "
                 "calibration (gain_first_batch)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "protocol.md").write_text(f"# Protocol, provenance and statistics of these tables\n\n{full}\n"
                                          + (f"{STATS}\n" if len(comp) else "") + f"{mech_note}\n")
    wrote = [args.out / "protocol.md"]
    wrote += write(overall_table(groups, comp), args.out, "overall", "Overall test metrics (mean ± std over seeds)",
                   stat_head)
    wrote += write(strata_table(groups, comp), args.out, "strata", "Test metrics by stratum (mean ± std over seeds)",
                   stat_head)
    floor = floor_table(groups)
    if len(floor):
        wrote += write(floor, args.out, "floor", "The floor: every model's standard layer side by side, by stratum",
                       f"{head}\n{floor_note(groups)}", numparse=False)
    mech = mechanism_table(groups)
    if len(mech):
        wrote += write(mech, args.out, "mechanism", "BFT mechanism by stratum (test histories, mean ± std over seeds)",
                       f"{head}\n{mech_note}")
    beyond = beyond_table(groups)
    if len(beyond):
        wrote += write(beyond, args.out, "beyond", "Beyond accuracy: the recommended top-K lists (mean ± std over "
                       "seeds; tail = the two rarest item bins)", head)
    beyond_diff = beyond_tests(groups)
    if len(beyond_diff):
        wrote += write(beyond_diff, args.out, "beyond_tests", "Beyond accuracy, every layer against standard: the "
                       "mean per-seed difference (layer − standard, the metric's units)",
                       f"{head}\n- 95% t interval and two-sided t-test over the paired seeds (the seed is the unit); "
                       "exploratory rows: not pre-registered, no Holm")
    summary = summary_table(groups, comp)
    if len(summary):
        wrote += write(summary, args.out, "summary", "Every layer against standard: the pre-registered endpoints "
                       "(HR@10 overall, rarest items, cold users) and K", stat_head)
        comp.to_csv(args.out / "comparisons.csv", index=False)
        wrote.append(args.out / "comparisons.csv")
        meta = meta_table(comp)
        meta.to_csv(args.out / "meta.csv", index=False)
        (args.out / "meta.md").write_text(
            "# Random-effects meta-analysis over (dataset, backbone) pairs\n\n"
            f"{head}\n- per layer, pre-registered endpoint and scope: the pooled relative gain (Paule-Mandel τ², "
            "95% CI and two-sided p from t with pairs − 1 degrees of freedom; p_holm: Holm over the three "
            "endpoints of one layer and scope), each pair weighted by 1 / (se_seeds² + τ²), se_seeds the "
            "comparison's standard error (retraining and test-user "
            "noise); I²: the share of the spread between pairs beyond their own uncertainty; MDE: the pooled gain the "
            "test detects at power 0.8\n\n"
            f"{meta_markdown(meta).to_markdown(index=False) if len(meta) else '(no comparison)'}\n")
        wrote += [args.out / "meta.csv", args.out / "meta.md"]
    log.info(f"wrote {len(wrote)} files to {args.out}: {', '.join(p.name for p in wrote)}")


if __name__ == "__main__":
    main()
