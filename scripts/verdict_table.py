"""The README's verdict table, printed from the committed results it summarises: one row per claim of the paper
(and per study that tests one), each with its evidence and a verdict.

Every number comes from a committed file a command wrote (``bftrec-report``'s tables, ``bftrec-tune``'s
``trials.csv``, the positive control's ``readout.json``; the folders given below); the words are fixed here.
Each verdict carries the rule it rests on (each row's ``_verdict`` call): where the numbers no longer satisfy it,
the verdict cell reads
``to restate: <rule> no longer holds``, so that ``scripts/check_tables.py``, which reruns the quoted command and
compares the table after it, fails until a person has reread the claim. Gains print as ``+1.4%`` (a true minus
sign), p values as ``comparison_table.p_text`` prints them. Rows, in order:

1. the gains on every backbone and dataset: ``meta.csv`` pooled overall HR@10 and ``comparisons.csv``'s pairs
   passing Holm over seeds;
2. rare items (Q0): pooled Q0 HR@10, and HSTU's;
3. cold users: pooled cold-user HR@10;
4. the signal-to-noise claim: ``<snr>/sweep/sweep.csv`` and ``trend.csv`` (gain per injection rate and its trend);
5. beyond accuracy: the replication's ``beyond_tests.csv`` and ``beyond.csv`` (tail share of the top-10 lists,
   ``bft`` and ``bft_h``), and the SNR sweep's;
6. equal tuning budgets: ``--equal-budget``'s ``comparisons.csv`` and the studies' ``trials.csv`` beside it;
7. the Kalman gain K on rare items: ``mechanism.csv`` (history tokens, ``bft``; Q0 range, and Q0 against Q4);
8. the pre-registered replication of ``bft_h`` on Sports HSTU cold users: the main grid's seeds 0–2, the
   replication's seeds 3–7 (``tables_seeds3-7``, ``tables_bft_seeds3-7``) and its run count;
9. what the benchmark could have detected: the pooled and per-pair gains detectable at power 0.8 (``meta.csv``,
   ``comparisons.csv``), and the positive control's ``readout.json`` (the oracle's gain for noisy users, where
   the planted unreliability bites, against every BFT arm's).

``--pooled`` prints instead the pooled rows of ``<main>/meta.csv`` that docs/results.md §1.1 gives (``bft``:
overall on all backbones and on each, Q0 on all and on HSTU, cold users on all), one row each: pairs (``11 of 18``
where pairs are left out for too few hits), pooled gain, 95% CI, p, p_Holm over the three endpoints, I² and the
pooled gain the test detects at power 0.8.

Usage (from the repository root):
    python scripts/verdict_table.py --main results/paper_main/tables --snr results/snr \
        --replication results/paper_main/replication --equal-budget results/equal_budget/office_sasrec/tables \
        --positive-control results/positive_control
    python scripts/verdict_table.py --main results/paper_main/tables --pooled

Errors (one line, exit 2): a file missing from a folder, none or several rows where one is read, a column missing.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # scripts/, repo
from _cli import print_table  # noqa: E402
from comparison_table import gain_text, name, p_text  # noqa: E402

from bftrec.report.sweep import parse_seed_gains  # noqa: E402

PAPER_K = 0.77      # the paper's Kalman gain on rare items
FLAT_K = 0.05       # K on Q0 and Q4 closer than this in every pair reads "nearly flat"
ALPHA = 0.05
PREREGISTERED_SEEDS = (3, 4, 5, 6, 7)  # results/paper_main/preregistration.md: the replication's seeds
TEST = re.compile(r"^\s*([+-]?[\d.]+) \[([+-]?[\d.]+), ([+-]?[\d.]+)\], p ([\d.e+-]+)\s*$")  # beyond_tests.csv cells
KEY_CELLS = 1  # the leading cell that names a row (the claim), for check_tables' reports


def _csv(path: Path, needs: tuple[str, ...] = ()) -> pd.DataFrame:
    """A csv ``bftrec-report`` wrote, untagged rows' ``tag`` read as ``""`` (a file without the column: all
    untagged); a missing file or a missing column in ``needs`` is a one-line SystemExit."""
    if not path.is_file():
        raise SystemExit(f"verdict_table: no {path}; give the folder bftrec-report wrote (see --help)")
    frame = pd.read_csv(path)
    frame["tag"] = frame["tag"].astype(object).where(frame["tag"].notna(), "") if "tag" in frame.columns else ""
    missing = [c for c in needs if c not in frame.columns]
    if missing:
        raise SystemExit(f"verdict_table: no column {missing[0]!r} in {path}; regenerate it (bftrec-report)")
    return frame


def _one(frame: pd.DataFrame, path: Path, **match) -> pd.Series:
    """The one row of ``frame`` (read from ``path``) whose columns equal ``match``; else a one-line SystemExit."""
    hit = frame
    for col, value in match.items():
        if col not in hit.columns:
            raise SystemExit(f"verdict_table: no column {col!r} in {path}; regenerate it (bftrec-report)")
        hit = hit[hit[col] == value]
    if len(hit) != 1:
        what = ", ".join(f"{k}={v}" for k, v in match.items())
        raise SystemExit(f"verdict_table: {len(hit)} rows with {what} in {path} (one expected)")
    return hit.iloc[0]


def _int(value, what: str, path: Path) -> int:
    """A count (``pairs``, ``seeds``) as an int, whatever dtype pandas gave its column; NaN is a SystemExit."""
    if not _finite(value):
        raise SystemExit(f"verdict_table: {what} is empty in {path}; regenerate it (bftrec-report)")
    return int(value)


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _ci(lo: float, hi: float) -> str:
    return f"[{gain_text(lo)}, {gain_text(hi)}]"


def _pp(x: float) -> str:
    """A difference of shares in percentage points, two decimals, signed, true minus: ``−0.32``, ``+0.10``."""
    return f"{100 * x:+.2f}".replace("-", "−")


def _beyond_test(text: str, path: Path) -> tuple[float, float, float, float]:
    """``(Δ, lo, hi, p)`` from a ``beyond_tests.csv`` cell ``-0.0032 [-0.0052, -0.0013], p 0.00997``."""
    m = TEST.match(str(text))
    if not m:
        raise SystemExit(f"verdict_table: {text!r} in {path} is not 'Δ [lo, hi], p P'; regenerate it")
    return tuple(float(g) for g in m.groups())


def _verdict(text: str, holds: bool, rule: str) -> str:
    return text if holds else f"to restate: {rule} no longer holds"


def _pooled(meta: pd.DataFrame, path: Path, endpoint: str, backbones: str = "all") -> pd.Series:
    return _one(meta, path, layer="bft", tag="", endpoint=endpoint, backbones=backbones)


def _p_at_least(p, alpha: float = ALPHA) -> bool:
    """A test that was run and did not reject: finite ``p`` ≥ ``alpha`` (NaN, no test, never passes a rule)."""
    return _finite(p) and float(p) >= alpha


def rows(main: Path, snr: Path, replication: Path, equal_budget: Path,
         positive_control: Path) -> list[tuple[str, str, str]]:
    """``(claim, evidence, verdict)`` per row; see the module docstring."""
    meta_path, comp_path = main / "meta.csv", main / "comparisons.csv"
    meta = _csv(meta_path, ("layer", "endpoint", "backbones", "pairs", "gain", "ci_lo", "ci_hi", "p", "p_holm"))
    comp = _csv(comp_path, ("dataset", "model", "layer", "stratum", "metric", "seed_gains", "p_seeds",
                            "p_holm_seeds", "gain_seeds", "ci_lo_seeds", "ci_hi_seeds", "mde_seeds"))
    out = []

    o = _pooled(meta, meta_path, "HR@10 overall")
    n_pairs = _int(o["pairs"], "pairs of bft HR@10 overall", meta_path)
    pairs = comp[(comp["layer"] == "bft") & (comp["tag"] == "") & (comp["stratum"] == "overall")
                 & (comp["metric"] == "HR@10")]
    passing = int((pairs["p_holm_seeds"] < ALPHA).sum())
    tested = len(pairs) == n_pairs and bool(pairs["p_holm_seeds"].notna().all())
    out.append(("BFT gains on all three backbones and six datasets",
                f"pooled HR@10 gain {gain_text(o['gain'])} {_ci(o['ci_lo'], o['ci_hi'])} (p {p_text(o['p'])}) over "
                f"{n_pairs} pairs; {passing} of {len(pairs)} pairs pass Holm over seeds",
                _verdict("not reproduced", _p_at_least(o["p"]) and tested and passing == 0,
                         "pooled p ≥ 0.05, and every pair tested with none passing Holm")))

    q0, hstu = _pooled(meta, meta_path, "HR@10 Q0"), _pooled(meta, meta_path, "HR@10 Q0", "hstu")
    out.append(("the largest gains are on rare items (Q0)",
                f"pooled Q0 HR@10 {gain_text(q0['gain'])} {_ci(q0['ci_lo'], q0['ci_hi'])} (p {p_text(q0['p'])}; "
                f"Holm over the three endpoints {p_text(q0['p_holm'])}) over "
                f"{_int(q0['pairs'], 'pairs of bft HR@10 Q0', meta_path)} pairs with enough hits; "
                f"HSTU {gain_text(hstu['gain'])} {_ci(hstu['ci_lo'], hstu['ci_hi'])} over "
                f"{_int(hstu['pairs'], 'pairs of bft HR@10 Q0 hstu', meta_path)} "
                f"(p {p_text(hstu['p'])}, Holm {p_text(hstu['p_holm'])})",
                _verdict("not reproduced (HSTU leans the other way)",
                         _p_at_least(q0["p"]) and hstu["gain"] < 0 and _finite(hstu["p"]) and hstu["p"] < ALPHA,
                         "pooled Q0 p ≥ 0.05 with HSTU's Q0 gain negative at p < 0.05")))

    cold = _pooled(meta, meta_path, "HR@10 cold")
    out.append(("the largest gains are for cold users",
                f"pooled cold-user HR@10 gain {gain_text(cold['gain'])} {_ci(cold['ci_lo'], cold['ci_hi'])} "
                f"(p {p_text(cold['p'])}) over {_int(cold['pairs'], 'pairs of bft HR@10 cold', meta_path)} pairs",
                _verdict("not reproduced", _p_at_least(cold["p"]), "pooled cold-user p ≥ 0.05")))

    out.append(_snr_row(snr))
    out.append(_beyond_row(replication, snr))
    out.append(_equal_budget_row(equal_budget))
    out.append(_k_row(main))
    out.append(_replication_row(comp, comp_path, replication))
    out.append(_power_row(o, q0, pairs, positive_control))
    return out


def _power_row(pooled: pd.Series, pooled_q0: pd.Series, pairs: pd.DataFrame,
               positive_control: Path) -> tuple[str, str, str]:
    """What the benchmark could have detected: the pooled MDEs (overall, Q0), the per-pair overall MDE ranges by
    backbone (SASRec apart), and the positive control's oracle against the BFT arms for the noisy users. The rule
    reads them all: the oracle's gain is seen (positive, p < 0.05, interval above 0), the pooled overall test and
    every arm's test would detect a gain of the oracle's size, and every arm, on the oracle's seeds, stays below it
    (its interval's top under the oracle's gain) without a gain at p < 0.05."""
    path = positive_control / "readout.json"
    group = "noisy users"
    try:
        gains = json.loads(path.read_text())["gains"]
        oracle = [k for k in gains if k.startswith("oracle")]
        seeds = list(gains[oracle[0]]["seeds"]) if len(oracle) == 1 else []
        o = {k: gains[oracle[0]][group][k] for k in ("gain_seeds", "p_seeds", "ci")}
        arm = {k: {f: gains[k][group][f] for f in ("gain_seeds", "p_seeds", "ci", "mde_seeds")}
               for k in gains if k.startswith("bft") and not k.startswith("clean")}
        arm_seeds = {k: list(gains[k]["seeds"]) for k in arm}
        numbers = [o["gain_seeds"], o["p_seeds"], *o["ci"], *(v for a in arm.values() for v in
                                                            (a["gain_seeds"], a["p_seeds"], a["mde_seeds"], *a["ci"]))]
        if not seeds or not arm or not all(_finite(v) for v in numbers):
            raise ValueError("an oracle, its seeds, BFT arms or a number missing")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise SystemExit(f"verdict_table: {path} is not a readout with the oracle's and the BFT arms' '{group}' "
                         f"gains ({type(e).__name__}: {e}); rerun python results/positive_control/readout.py "
                         f"--root {positive_control}") from None

    def mde_range(models) -> str:
        m = pairs.loc[pairs["model"].isin(models), "mde_seeds"]
        return f"{100 * m.min():.1f}–{100 * m.max():.1f}%" if m.notna().any() else "–"

    lo, hi = min(a["gain_seeds"] for a in arm.values()), max(a["gain_seeds"] for a in arm.values())
    significant = sum(a["p_seeds"] < ALPHA for a in arm.values())
    size = o["gain_seeds"]
    seen = size > 0 and o["p_seeds"] < ALPHA and o["ci"][0] > 0
    powered = _finite(pooled["mde"]) and pooled["mde"] < size and all(a["mde_seeds"] < size for a in arm.values())
    below = all(a["ci"][1] < size and not (a["gain_seeds"] > 0 and a["p_seeds"] < ALPHA) for a in arm.values())
    same_seeds = all(s == seeds for s in arm_seeds.values())
    others = sorted(set(pairs["model"]) - {"sasrec"})
    return ("(power) a real effect would have been seen",
            f"pooled tests detect {gain_text(pooled['mde']).lstrip('+')} overall and "
            f"{gain_text(pooled_q0['mde']).lstrip('+')} on Q0 at power 0.8; one pair's overall test over "
            f"{int(pairs['seeds'].max())} seeds {mde_range(['sasrec'])} (SASRec), {mde_range(others)} "
            f"({', '.join(name(m) for m in others)}); positive control (`{positive_control}/`, planted unreliable "
            f"items and noisy users, {len(seeds)} seeds per arm): clean inputs gain "
            f"{gain_text(size)} {_ci(*o['ci'])} for the {group} (p_seeds {p_text(o['p_seeds'])}), "
            f"the {len(arm)} BFT arms {gain_text(lo)} to {gain_text(hi)} (detectable "
            f"{gain_text(max(a['mde_seeds'] for a in arm.values())).lstrip('+')} at most; {significant} with "
            f"p_seeds < {ALPHA:g})",
            _verdict("the benchmark detects such effects; BFT obtains none", seen and powered and below and same_seeds,
                     "the oracle's gain seen (p < 0.05, interval above 0) and within every test's reach, and every "
                     "BFT arm, on its seeds, below it with no gain at p < 0.05"))


def _snr_row(snr: Path) -> tuple[str, str, str]:
    sweep_path, trend_path = snr / "sweep" / "sweep.csv", snr / "sweep" / "trend.csv"
    sweep = _csv(sweep_path, ("layer", "value", "stratum", "gain_seeds"))
    trend = _csv(trend_path, ("layer", "stratum", "seeds", "slope_per_unit", "ci_lo", "ci_hi", "p_seeds"))
    where = _csv(snr / "tables" / "comparisons.csv", ("dataset", "model")).iloc[0]
    rates = sweep[(sweep["layer"] == "bft") & (sweep["stratum"] == "overall")].sort_values("value")
    if rates.empty:
        raise SystemExit(f"verdict_table: no bft overall rows in {sweep_path}; regenerate it (bftrec-report sweep)")
    t = _one(trend, trend_path, layer="bft", stratum="overall")
    step = 0.1  # the slope is per unit of the rate; the README reads it per +0.1
    gains = ", ".join(gain_text(g) for g in rates["gain_seeds"])
    return ("BFT's gain grows as the signal-to-noise ratio falls",
            f"SNR sweep (`{snr}/`): random items injected into {name(where['dataset'])}'s training histories at "
            f"rates {', '.join(f'{v:g}' for v in rates['value'])}, {name(where['model'])}, "
            f"{_int(t['seeds'], 'seeds of the trend', trend_path)} seeds: HR@10 gain {gains}; trend "
            f"{gain_text(step * t['slope_per_unit'])} per +{step:g} of the rate "
            f"{_ci(step * t['ci_lo'], step * t['ci_hi'])} (p {p_text(t['p_seeds'])})",
            _verdict("not seen", _p_at_least(t["p_seeds"]), "the trend's p ≥ 0.05"))


def _beyond_row(replication: Path, snr: Path) -> tuple[str, str, str]:
    tail, pop_col = "Δ tail_share@10 (95% CI, p_seeds)", "Δ popularity@10 (95% CI, p_seeds)"
    tests = {}
    for layer, folder in (("bft", "tables_bft_seeds3-7"), ("bft_h", "tables_seeds3-7")):
        path = replication / folder / "beyond_tests.csv"
        tests[layer] = _beyond_test(_one(_csv(path, (tail,)), path, layer=layer)[tail], path)
    pop_path = replication / "tables_bft_seeds3-7" / "beyond_tests.csv"
    pop = _beyond_test(_one(_csv(pop_path, (pop_col,)), pop_path, layer="bft")[pop_col], pop_path)
    means_path = replication / "tables_bft_seeds3-7" / "beyond.csv"
    means = _csv(means_path, ("layer", "tail_share@10"))
    share = {lay: float(str(_one(means, means_path, layer=lay)["tail_share@10"]).split(" ")[0])
             for lay in ("bft", "standard")}
    snr_path = snr / "tables" / "beyond_tests.csv"
    snr_tests = _csv(snr_path, ("dataset", "model", tail))
    if snr_tests.empty:
        raise SystemExit(f"verdict_table: no rows in {snr_path}; regenerate it (bftrec-report tables)")
    snr_p = min(_beyond_test(v, snr_path)[3] for v in snr_tests[tail])
    d, lo, hi, p = tests["bft"]
    d_h, _, _, p_h = tests["bft_h"]
    h_text = (f"`bft_h` too ({_pp(d_h)} pp, p {p_text(p_h)})" if d_h < 0 and p_h < ALPHA
              else f"`bft_h` {_pp(d_h)} pp (p {p_text(p_h)})")
    pop_text = (f"{'more' if pop[0] > 0 else 'less'} popular ones (p {p_text(pop[3])})" if pop[3] < ALPHA
                else f"as popular ones (p {p_text(pop[3])})")
    snr_text = ("no tail-share difference at any rate" if snr_p >= ALPHA
                else f"a tail-share difference at some rate (smallest p {p_text(snr_p)})")
    return ("(implied by the rare-item claim) BFT recommends rare items more",
            "beyond accuracy, exploratory (lists re-scored, seeds 3–7 of Sports HSTU, "
            f"`{replication}/README.md`): `bft`'s top-10 lists hold "
            f"{'fewer' if d < 0 else 'more'} tail items than `standard`'s, {_pp(d)} pp [{_pp(lo)}, {_pp(hi)}] "
            f"({100 * share['bft']:.2f}% against {100 * share['standard']:.2f}%, p_seeds {p_text(p)}), and "
            f"{pop_text}; {h_text}; {name(snr_tests['dataset'].iloc[0])} {name(snr_tests['model'].iloc[0])} "
            f"(SNR sweep): {snr_text}",
            _verdict("not seen (Sports HSTU: the other way)", d < 0 and p < ALPHA and snr_p >= ALPHA,
                     "fewer tail items for `bft` at p < 0.05, and no tail-share difference in the SNR sweep"))


def _equal_budget_row(equal_budget: Path) -> tuple[str, str, str]:
    eb_path = equal_budget / "comparisons.csv"
    eb = _csv(eb_path, ("layer", "stratum", "metric", "seeds", "gain_seeds", "p_seeds", "mde_seeds"))
    e_all = _one(eb, eb_path, layer="bft", tag="", stratum="overall", metric="HR@10")
    e_cold = _one(eb, eb_path, layer="bft", tag="", stratum="cold", metric="HR@10")
    trials, knobs = {}, {}
    for layer in ("standard", "bft"):  # the studies bftrec-tune wrote beside the tables: <study>/*_<layer>/
        found = sorted((equal_budget.parent / "study").glob(f"*_{layer}/trials.csv"))
        if len(found) != 1:
            raise SystemExit(f"verdict_table: {len(found)} studies of {layer} in {equal_budget.parent / 'study'} "
                             "(one expected: <name>_<layer>/trials.csv)")
        t = _csv(found[0], ("in_budget",))
        trials[layer] = int(t["in_budget"].astype(str).eq("True").sum())
        knobs[layer] = {c for c in t.columns if c.startswith("params_")}
    added = len(knobs["bft"] - knobs["standard"])
    budget = (f"{trials['bft']} Optuna trials each" if trials["bft"] == trials["standard"]
              else f"{trials['standard']} and {trials['bft']} Optuna trials")
    return ("(fairness) BFT was not handicapped by reusing `standard`'s hyperparameters",
            f"each layer tuned on its own, equal budgets ({budget}, BFT's {added} knobs added), "
            f"{name(e_all['dataset'])} {name(e_all['model'])}, {_int(e_all['seeds'], 'seeds', eb_path)} seeds: "
            f"HR@10 gain {gain_text(e_all['gain_seeds'])} {_ci(e_all['ci_lo_seeds'], e_all['ci_hi_seeds'])} "
            f"(p_seeds {p_text(e_all['p_seeds'])}; detectable {gain_text(e_all['mde_seeds']).lstrip('+')}), cold "
            f"users {gain_text(e_cold['gain_seeds'])} (p {p_text(e_cold['p_seeds'])}) (`{equal_budget.parent}/`)",
            _verdict("unchanged: no difference", trials["bft"] == trials["standard"] and _p_at_least(e_all["p_seeds"])
                     and _p_at_least(e_cold["p_seeds"]), "equal trials, and p_seeds ≥ 0.05 overall and on cold users"))


def _k_row(main: Path) -> tuple[str, str, str]:
    path = main / "mechanism.csv"
    mech = _csv(path, ("dataset", "model", "grouping", "stratum", "K bft"))
    tokens = mech[(mech["grouping"] == "history tokens") & (mech["tag"] == "")]
    k = {}
    for _, r in tokens[tokens["stratum"].isin(["Q0", "Q4"])].iterrows():
        text = str(r["K bft"]).split(" ")[0]
        if _finite(text):
            k[(r["dataset"], r["model"], r["stratum"])] = float(text)
    q0 = {(d, m): v for (d, m, s), v in k.items() if s == "Q0"}
    if not q0:
        raise SystemExit(f"verdict_table: no `bft` K on Q0 history tokens in {path}")
    diffs = [abs(v - k[(d, m, "Q4")]) for (d, m), v in q0.items() if (d, m, "Q4") in k]
    if not diffs:
        raise SystemExit(f"verdict_table: no pair with `bft` K on both Q0 and Q4 history tokens in {path}")
    lo, hi, most = min(q0.values()), max(q0.values()), max(diffs)
    return (f"K ≈ {PAPER_K} on rare items",
            f"trained K on Q0 history tokens {lo:.2f}–{hi:.2f} over {len(q0)} pairs; Q0 and Q4 differ by at most "
            f"{most:.3f} over the {len(diffs)} with both (`{path}`)",
            _verdict("in range, not in pattern", lo <= PAPER_K <= hi and most < FLAT_K and len(diffs) == len(q0),
                     f"{PAPER_K} within the Q0 range, and K on Q0 within {FLAT_K} of Q4 in every pair"))


def _replication_row(comp: pd.DataFrame, comp_path: Path, replication: Path) -> tuple[str, str, str]:
    key = dict(dataset="sports", model="hstu", tag="", stratum="cold", metric="HR@10")
    first = _one(comp, comp_path, layer="bft_h", **key)
    path = replication / "tables_seeds3-7" / "comparisons.csv"
    rep = _one(_csv(path), path, layer="bft_h", **key)
    bft_path = replication / "tables_bft_seeds3-7" / "comparisons.csv"
    v2 = _one(_csv(bft_path), bft_path, layer="bft", **key)
    seeds = parse_seed_gains(rep["seed_gains"], keep_nan=True)
    positive = sum(g > 0 for g in seeds.values() if math.isfinite(g))
    cells = len(list((replication / "runs").glob("sports/hstu/*/seed*/metrics.json")))
    expected = 3 * len(PREREGISTERED_SEEDS)  # standard, bft_h and bft on every pre-registered seed
    as_registered = (list(seeds) == list(PREREGISTERED_SEEDS)
                     and list(parse_seed_gains(v2["seed_gains"], keep_nan=True)) == list(PREREGISTERED_SEEDS))
    seeds0 = list(parse_seed_gains(first["seed_gains"], keep_nan=True))
    return ("(our ablation) v1 units, Sports HSTU, cold users",
            f"seeds {min(seeds0)}–{max(seeds0)}, which selected it: `bft_h` "
            f"{gain_text(first['gain_seeds'])}, p_seeds {p_text(first['p_seeds'])}, p_Holm "
            f"{p_text(first['p_holm_seeds'])}; **pre-registered replication, seeds {min(seeds)}–{max(seeds)}: "
            f"{gain_text(rep['gain_seeds'])} {_ci(rep['ci_lo_seeds'], rep['ci_hi_seeds'])}, p_seeds "
            f"{p_text(rep['p_seeds'])}, p_Holm {p_text(rep['p_holm_seeds'])}** (positive on {positive} of "
            f"{len(seeds)} seeds; detectable {gain_text(rep['mde_seeds']).lstrip('+')}); `bft` (v2) on the same "
            f"seeds: {gain_text(v2['gain_seeds'])} {_ci(v2['ci_lo_seeds'], v2['ci_hi_seeds'])}, p_Holm "
            f"{p_text(v2['p_holm_seeds'])}",
            _verdict(f"not replicated: the pre-registered test fails ({cells} of {expected} cells in; "
                     f"`{replication}/README.md`)",
                     _p_at_least(rep["p_holm_seeds"]) and cells == expected and as_registered,
                     "p_Holm ≥ 0.05 on the pre-registered seeds 3–7 (both layers), every cell in"))


POOLED = [("HR@10 overall", b) for b in ("all", "sasrec", "bert4rec", "hstu")] + \
    [("HR@10 Q0", "all"), ("HR@10 Q0", "hstu"), ("HR@10 cold", "all")]
ENDPOINT_NAMES = {"HR@10 overall": "overall", "HR@10 Q0": "Q0 (rarest items)", "HR@10 cold": "cold users"}


def pooled_table(main: Path) -> str:
    """docs/results.md §1.1: the ``POOLED`` rows of ``<main>/meta.csv`` (see the module docstring)."""
    path = main / "meta.csv"
    meta = _csv(path, ("layer", "endpoint", "backbones", "pairs", "pairs_left_out", "gain", "ci_lo", "ci_hi", "p",
                       "p_holm", "i2", "mde"))
    lines = ["| endpoint | pairs | pooled gain | 95% CI | p | p_Holm (3 endpoints) | I² | detectable at power 0.8 |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for endpoint, backbones in POOLED:
        r = _pooled(meta, path, endpoint, backbones)
        n = _int(r["pairs"], f"pairs of {endpoint} {backbones}", path)
        left = _int(r["pairs_left_out"], f"pairs_left_out of {endpoint} {backbones}", path)
        pairs = f"{n} of {n + left}" if left else str(n)
        who = "all backbones" if backbones == "all" else name(backbones)
        i2 = f"{100 * r['i2']:.0f}%" if _finite(r["i2"]) else "–"
        lines.append(f"| {ENDPOINT_NAMES[endpoint]}, {who} | {pairs} | {gain_text(r['gain'])} | "
                     f"{_ci(r['ci_lo'], r['ci_hi'])} | {p_text(r['p'])} | {p_text(r['p_holm'])} | "
                     f"{i2} | {gain_text(r['mde']).lstrip('+')} |")
    return "\n".join(lines)


def table(main: Path, snr: Path, replication: Path, equal_budget: Path, positive_control: Path) -> str:
    lines = ["| the paper's claim | evidence (seed as the unit; main grid unless named) | verdict |", "|---|---|---|"]
    lines += [f"| {c} | {e} | {v} |" for c, e, v in rows(main, snr, replication, equal_budget, positive_control)]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line (``scripts/check_tables.py`` parses quoted commands with it)."""
    ap = argparse.ArgumentParser(prog="verdict_table.py", description=__doc__.split("\n")[0])
    ap.add_argument("--main", type=Path, required=True, help="the main grid's bftrec-report tables folder")
    ap.add_argument("--snr", type=Path, help="the SNR sweep's folder (sweep/ and tables/)")
    ap.add_argument("--replication", type=Path,
                    help="the replication's folder (runs/, tables_seeds3-7/, tables_bft_seeds3-7/)")
    ap.add_argument("--equal-budget", type=Path, help="the equal-budget study's tables folder")
    ap.add_argument("--positive-control", type=Path, help="the positive control's folder (readout.json)")
    ap.add_argument("--pooled", action="store_true", help="the pooled rows of <main>/meta.csv instead (--main only)")
    return ap


def render(args: argparse.Namespace) -> str:
    """What ``main`` prints for parsed ``args`` (``check_tables`` calls it)."""
    others = {"--snr": args.snr, "--replication": args.replication, "--equal-budget": args.equal_budget,
              "--positive-control": args.positive_control}
    if args.pooled:
        if any(others.values()):
            raise SystemExit("verdict_table: --pooled reads --main only; drop " +
                             ", ".join(k for k, v in others.items() if v))
        return pooled_table(args.main)
    missing = [k for k, v in others.items() if v is None]
    if missing:
        raise SystemExit(f"verdict_table: give {', '.join(missing)} (or --pooled for the pooled rows alone)")
    return table(args.main, args.snr, args.replication, args.equal_budget, args.positive_control)


def inputs(args: argparse.Namespace) -> list[Path]:
    """The paths a command reads (``check_tables``: a command whose inputs are not in the checkout fails)."""
    return [p for p in (args.main, args.snr, args.replication, args.equal_budget, args.positive_control)
            if p is not None]


def main(argv: list[str] | None = None) -> int:
    return print_table(parser(), render, argv)


if __name__ == "__main__":
    sys.exit(main())
