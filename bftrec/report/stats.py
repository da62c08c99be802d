"""Statistics of a layer-against-standard comparison with the training seed as the unit of replication.

A retraining can move a gain more than resampling the test users of one trained model does, so a claim that a
layer beats ``standard`` rests here on a test over seeds, and its interval counts both retraining and
test-user noise:

- ``seed_t_p``: two-sided one-sample t-test (scipy) of the per-seed relative gains against 0;
- ``seed_user_ci``: the 95% interval of the mean per-seed gain whose standard error adds the retraining
  part (seed SD² / S) and the test-user part (a bootstrap over users, one draw shared by every seed, since
  all seeds score the same users); t quantile with S − 1 degrees of freedom;
- ``mde_seeds``: the gain a two-sided t-test over the same number of seeds detects at power 0.8 and
  α = 0.05, given the observed seed SD (statsmodels ``TTestPower``);
- ``random_effects``: a random-effects meta-analysis of per-pair gains (statsmodels ``combine_effects``,
  Paule-Mandel τ²), the pooled gain with its interval, τ² and I².

Inputs are relative gains ((layer − standard) / standard, a float; +0.05 = +5%) and per-user metrics
((n,) float64, 0/1 hits or NDCG per user). Sources: Efron & Tibshirani 1993 (bootstrap), Davison &
Hinkley 1997 §3.8 (resampling hierarchical and crossed data), Paule & Mandel 1982, Higgins & Thompson
2002 (I²).
"""
from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import t as t_dist
from scipy.stats import ttest_1samp
from statsmodels.stats.meta_analysis import combine_effects
from statsmodels.stats.power import TTestPower
from statsmodels.tools.sm_exceptions import InvalidTestWarning

ALPHA, POWER = 0.05, 0.8
BOOT_B, BOOT_SEED, BOOT_LEVEL = 1000, 0, 0.95
MIN_SEEDS = 2          # fewer seeds: no test, no interval over seeds ("n/a (too few)")
MIN_BASELINE_HITS = 20  # a stratum whose baseline has fewer HR@10 hits (seed mean): no test


def seed_t_p(gains) -> float | None:
    """Two-sided one-sample t-test that the mean of the per-seed relative gains is 0.

    gains: sequence of float (None, NaN or inf where a seed's baseline has no hit). Returns the p-value, or
    None with fewer than ``MIN_SEEDS`` seeds, an undefined or infinite gain, or no spread (all seeds equal
    up to float rounding)."""
    vals = np.array([np.nan if g is None else g for g in gains], dtype=float)
    if len(vals) < MIN_SEEDS or not np.isfinite(vals).all() or np.ptp(vals) <= 1e-12 * max(1.0, np.abs(vals).max()):
        return None
    return float(ttest_1samp(vals, 0.0).pvalue)


def seed_t_half(values, level: float = 0.95) -> float:
    """Half-width of the two-sided ``level`` t interval of the mean of ``values`` (one per seed):
    ``t(1 − (1 − level)/2, n − 1) · SD(ddof=1) / √n``; NaN with fewer than 2 values."""
    vals = np.asarray(values, dtype=float)
    if len(vals) < 2:
        return float("nan")
    return float(t_dist.ppf(1 - (1 - level) / 2, len(vals) - 1) * np.std(vals, ddof=1) / np.sqrt(len(vals)))


