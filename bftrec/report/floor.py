"""The floor table of ``bftrec-report tables`` (issue 48 item 1): every model's ``standard`` layer side by side,
stratum by stratum, so that each trained backbone stands next to the counted floor (``pop``, ``markov``) and the
recurrent baseline (``gru4rec``) on the same test users.

One row per (dataset, tag, stratum), the strata of ``strata.csv`` (the union over the models): overall, the
item-frequency bins of the test target (Q0 the rarest), cold and warm users. Per metric (HR@10, NDCG@10), one
column per model: the mean over the seeds of its ``standard`` cell (a tagged row takes a model's untagged cell
where it has no tagged one, as ``runs.baseline`` does; the spread and the tests are in ``overall`` and ``strata``;
a counted model has one seed, as the seed changes nothing). Columns: the counted models first (no parameters:
``runs.is_counted``), then the trained ones, each group by name. ``best HR@10`` names the model(s) with the
highest mean as printed (ties: all), among the models with a value there, ``–`` where none has a hit. Where a
model's stratum holds other users than the row's (another bin or user count: another protocol), its value names
them (``0.0123 (bin 0-5)``) and is left out of ``best``; the row's users are those most models share (ties: the
first in column order). Written as ``floor.md`` and ``floor.csv`` when the runs hold the ``standard`` layer of a
counted model and of at least one other model (a table of Transformers alone has no floor: ``overall`` has it).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bftrec.report.runs import STANDARD, is_counted, strata_of, stratum_value

METRICS = ("HR@10", "NDCG@10")


def _counted(groups: dict) -> dict[str, bool]:
    """Each model with a ``standard`` cell in ``groups`` (``runs.cells``' {(dataset, model, tag, layer): [run, …]}):
    whether it is counted (``runs.is_counted``)."""
    return {k[1]: is_counted(rs[0]) for k, rs in groups.items() if k[3] == STANDARD}


def floor_models(groups: dict) -> list[str]:
    """The models with a ``standard`` cell in ``groups``, counted ones first, then trained ones, each by name."""
    counted = _counted(groups)
    return sorted(counted, key=lambda m: (not counted[m], m))


def _mean(values: list) -> float | None:
    v = [x for x in values if x is not None and not math.isnan(x)]
    return float(np.mean(v)) if v else None


def _order(name: str) -> tuple:
    """overall, then the item-frequency bins in order (Q0, Q1, …), then cold and warm users."""
    if name == "overall":
        return (0, 0, name)
    if name in ("cold", "warm"):
        return (2, 0 if name == "cold" else 1, name)
    return (1, int(name[1:]) if name[1:].isdigit() else 0, name)


def _cells(groups: dict, ds: str, tag: str, models: list[str]) -> dict[str, list[dict]]:
    """Each model's ``standard`` runs on (dataset, tag), else its untagged ones (as ``runs.baseline``)."""
    got = {m: groups.get((ds, m, tag, STANDARD)) or groups.get((ds, m, "", STANDARD)) for m in models}
    return {m: rs for m, rs in got.items() if rs}


def floor_table(groups: dict) -> pd.DataFrame:
    """One row per (dataset, tag, stratum); per metric one column per model (mean over the seeds of its
    ``standard`` cell, 4 decimals, ``–`` where the model has no cell or no value; a value on other users than the
    row's, another bin or another user count, names them), and ``best HR@10`` over the printed values on the
    row's own users (ties: all). The strata are the union over the models; a row's users are those most models
    share. Returns an empty frame with fewer than
    two models or without a counted one."""
    models = floor_models(groups)
    if len(models) < 2 or not any(_counted(groups).values()):
        return pd.DataFrame()
    rows = []
    for ds, tag in sorted({(k[0], k[2]) for k in groups if k[3] == STANDARD}):
        present = _cells(groups, ds, tag, models)
        own = {m: {n: (w, r) for n, w, r in strata_of(rs[0])} for m, rs in present.items()}  # name -> (where, range)
        seen = {}  # name -> [(range, users) of each model that has it, in column order]
        for m, strata in own.items():
            for name, (where, rng) in strata.items():
                seen.setdefault(name, []).append((rng, stratum_value(present[m][0], where, "n_users")))
        for name in sorted(seen, key=_order):
            rng, users = max(seen[name], key=seen[name].count)  # most models' users; ties: the first
            row = {"dataset": ds, "tag": tag, "stratum": name, "range": rng, "users": users}
            best = {}
            for metric in METRICS:
                for m in models:
                    row[f"{metric} {m}"], mean = _value(present.get(m), own.get(m, {}), name, (rng, users), metric)
                    if metric == "HR@10" and mean is not None:
                        best[m] = round(mean, 4)  # as printed: a tie on the page is a tie here
            top = max(best.values(), default=0.0)
            row["best HR@10"] = ", ".join(m for m, v in best.items() if v == top) if top > 0 else "–"
            rows.append(row)
    return pd.DataFrame(rows)


def _value(runs: list[dict] | None, own: dict, name: str, ref: tuple, metric: str) -> tuple[str, float | None]:
    """(cell text, mean or None) of ``metric`` on the stratum ``name`` in ``runs``, whose strata are ``own`` (name
    -> (where, range), from ``strata_of``). ``ref``: the row's (range, users); where the model's differ, the text
    names its own and the mean is None (not comparable for best)."""
    if not runs or name not in own:
        return "–", None
    where, rng = own[name]
    mean = _mean([stratum_value(r, where, metric) for r in runs])
    if mean is None:
        return "–", None
    users = stratum_value(runs[0], where, "n_users")
    notes = ([f"bin {rng}"] if rng != ref[0] else []) + ([f"{users} users"] if users != ref[1] else [])
    return (f"{mean:.4f} ({', '.join(notes)})", None) if notes else (f"{mean:.4f}", mean)


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
