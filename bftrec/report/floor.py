"""The floor table of ``bftrec-report tables`` (issue 48 item 1): every model's ``standard`` layer side by side,
stratum by stratum, so that each trained backbone stands next to the counted floor (``pop``, ``markov``) and the
recurrent baseline (``gru4rec``) on the same test users.

One row per (dataset, tag, stratum), the strata of ``strata.csv``: overall, the item-frequency bins of the test
target (Q0 the rarest), cold and warm users. Per metric (HR@10, NDCG@10), one column per model: the mean over the
seeds of its ``standard`` cell (the spread and the tests are in ``overall`` and ``strata``; a counted model has
one seed, as the seed changes nothing). Columns: the counted models first (no parameters: ``runs.is_counted``),
then the trained ones, each group by name. ``best HR@10`` names the model(s) with the highest mean, ``–`` where no
model has a hit. Where a model's runs bin the item frequencies differently from the row's (another protocol), its
value carries its own bin (``0.0123 (bin 0-5)``). Written as ``floor.md`` and ``floor.csv`` when the runs hold the
``standard`` layer of more than one model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from bftrec.report.runs import STANDARD, is_counted, strata_of, stratum_value

METRICS = ("HR@10", "NDCG@10")


def floor_models(groups: dict) -> list[str]:
    """The models with a ``standard`` cell in ``groups`` (``runs.cells``' {(dataset, model, tag, layer): [run, …]}),
    counted ones first, then trained ones, each by name."""
    counted = {k[1]: is_counted(rs[0]) for k, rs in groups.items() if k[3] == STANDARD}
    return sorted(counted, key=lambda m: (not counted[m], m))


def _mean(values: list) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.mean(v)) if v else None


def floor_table(groups: dict) -> pd.DataFrame:
    """One row per (dataset, tag, stratum); per metric one column per model (mean over the seeds of its
    ``standard`` cell, 4 decimals, ``–`` where the model has no cell or no value), and ``best HR@10``. Returns an
    empty frame with fewer than two models."""
    models = floor_models(groups)
    if len(models) < 2:
        return pd.DataFrame()
    rows = []
    for ds, tag in sorted({(k[0], k[2]) for k in groups if k[3] == STANDARD}):
        present = {m: groups[(ds, m, tag, STANDARD)] for m in models if (ds, m, tag, STANDARD) in groups}
        first = next(iter(present.values()))[0]
        for name, where, rng in strata_of(first):
            row = {"dataset": ds, "tag": tag, "stratum": name, "range": rng,
                   "users": stratum_value(first, where, "n_users")}
            means = {}
            for metric in METRICS:
                for m in models:
                    row[f"{metric} {m}"], mean = _value(present.get(m), name, rng, metric)
                    if metric == "HR@10" and mean is not None:
                        means[m] = mean
            top = max(means.values(), default=0.0)
            row["best HR@10"] = ", ".join(m for m, v in means.items() if v == top) if top > 0 else "–"
            rows.append(row)
    return pd.DataFrame(rows)


def _value(runs: list[dict] | None, name: str, rng: str, metric: str) -> tuple[str, float | None]:
    """(cell text, mean) of ``metric`` on the stratum called ``name`` in ``runs``; its own bin named where its
    range is not ``rng``."""
    if not runs:
        return "–", None
    own = {n: (w, r) for n, w, r in strata_of(runs[0])}
    if name not in own:
        return "–", None
    where, own_rng = own[name]
    mean = _mean([stratum_value(r, where, metric) for r in runs])
    if mean is None:
        return "–", None
    return f"{mean:.4f}" + (f" (bin {own_rng})" if own_rng != rng else ""), mean


def floor_note(groups: dict) -> str:
    """The header line of ``floor.md``: what a value is, and each model's seeds (``sasrec 3``, ``2–3`` where the
    datasets differ)."""
    seeds = {}
    for k, rs in groups.items():
        if k[3] == STANDARD:
            seeds.setdefault(k[1], set()).add(len(rs))
    per = ", ".join(f"{m} {min(seeds[m])}" + (f"–{max(seeds[m])}" if len(seeds[m]) > 1 else "")
                    for m in floor_models(groups))
    return ("- each model's `standard` layer, test metrics, mean over seeds (std and tests: overall.md, strata.md); "
            f"counted models (no parameters) first; seeds: {per}")