def mde_seeds(gains, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest absolute mean gain a two-sided one-sample t-test over ``len(gains)`` seeds detects
    with probability ``power`` at level ``alpha``, when the seeds vary as much as these did:
    d* · SD(gains, ddof=1), d* from the noncentral t (statsmodels ``TTestPower.solve_power``).
    None with fewer than ``MIN_SEEDS`` defined gains or no spread."""
    vals = np.array([np.nan if g is None else g for g in gains], dtype=float)
    if len(vals) < MIN_SEEDS or np.isnan(vals).any() or np.ptp(vals) == 0:
        return None
    d = TTestPower().solve_power(nobs=len(vals), alpha=alpha, power=power, alternative="two-sided")
    return float(d * np.std(vals, ddof=1))


def _user_boot_sums(pairs: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, c) column sums of ``pairs`` ((n, c) float64) over users drawn with replacement, one draw
    of n users per row, generated in chunks of bounded memory."""
    n = len(pairs)
    out = np.empty((n_boot, pairs.shape[1]))
    step = max(1, min(n_boot, 4_000_000 // max(n, 1)))
    for lo in range(0, n_boot, step):
        m = min(step, n_boot - lo)
        idx = rng.integers(0, n, size=(m, n))  # (m, n) drawn user positions
        w = np.bincount((np.arange(m)[:, None] * n + idx).ravel(), minlength=m * n).reshape(m, n)
        out[lo:lo + m] = w @ pairs  # (m, c)
    return out


def _ratio_gain(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """(sa − sb) / sb elementwise; +inf where sb = 0 < sa, 0 where both are 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sb > 0, (sa - sb) / np.where(sb > 0, sb, 1), np.where(sa > 0, np.inf, 0.0))


def seed_user_ci(per_seed: list[tuple[np.ndarray, np.ndarray]], n_boot: int = BOOT_B, seed: int = BOOT_SEED,
                 level: float = BOOT_LEVEL):
    """Interval of the mean per-seed relative gain with both sources of noise: retraining and test users.

    Every seed scores the **same** test users, so users are crossed with seeds, not nested in them. The
    standard error has two parts:

    - retraining: SD(per-seed gains)² / S, the seeds' spread on this test set (what ``seed_t_p`` tests);
    - test users: the variance of the mean per-seed gain over bootstrap resamples of the users, **one draw of
      n users applied to every seed** (B draws from ``default_rng([seed, n])``): how much the average gain
      moves with another sample of test users. Drawing users anew within each seed (a nested two-stage
      bootstrap) would count each seed's user noise S times and miss the part all seeds share (Davison &
      Hinkley 1997, §3.8).

    Both parts contain the user-by-seed interaction (which users a given retraining happens to hit), so it is
    estimated from the same bootstrap (the mean per-seed user variance minus the shared one, times
    1/(S−1)) and counted once: SE² = retraining + test users − interaction (never below the retraining
    part). The interval is the observed mean gain ± t(level, S−1) · SE, the t quantile of the test over
    seeds. Coverage in simulated crossed benchmarks: 93–97.5% (tests/test_report_stats.py).

    Args:
        per_seed: one (a, b) pair per training seed: the per-user metric of the layer and of its baseline,
            (n,) float64 or (n, m) float64 for m metrics at once, on the same n users in the same order for
            every seed (paired across layers and seeds).
        n_boot: user resamples B; seed: numpy seed; level: interval level.
    Returns:
        (lo, hi) for 1-D inputs, a list of m such pairs (or None entries) for (n, m) inputs; None (each) with
        fewer than ``MIN_SEEDS`` seeds, no user, or a seed with no baseline value in that metric.
    Raises:
        ValueError: seeds with different numbers of users (they must be aligned first).
    """
    S = len(per_seed)
    one = S == 0 or np.ndim(per_seed[0][0]) == 1
    m = 1 if one else np.shape(per_seed[0][0])[1]
    if S < MIN_SEEDS or any(len(a) == 0 for a, _ in per_seed):
        return None if one else [None] * m
    cols = [(np.asarray(a, dtype=np.float64).reshape(len(a), -1), np.asarray(b, dtype=np.float64).reshape(len(b), -1))
            for a, b in per_seed]
    n = len(cols[0][0])
    if any(len(a) != n or len(b) != n for a, b in cols):
        raise ValueError(f"seed_user_ci: the seeds score different numbers of users ({[len(a) for a, _ in cols]}); "
                         "align them on the users every seed scored")
    stacked = np.concatenate([np.concatenate([a, b], axis=1) for a, b in cols], axis=1)  # (n, S·2m)
    sums = _user_boot_sums(stacked, n_boot, np.random.default_rng([seed, n])).reshape(n_boot, S, 2 * m)
    per = _ratio_gain(sums[:, :, :m], sums[:, :, m:])  # (B, S, m) each seed's gain per user resample
    boot = per.mean(axis=1)  # (B, m) the mean gain per user resample
    gains = np.stack([_ratio_gain(a.sum(0), b.sum(0)) for a, b in cols])  # (S, m) observed per-seed gains
    q = t_dist.ppf((1 + level) / 2, S - 1)
    out = []
    for c in range(m):
        if any(not b[:, c].sum() for _, b in cols) or not np.all(np.isfinite(per[:, :, c])):
            out.append(None)
            continue
        retrain = np.var(gains[:, c], ddof=1) / S  # σ_seed²/S + σ_int²/(nS): includes the user-by-seed part
        users = np.var(boot[:, c], ddof=1)  # σ_user²/n + σ_int²/(nS): includes it too
        inter = max(np.var(per[:, :, c], axis=0, ddof=1).mean() - users, 0.0) / (S - 1)  # σ_int²/(nS)
        se = np.sqrt(max(retrain + users - inter, retrain))  # the user-by-seed part counted once
        centre = float(gains[:, c].mean())
        out.append((centre - q * se, centre + q * se))
    return out[0] if one else out


def interval_se(ci: tuple[float, float] | None, n_seeds: int, level: float = BOOT_LEVEL) -> float | None:
    """The standard error behind a ``seed_user_ci`` interval: its half-width / t(level, S−1)."""
    if ci is None or n_seeds < MIN_SEEDS:
        return None
    return float((ci[1] - ci[0]) / 2 / t_dist.ppf((1 + level) / 2, n_seeds - 1))


def random_effects(effects, variances) -> dict | None:
    """Random-effects meta-analysis of k per-pair effects (relative gains) with their within-pair
    variances (the squared standard error of ``seed_user_ci``, ``interval_se``: seed and test-user noise):
    Paule-Mandel τ² (statsmodels ``combine_effects(method_re="iterated", use_t=True)``), the 95% interval
    and the p value from a t distribution with k − 1 degrees of freedom (with 3 to 6 pairs a normal tail
    would be far too narrow).

    Returns {"k", "gain", "ci_lo", "ci_hi", "p", "tau2", "i2", "q", "mde"} (p two-sided, of the pooled
    gain against 0; mde: the pooled gain detectable at power 0.8; I² truncated at 0, Higgins & Thompson
    2002), or None with fewer than 2 pairs or a non-positive variance."""
    e = np.asarray(effects, dtype=float)
    v = np.asarray(variances, dtype=float)
    if len(e) < 2 or not np.all(np.isfinite(e)) or not np.all(v > 0):
        return None
    with warnings.catch_warnings():  # use_t wants per-pair sample sizes for the per-pair rows only; unused here
        warnings.simplefilter("ignore", InvalidTestWarning)
        res = combine_effects(e, v, method_re="iterated", use_t=True)
        frame = res.summary_frame()
    row = frame.loc["random effect"]
    z = row["eff"] / row["sd_eff"] if row["sd_eff"] > 0 else np.inf
    # the pooled gain a two-sided t(k − 1) test detects at power 0.8: noncentrality d*·√k, times the SE
    d = TTestPower().solve_power(nobs=len(e), alpha=ALPHA, power=POWER, alternative="two-sided")
    return {"k": int(len(e)), "gain": float(row["eff"]), "ci_lo": float(row["ci_low"]),
            "ci_hi": float(row["ci_upp"]), "p": float(2 * t_dist.sf(abs(z), len(e) - 1)), "tau2": float(res.tau2),
            "i2": max(0.0, float(res.i2)), "q": float(res.q),
            "mde": float(d * np.sqrt(len(e)) * row["sd_eff"])}
