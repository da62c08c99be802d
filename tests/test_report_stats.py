"""Seed-unit statistics (issue 46 item 1): each against a hand-computed case or an independent route."""
import numpy as np
import pandas as pd
import pytest
from scipy.stats import nct, t, ttest_1samp

from bftrec.report import stats as st
from bftrec.report import tables


def test_seed_t_p_is_scipys_one_sample_t_test_and_needs_two_seeds():
    g = [0.03, 0.05, -0.01, 0.02]
    assert st.seed_t_p(g) == pytest.approx(ttest_1samp(g, 0.0).pvalue)
    assert st.seed_t_p([0.05]) is None and st.seed_t_p([0.1, None]) is None and st.seed_t_p([0.1, 0.1]) is None


@pytest.mark.parametrize("n", [3, 8])
def test_mde_is_the_gain_a_t_test_over_seeds_detects_at_power_0_8(n):
    g = np.random.default_rng(n).normal(0.0, 0.04, n)
    mde = st.mde_seeds(g)
    sd = np.std(g, ddof=1)
    nc = mde / (sd / np.sqrt(n))  # noncentrality of the t statistic at a true gain of mde
    crit = t.ppf(0.975, n - 1)
    power = nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.8, abs=1e-3)
    assert st.mde_seeds([0.1]) is None


def _crossed(seed_effects, n=3000, base=0.2, user_sd=0.0, rng=None):
    """Per seed: paired 0/1 hits on the SAME n users (crossed, as in a benchmark): the baseline's hit
    probabilities per user are shared by all seeds; the layer's are scaled by (1 + the seed's effect)."""
    rng = rng or np.random.default_rng(0)
    p_user = np.clip(base * np.exp(rng.normal(0, user_sd, n)), 0, 0.9)  # one test set, shared
    out = []
    for g in seed_effects:
        b = (rng.random(n) < p_user).astype(float)
        a = (rng.random(n) < np.clip(p_user * (1 + g), 0, 1)).astype(float)
        out.append((a, b))
    return out


def test_interval_is_exact_when_every_resample_has_the_same_gain():
    b = (np.arange(300) % 3 == 0).astype(float)
    assert st.seed_user_ci([(2 * b, b), (2 * b, b), (2 * b, b)]) == pytest.approx((1.0, 1.0))


def test_interval_sees_retraining_variance_that_users_alone_miss():
    """Seeds whose gains differ a lot (a retraining effect): the interval is far wider than the users-only
    interval of the seed-averaged metric, and it is centred on the mean seed gain."""
    pairs = _crossed([-0.15, 0.0, 0.15, 0.3, -0.1])
    lo, hi = st.seed_user_ci(pairs)
    per_seed = [a.sum() / b.sum() - 1 for a, b in pairs]
    assert (lo + hi) / 2 == pytest.approx(np.mean(per_seed))
    mt = tables
    u_lo, u_hi = mt.bootstrap_gain_ci(np.mean([p[0] for p in pairs], axis=0), np.mean([p[1] for p in pairs], axis=0))
    assert (hi - lo) > 2 * (u_hi - u_lo)
    assert st.seed_user_ci(pairs) == (lo, hi)  # a fixed generator: repeatable


def test_interval_covers_the_true_gain_about_95_percent_of_the_time():
    """Coverage over simulated benchmarks: a true gain of +5%, seed effects with SD 3%, test users shared by
    every seed (a new test set and new seeds per benchmark). Neither too narrow nor grossly too wide."""
    rng = np.random.default_rng(7)
    hits = 0
    reps = 150
    for _ in range(reps):
        effects = 0.05 + rng.normal(0, 0.03, 4)
        lo, hi = st.seed_user_ci(_crossed(effects, n=2000, user_sd=0.5, rng=rng), n_boot=200)
        hits += lo < 0.05 < hi
    assert 0.88 <= hits / reps <= 0.99  # 0.94 here; the nested two-stage version gave 1.0 (too wide)


def test_users_are_crossed_with_seeds_not_nested():
    """With no retraining noise at all (every seed the same model), the interval is the test-set sampling of
    one seed's gain, not sqrt(S) times smaller or larger: identical seeds give the interval of one seed."""
    a, b = _crossed([0.1])[0]
    one = st.seed_user_ci([(a, b), (a, b)])
    many = st.seed_user_ci([(a, b)] * 6)
    q2, q6 = t.ppf(0.975, 1), t.ppf(0.975, 5)
    assert (one[1] - one[0]) / q2 == pytest.approx((many[1] - many[0]) / q6, rel=1e-9)


