"""The per-run result at a glance: one Markdown table of the test split (``summary.md``, also logged).

Rows: overall, the item-frequency strata Q0 (rarest) .. Q{n-1} with their training-count ranges,
cold and warm users (DESIGN.md "Evaluation protocol"). Columns: users, HR@K and NDCG@K at the
headline cut-off (10 when computed), and for a BFT run the mean Kalman gain K and initial precision
λ⁰ over the history tokens of that stratum (BFT.md §6; ``bftrec.mechanism``). Numbers come from
the metrics dict written to ``metrics.json``, nothing else.
"""
from __future__ import annotations

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
    return {"K": sum(ks) / len(ks) if ks else None,
            "lam0": sum(p["lam0"] * p["n_tokens"] for p in parts) / n if n else None}


def summary_frame(metrics: dict) -> pd.DataFrame:
    """One row per stratum of ``metrics["test"]`` (and ``metrics["mechanism"]`` for BFT runs)."""
    test, mech = metrics["test"], metrics.get("mechanism")
    k = _k(test["overall"])
    cold, warm = test["cold_users"], test["warm_users"]
    rows = [("overall", "all", test["overall"], _overall_mechanism(mech) if mech else None)]
    for i, b in enumerate(test["by_item_freq"]):
        rows.append((str(b["bin"]), f"train count {_count_range(b)}", b,
                     mech["by_item_freq"][i] if mech else None))
    rows.append(("cold users", f"history ≤ {cold['max_history']}", cold, mech["cold_users"] if mech else None))
    rows.append(("warm users", f"history ≥ {cold['max_history'] + 1}", warm, mech["warm_users"] if mech else None))
    out = []
    for name, what, m, mm in rows:
        row = {"stratum": name, "range": what, "users": m["n_users"],
               f"HR@{k}": m.get(f"HR@{k}"), f"NDCG@{k}": m.get(f"NDCG@{k}")}
        if mech:
            row["K"], row["λ⁰"] = (mm or {}).get("K"), (mm or {}).get("lam0")
        out.append(row)
    return pd.DataFrame(out)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1e3 or (v != 0 and abs(v) < 1e-3) else f"{v:.4f}"
    return str(v)


def summary_markdown(metrics: dict, title: Optional[str] = None) -> str:
    """The table as GitHub Markdown (``tabulate`` via ``DataFrame.to_markdown``), with a title line.

    The title defaults to ``<dataset> / <model> / <layer>, seed <k>, best epoch <e>``.
    Raises KeyError when ``metrics`` lacks ``test`` (not a metrics dict of bftrec-train/-eval).
    """
    df = summary_frame(metrics).map(_fmt)
    if title is None:
        title = (f"{metrics.get('dataset')} / {metrics.get('model')} / {metrics.get('layer')}, "
                 f"seed {metrics.get('seed')}, best epoch {metrics.get('best_epoch')} (test split)")
    note = "" if "mechanism" not in metrics else \
        "\n\nK, λ⁰: mean Kalman gain and initial precision over the stratum's history tokens."
    return f"{title}\n\n{df.to_markdown(index=False, disable_numparse=True)}{note}\n"
