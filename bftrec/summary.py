"""The per-run result at a glance: one Markdown table of the test split (``summary.md``, also logged).

Rows: overall, the item-frequency strata Q0 (rarest) .. Q{n-1} of the test target with their
training-count ranges, cold and warm users (DESIGN.md "Evaluation protocol"). Columns: users, HR@K and
NDCG@K at the headline cut-off (10 when computed), and for a BFT run the mean Kalman gain K and initial
precision λ⁰ at the scoring position of the same users (``mechanism.at_target``: one grouping per
row). A second table gives the mechanism over the history tokens, each token by its own item's
training count (BFT.md §6; ``bftrec.mechanism``). Numbers come from the metrics dict written to
``metrics.json``, nothing else.
"""
from __future__ import annotations

import math
from typing import Optional

import pandas as pd


def _count_range(b: dict) -> str:
    if b.get("hi") is None:
        return "(empty)"
    return f"{b['lo']}" if b["lo"] == b["hi"] else f"{b['lo']}–{b['hi']}"


def _k(overall: dict) -> int:
    """The headline cut-off: 10 if computed, else the smallest K present."""
    ks = sorted(int(k.split("@")[1]) for k in overall if k.startswith("HR@"))
    return 10 if 10 in ks else ks[0]


def _overall_mechanism(mech: dict) -> dict:
    """K over all history tokens (mean of the per-layer means) and λ⁰ (token-weighted over cold + warm)."""
    ks = [lay["K"] for lay in mech["per_layer"] if lay["K"] is not None]
    parts = [mech[u] for u in ("cold_users", "warm_users") if mech[u]["lam0"] is not None]
    n = sum(p["n_tokens"] for p in parts)
    return {"n_tokens": n, "K": sum(ks) / len(ks) if ks else None,
            "lam0": sum(p["lam0"] * p["n_tokens"] for p in parts) / n if n else None}


def _test_strata(test: dict) -> list[tuple[str, str, int | None]]:
    """(name, range, index into by_item_freq or None) of the test strata, in table order."""
    cold = test["cold_users"]
    return ([("overall", "all", None)]
            + [(str(b["bin"]), f"train count {_count_range(b)}", i) for i, b in enumerate(test["by_item_freq"])]
            + [("cold users", f"history ≤ {cold['max_history']}", None),
               ("warm users", f"history ≥ {cold['max_history'] + 1}", None)])


def _pick(block: dict, name: str, i: int | None, bins_key: str, overall) -> dict:
    if i is not None:
        return block[bins_key][i]
    return {"overall": overall, "cold users": block["cold_users"], "warm users": block["warm_users"]}[name]


def summary_frame(metrics: dict) -> pd.DataFrame:
    """One row per stratum of ``metrics["test"]``: users, HR@K, NDCG@K; for a BFT run whose mechanism has
    ``at_target`` also K and λ⁰ at the scoring position of the same users (the same grouping: the test
    target's bin, cold/warm user). The by-token mechanism is ``token_mechanism_frame``, never in these rows."""
    test, mech = metrics["test"], metrics.get("mechanism")
    at = (mech or {}).get("at_target")
    k = _k(test["overall"])
    out = []
    for name, what, i in _test_strata(test):
        m = _pick(test, name, i, "by_item_freq", test["overall"])
        row = {"stratum": name, "range": what, "users": m["n_users"],
               f"HR@{k}": m.get(f"HR@{k}"), f"NDCG@{k}": m.get(f"NDCG@{k}")}
        if at:
            mm = _pick(at, name, i, "by_target_freq", at["overall"])
            row["K at target"], row["λ⁰ at target"] = mm.get("K"), mm.get("lam0")
        out.append(row)
    return pd.DataFrame(out)


def token_mechanism_frame(metrics: dict) -> pd.DataFrame | None:
    """BFT runs: one row per stratum of the history tokens (each token by its own item's training count;
    cold/warm by the token's user): tokens, mean K, mean λ⁰. None for a run without a mechanism block."""
    mech = metrics.get("mechanism")
    if not mech:
        return None
    test = metrics["test"]
    out = []
    for name, what, i in _test_strata(test):
        mm = _pick(mech, name, i, "by_item_freq", _overall_mechanism(mech))
        out.append({"history tokens": name, "range": what.replace("history", "user history"),
                    "tokens": mm.get("n_tokens"), "K": mm.get("K"), "λ⁰": mm.get("lam0")})
    return pd.DataFrame(out)


def _decimals(values) -> int | None:
    """Decimals for one column: 4, or enough for 3 significant digits of its smallest non-zero |value|; None
    (scientific notation, 3 significant digits) where that value is below 1e-6, as a collapsed precision can
    be. So a column never mixes ``0.0009766`` with ``0.0112``, nor shows a tiny value as zero."""
    small = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0]
    if not small or min(small) >= 1e-3:
        return 4
    if min(small) < 1e-6:
        return None
    return 2 - math.floor(math.log10(min(small)))


def _fmt(v, decimals: int | None = 4) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, float):
        return f"{v:.2e}" if decimals is None else f"{v:.{decimals}f}"
    return str(v)


def _fmt_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Each column in one fixed-point format (``_decimals``); counts as integers; missing as "–"."""
    def column(col: pd.Series) -> pd.Series:
        decimals = _decimals(list(col))
        return col.map(lambda v: _fmt(v, decimals))
    return df.apply(column)


def summary_markdown(metrics: dict, title: Optional[str] = None) -> str:
    """The table as GitHub Markdown (``tabulate`` via ``DataFrame.to_markdown``), with a title line.

    The title defaults to ``<dataset> / <model> / <layer>, seed <k>, best epoch <e>``.
    Raises KeyError when ``metrics`` lacks ``test`` (not a metrics dict of bftrec-train/-eval).
    """
    df = _fmt_frame(summary_frame(metrics))
    if title is None:
        title = (f"{metrics.get('dataset')} / {metrics.get('model')} / {metrics.get('layer')}, "
                 f"seed {metrics.get('seed')}, best epoch {metrics.get('best_epoch')} (test split)")
    text = f"{title}\n\n{df.to_markdown(index=False, disable_numparse=True)}\n"
    if "K at target" in df:
        text += ("\nK, λ⁰ at target: mean Kalman gain and initial precision at the scoring position of the "
                 "stratum's users (grouped like the metrics: by the test target's training count).\n")
    tok = token_mechanism_frame(metrics)
    if tok is not None:
        text += ("\nBFT mechanism by history token (each token grouped by its own item's training count, "
                 f"not by the target):\n\n{_fmt_frame(tok).to_markdown(index=False, disable_numparse=True)}\n")
    return text
