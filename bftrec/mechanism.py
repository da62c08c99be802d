"""BFT mechanism statistics (BFT.md §6): Kalman gain K and initial precision λ⁰ by stratum.

A BFT stack fills the ``mech`` dict of a forward with
- ``units``: ``bft.units`` of the layer (``count``: precisions are counts of observations, BFT.md §7;
  ``h``: in the units of h, v1);
- ``lam0``: (B, L) float32, λ̄⁰, the geometric mean of λ⁰ over D (0 on padding);
- ``layers``: one dict per layer with ``K`` (B, L) float32 mean over D, ``lam_obs`` (B, L) float32
  λ̄^obs, the geometric mean over D (BFT.md §6: a few extreme coordinates do not decide it), ``n_eff``
  (B, L) float32 Kish effective sample size averaged over heads, and ``Q`` (D,) float32 process noise.
The evaluator collects these on the test histories and aggregates them over real tokens: per layer,
by the item-frequency bin of each token's item (the same count thresholds as the test strata), and
by cold versus warm user (arithmetic means over tokens of those per-token values). Standard layers fill
nothing and get no ``mechanism`` block.
"""
from __future__ import annotations

import numpy as np

from bftrec.metrics import assign_item_bins


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def aggregate_mechanism(sink: list, train_counts: np.ndarray, bins: list[dict],
                        history_len: np.ndarray, cold_max_history: int) -> dict:
    """Aggregate collected mechanism chunks over real tokens.

    Args:
        sink: list of {"mech": dict, "item_seq": (B, L) int64 tensor, "users": (B,) int64 array}.
        train_counts: (N + 1,) int64 training counts per item id.
        bins: the test strata's item-frequency bins (``metrics.item_freq_bins``).
        history_len: (U,) int64 test history length per user index.
        cold_max_history: users whose history length is <= this are cold.
    Returns:
        JSON-ready {"units", "precision_summary", "per_layer": [{"layer", "K", "lam_obs", "n_eff", "Q_mean"}],
        "by_item_freq": [{"bin", "lo", "hi", "n_tokens", "K", "K_per_layer", "lam0"}],
        "cold_users": {"max_history", "n_tokens", "K", "lam0"}, "warm_users": {...}}.
        K without a layer index is the mean over layers.
    """
    items, lam0, users, per_layer = [], [], [], {"K": [], "lam_obs": [], "n_eff": []}
    for chunk in sink:
        valid = (chunk["item_seq"] != 0).cpu().numpy()  # (B, L)
        items.append(chunk["item_seq"].cpu().numpy()[valid])
        lam0.append(chunk["mech"]["lam0"].float().cpu().numpy()[valid])
        users.append(np.repeat(chunk["users"], valid.sum(1)))
        for key, acc in per_layer.items():
            acc.append(np.stack([lay[key].float().cpu().numpy()[valid] for lay in chunk["mech"]["layers"]]))
    q = [lay["Q"].float().cpu().numpy() for lay in sink[-1]["mech"]["layers"]]
    items_a, lam0_a, users_a = np.concatenate(items), np.concatenate(lam0), np.concatenate(users)
    st = {k: np.concatenate(v, axis=1) for k, v in per_layer.items()}  # each (n_layers, tokens)
    k_all = st["K"]
    out: dict = {"units": sink[-1]["mech"].get("units"),
                 "precision_summary": "lam0, lam_obs: per token the geometric mean over D (BFT.md §6), "
                                      "then the arithmetic mean over tokens",
                 "per_layer": [{"layer": i, "K": _mean(k_all[i]), "lam_obs": _mean(st["lam_obs"][i]),
                                "n_eff": _mean(st["n_eff"][i]), "Q_mean": float(q[i].mean())}
                               for i in range(len(k_all))], "by_item_freq": []}
    tok_bin = assign_item_bins(train_counts[items_a], bins)
    for b, info in enumerate(bins):
        sel = tok_bin == b
        out["by_item_freq"].append({"bin": info["bin"], "lo": info["lo"], "hi": info["hi"],
                                    "n_tokens": int(sel.sum()), "K": _mean(k_all[:, sel]),
                                    "K_per_layer": [_mean(k_all[i, sel]) for i in range(len(k_all))],
                                    "lam0": _mean(lam0_a[sel])})
    cold = history_len[users_a] <= cold_max_history
    for name, sel in (("cold_users", cold), ("warm_users", ~cold)):
        out[name] = {"max_history" if name == "cold_users" else "min_history":
                     int(cold_max_history) + (name == "warm_users"),
                     "n_tokens": int(sel.sum()), "K": _mean(k_all[:, sel]), "lam0": _mean(lam0_a[sel])}
    return out