def test_interval_agrees_with_the_t_test_over_three_seeds():
    """Three seeds whose gains (+1%, +5%, +9%) a t-test does not call (p 0.16): the interval covers 0."""
    pairs = []
    for g in (0.01, 0.05, 0.09):
        b = (np.arange(200_000) % 5 == 0).astype(float)
        a = b.copy()
        a[np.flatnonzero(b == 0)[: int(round(g * b.sum()))]] = 1.0  # exactly g more hits, little user noise
        pairs.append((a, b))
    assert st.seed_t_p([0.01, 0.05, 0.09]) > 0.05
    lo, hi = st.seed_user_ci(pairs, n_boot=200)
    assert lo < 0 < hi and (lo + hi) / 2 == pytest.approx(0.05, abs=1e-3)


def test_interval_se_is_the_half_width_over_the_t_quantile():
    assert st.interval_se((-0.1, 0.3), 3) == pytest.approx(0.2 / t.ppf(0.975, 2))
    assert st.interval_se(None, 3) is None and st.interval_se((0.0, 1.0), 1) is None


def test_interval_needs_two_seeds_a_baseline_hit_and_aligned_users():
    pairs = _crossed([0.1, 0.1])
    assert st.seed_user_ci(pairs[:1]) is None
    a, b = pairs[0]
    assert st.seed_user_ci([(a, b), (a, 0 * b)]) is None
    both = st.seed_user_ci([(np.stack([a, a], 1), np.stack([b, 0 * b], 1))] * 2)
    assert both[0] is not None and both[1] is None  # per metric column
    assert st.seed_user_ci([(a[:0], b[:0])] * 3) is None  # an empty group (no user in it)
    with pytest.raises(ValueError, match="different numbers of users"):
        st.seed_user_ci([(a, b), (a[:-1], b[:-1])])


def test_seed_t_p_gives_no_p_for_rounding_noise_or_an_infinite_gain():
    assert st.seed_t_p([0.1, 0.1 + 1e-17, 0.1]) is None and st.seed_t_p([0.1, float("inf")]) is None


def test_random_effects_matches_a_hand_computed_paule_mandel_case():
    # effects 0.1 and 0.3, variances 0.01: Q = 2, so Paule-Mandel tau2 solves 0.02 / (0.01 + tau2) = 1 -> 0.01;
    # pooled 0.2 with SE sqrt(1 / (2 / 0.02)) = 0.1, interval and p from t(1); I2 = (Q - 1) / Q = 0.5
    r = st.random_effects([0.1, 0.3], [0.01, 0.01])
    assert r["gain"] == pytest.approx(0.2) and r["tau2"] == pytest.approx(0.01, rel=1e-3)
    assert r["ci_lo"] == pytest.approx(0.2 - t.ppf(0.975, 1) * 0.1, rel=1e-3) and r["i2"] == pytest.approx(0.5)
    assert r["p"] == pytest.approx(2 * t.sf(2.0, 1), rel=1e-3)  # t with k - 1 = 1 degree of freedom
    same = st.random_effects([0.05, 0.05, 0.05], [0.001, 0.002, 0.004])
    assert same["gain"] == pytest.approx(0.05) and same["tau2"] == pytest.approx(0.0, abs=1e-12)
    se = (1 / (1 / 0.001 + 1 / 0.002 + 1 / 0.004)) ** 0.5  # fixed-effect SE, as tau2 = 0
    crit, nc = t.ppf(0.975, 2), same["mde"] / se  # at a true pooled gain of mde the t(2) test has power 0.8
    assert nct.sf(crit, 2, nc) + nct.cdf(-crit, 2, nc) == pytest.approx(0.8, abs=1e-3)
    assert st.random_effects([0.1], [0.01]) is None and st.random_effects([0.1, 0.2], [0.01, 0.0]) is None


def test_holm_over_three_endpoints_counts_an_untestable_one_as_p_1():
    mt = tables
    df = pd.DataFrame({"dataset": "d", "model": "m", "tag": "", "layer": "bft",
                       "stratum": ["overall", "Q0", "cold", "warm"],
                       "endpoint": ["pre-registered"] * 3 + ["exploratory"],
                       "p_seeds": [0.01, None, 0.02, 0.001]})
    mt.holm_seeds(df)
    # family [0.01, 1, 0.02]: 3 x 0.01 = 0.03, max(0.03, 2 x 0.02) = 0.04; Q0 and the exploratory row blank
    adj = df["p_holm_seeds"].tolist()
    assert adj[0] == pytest.approx(0.03) and adj[2] == pytest.approx(0.04) and adj[1] is None and adj[3] is None


def test_gain_cell_reads_too_few_instead_of_a_p_value():
    mt = tables
    row = {"gain": 1.0, "gain_seeds": 1.0, "test_note": mt.TOO_FEW_SEEDS, "p_seeds": None, "p_holm_seeds": None,
           "ci_lo_seeds": None, "ci_hi_seeds": None}
    assert mt.gain_cell(row) == "+100.0%, n/a (too few seeds)"
    row.update(test_note="", p_seeds=0.01, p_holm_seeds=0.03, ci_lo_seeds=0.5, ci_hi_seeds=1.5)
    assert mt.gain_cell(row) == "+100.0% (0.01, 0.03, [+50.0%, +150.0%])"
