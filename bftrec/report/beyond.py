"""Beyond-accuracy tables of ``bftrec-report tables`` (issue 48 item 2): what the top-K lists hold.

- ``beyond_table``: per cell, coverage, tail share, mean popularity and Gini of the top-K lists (overall; the
  definitions are in ``bftrec/beyond.py``), mean ± std over seeds;
- ``beyond_tests``: per layer against ``standard``, the mean per-seed difference of each metric (layer − standard,
  paired by seed, in the metric's own units), its 95% t interval over seeds and the two-sided t-test over seeds
  (the seed is the unit: the lists of one trained model are fixed, so there is no user resampling here). These
  rows are exploratory (no pre-registration, no Holm).

A run written before the metric gets its block from a re-score in its own folder (``bftrec-eval <run> --out
<run>/eval_beyond``; ``runs.rescored_beyond``), and the tables say how many runs took it from there.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from bftrec.report.cells import fmt, pval
from bftrec.report.runs import BEYOND_METRICS as METRICS
from bftrec.report.runs import STANDARD, baseline
from bftrec.report.stats import MIN_SEEDS, seed_t_half, seed_t_p


def _digits(name: str) -> int:
    return 1 if name == "popularity" else 4


def _with_beyond(runs: list[dict]) -> list[dict]:
    return [r for r in runs if "beyond_accuracy" in r]


def _source(runs: list[dict], n_runs: int) -> str:
    """``run`` when every run wrote the block itself, else how many came from a re-score; ``n_runs``: the cell's
    runs, so that runs without lists (an old run with no usable re-score) are counted, not silently dropped."""
    n = sum(1 for r in runs if "from" in r["beyond_accuracy"])
    text = "run" if n == 0 else f"re-score ({n} of {len(runs)})"
    return text if len(runs) == n_runs else f"{text}; {n_runs - len(runs)} of {n_runs} runs without lists"


def beyond_table(groups: dict) -> pd.DataFrame:
    """One row per cell whose runs have ``beyond_accuracy``: the four metrics overall, mean ± std over seeds.

    groups: ``runs.cells``' {(dataset, model, tag, layer): [run, …]}. Returns an empty frame when no run
    has the block."""
    rows = []
    for key, rs_all in sorted(groups.items()):
        rs = _with_beyond(rs_all)
        if not rs:
            continue
        k = rs[0]["beyond_accuracy"]["k"]
        row = {"dataset": key[0], "model": key[1], "tag": key[2], "layer": key[3], "seeds": len(rs),
               "lists from": _source(rs, len(rs_all))}
        for name in METRICS:
            row[f"{name}@{k}"] = fmt([r["beyond_accuracy"]["overall"][f"{name}@{k}"] for r in rs], _digits(name))
        rows.append(row)
    return pd.DataFrame(rows)


def paired_differences(runs: list[dict], base: list[dict], col: str) -> list[float]:
    """Per seed present on both sides (ascending seed), ``runs``' overall ``col`` minus ``base``'s."""
    a = {r["seed"]: r["beyond_accuracy"]["overall"][col] for r in _with_beyond(runs)}
    b = {r["seed"]: r["beyond_accuracy"]["overall"][col] for r in _with_beyond(base)}
    return [a[s] - b[s] for s in sorted(a.keys() & b.keys()) if a[s] is not None and b[s] is not None]


def difference_cell(diffs: list[float], digits: int) -> str:
    """``+0.0012 [−0.0003, +0.0027], p 0.12`` (mean, 95% t interval over seeds, t-test over seeds);
    ``+0.0012 (1 seed: no test)`` below ``MIN_SEEDS`` pairs; ``–`` with none."""
    if not diffs:
        return "–"
    mean = float(np.mean(diffs))
    if len(diffs) < MIN_SEEDS:
        return f"{mean:+.{digits}f} ({len(diffs)} seed: no test)"
    half, p = seed_t_half(diffs), seed_t_p(diffs)
    return f"{mean:+.{digits}f} [{mean - half:+.{digits}f}, {mean + half:+.{digits}f}], p {pval(p)}"


def beyond_tests(groups: dict) -> pd.DataFrame:
    """One row per non-standard layer with beyond-accuracy runs and a ``standard`` baseline that has them:
    per metric, the paired per-seed difference (``difference_cell``). Returns an empty frame without any."""
    rows = []
    for key, rs in sorted(groups.items()):
        base = baseline(groups, key)
        if key[3] == STANDARD or not base or not _with_beyond(rs) or not _with_beyond(base):
            continue
        k = _with_beyond(rs)[0]["beyond_accuracy"]["k"]
        row = {"dataset": key[0], "model": key[1], "tag": key[2], "layer": key[3],
               "paired seeds": len(paired_differences(rs, base, f"coverage@{k}"))}
        for name in METRICS:
            row[f"Δ {name}@{k} (95% CI, p_seeds)"] = difference_cell(
                paired_differences(rs, base, f"{name}@{k}"), _digits(name))
        rows.append(row)
    return pd.DataFrame(rows)
