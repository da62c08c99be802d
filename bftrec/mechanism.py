"""BFT mechanism statistics (BFT.md §6): Kalman gain K and initial precision λ⁰ by stratum.

A BFT stack fills the ``mech`` dict of a forward with
- ``units``: ``bft.units`` of the layer (``count``: precisions are counts of observations, BFT.md §7;
  ``h``: in the units of h, v1);
- ``lam0``: (B, L) float32, λ̄⁰, the geometric mean of λ⁰ over D (0 on padding);
- ``layers``: one dict per layer with ``K`` (B, L) float32 mean over D, ``lam_obs`` (B, L) float32
  λ̄^obs, the geometric mean over D (BFT.md §6: a few extreme coordinates do not decide it),
  ``n_eff`` (B, L) float32 Kish effective sample size averaged over heads, and ``Q`` (D,) float32
  process noise.
The evaluator collects these on the test histories and aggregates them in two groupings, each
labelled in ``metrics.json`` (``groupings``):
- **by history token** (``per_layer``, ``by_item_freq``, ``cold_users``, ``warm_users``): over every
  real token of the test histories, a token stratified by the training count of *its own* item;
- **at the target** (``at_target``): at the scoring position alone (the last history position for
  SASRec and HSTU, the appended [MASK] for BERT4Rec; ``score_position``), one value per test user,
  stratified by the training count of the user's *test target* (the bins of the test strata) and by
  cold versus warm user: the grouping of the HR@10 strata, and of the paper's "K on rare items".
Standard layers fill nothing and get no ``mechanism`` block.

The aggregation is generic over the keys: every (B, L) entry of a layer dict is averaged over
tokens (``per_layer``), every other tensor (a parameter such as ``Q``) is reported as its mean
(``<key>_mean``). Under torch.distributed each process holds the chunks of its own users; the
processes exchange only sums and token counts per stratum (``all_gather_object``), so every process
returns the statistics of all users, equal to the single-process ones up to float rounding.
"""
from __future__ import annotations

import numpy as np
import torch

from bftrec.metrics import assign_item_bins

GROUPINGS = {
    "by_item_freq": "history tokens, each by the training count of its own item (cold/warm: the token's user)",
    "at_target": "the scoring position, one value per test user, by the training count of the user's test "
                 "target (the test strata's bins) and by cold/warm user",
}


def score_position(mech: dict) -> dict:
    """Add ``mech["at_score"]`` = {"K": (n_layers, B) float32, "lam0": (B,) float32}: the Kalman gain
    (mean over D) of every block and λ̄⁰ at the last position of the encoded input, the position a
    backbone scores from (BFT.md §6). Call it on the encoder's own (B, L_in) tensors, before any
    re-alignment to the history columns. A dict without ``layers`` (a standard stack) is returned as is."""
    if mech.get("layers"):
        mech["at_score"] = {"K": torch.stack([lay["K"][:, -1] for lay in mech["layers"]]),  # (n_layers, B)
                            "lam0": mech["lam0"][:, -1]}  # (B,)
    return mech


def _token_values(sink: list, tau_start=None) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """(items (T,), users (T,), {name: (T,) or (n_layers, T) float64 per real token}, {param: (n_layers,) means});
    with ``tau_start`` ((n_tokens,) float) also ``lam0_start`` = exp(τ_start[item]) per token."""
    items, users, tok, params = [], [], {}, {}
    for chunk in sink:
        valid = (chunk["item_seq"] != 0).cpu().numpy()  # (B, L)
        items.append(chunk["item_seq"].cpu().numpy()[valid])
        users.append(np.repeat(chunk["users"], valid.sum(1)))
        mech = chunk["mech"]
        tok.setdefault("lam0", []).append(mech["lam0"].double().cpu().numpy()[valid])
        B, L = valid.shape
        for key in mech["layers"][0]:
            vals = [lay[key] for lay in mech["layers"]]
            if tuple(vals[0].shape) == (B, L):
                tok.setdefault(f"layer.{key}", []).append(np.stack([v.double().cpu().numpy()[valid] for v in vals]))
            else:  # a parameter (e.g. Q (D,)): the same in every chunk
                params[key] = np.array([float(v.float().mean()) for v in vals])
    cat = {k: np.concatenate(v, axis=-1) for k, v in tok.items()}
    items = np.concatenate(items)
    if tau_start is not None:
        cat["lam0_start"] = np.exp(np.asarray(tau_start, dtype=np.float64)[items])  # (T,)
    return items, np.concatenate(users), cat, params


def _target_sums(sink: list, bins: list[dict], history_len: np.ndarray,
                 cold_max_history: int, target_count: np.ndarray) -> dict:
    """Per-user sums at the scoring position (``at_score``), grouped by the test target's bin:
    ``tgt_<g>/n`` users, ``tgt_<g>/K`` (n_layers,) and ``tgt_<g>/lam0`` float64 sums. {} when a chunk
    lacks ``at_score`` (a backbone that does not report it)."""
    if not sink or any("at_score" not in c["mech"] for c in sink):
        return {}
    users = np.concatenate([np.asarray(c["users"]) for c in sink])
    K = np.concatenate([c["mech"]["at_score"]["K"].double().cpu().numpy() for c in sink], axis=1)  # (n_layers, U')
    lam0 = np.concatenate([c["mech"]["at_score"]["lam0"].double().cpu().numpy() for c in sink])  # (U',)
    tgt_bin = assign_item_bins(np.asarray(target_count)[users], bins)
    cold = history_len[users] <= cold_max_history
    groups = {"all": np.ones(len(users), dtype=bool), **{f"bin{b}": tgt_bin == b for b in range(len(bins))},
              "cold": cold, "warm": ~cold}
    out: dict = {}
    for g, sel in groups.items():
        out[f"tgt_{g}/n"] = np.array(float(sel.sum()))
        out[f"tgt_{g}/K"] = K[:, sel].sum(-1)
        out[f"tgt_{g}/lam0"] = lam0[sel].sum()
    return out


def mechanism_sums(sink: list, train_counts: np.ndarray, bins: list[dict], history_len: np.ndarray,
                   cold_max_history: int, tau_start=None, target_count=None) -> dict:
    """Sufficient statistics of one process: per group (``all``, ``bin<b>``, ``cold``, ``warm``)
    the token count ``<g>/n`` and the float64 sum ``<g>/<name>`` of every per-token value
    (``lam0``: scalar; ``layer.<key>``: (n_layers,)); parameters under ``param/<key>``; with
    ``target_count`` also the per-user sums at the scoring position (``tgt_<g>/...``, ``_target_sums``).
    {} for an empty sink."""
    if not sink:
        return {}
    items, users, tok, params = _token_values(sink, tau_start)
    tok_bin = assign_item_bins(train_counts[items], bins)
    cold = history_len[users] <= cold_max_history
    groups = {"all": np.ones(len(items), dtype=bool), **{f"bin{b}": tok_bin == b for b in range(len(bins))},
              "cold": cold, "warm": ~cold}
    out: dict = {f"param/{k}": v for k, v in params.items()}
    for g, sel in groups.items():
        out[f"{g}/n"] = np.array(float(sel.sum()))
        for name, v in tok.items():
            out[f"{g}/{name}"] = v[..., sel].sum(-1)
    if target_count is not None:
        out.update(_target_sums(sink, bins, history_len, cold_max_history, target_count))
    return out


def reduce_sums(sums: dict) -> dict:
    """Sum the statistics of all processes (identity without torch.distributed); parameters are
    taken from the first process that has them (they are replicated)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return sums
    parts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(parts, sums)
    out: dict = {}
    for part in parts:
        for k, v in part.items():
            out[k] = v if k not in out or k.startswith("param/") else out[k] + v
    return out


def _mean(total, n: float):
    return float(total / n) if n else None


def aggregate_mechanism(sink: list, train_counts: np.ndarray, bins: list[dict],
                        history_len: np.ndarray, cold_max_history: int, tau_start=None,
                        target_count=None) -> dict | None:
    """Aggregate collected mechanism chunks over real tokens (of all processes under torch.distributed).

    Args:
        sink: list of {"mech": dict, "item_seq": (B, L) int64 tensor, "users": (B,) int64 array};
            may be empty on some processes. Under torch.distributed every process must call this.
        train_counts: (N + 1,) int64 training counts per item id.
        bins: the test strata's item-frequency bins (``metrics.item_freq_bins``).
        history_len: (U,) int64 test history length per user index (all users).
        cold_max_history: users whose history length is <= this are cold.
        tau_start: optional (n_tokens,) float τ per token id after calibration (BFT.md §0, §7); adds
            ``lam0_start`` (the same mean of exp(τ_start) over the stratum's tokens) next to ``lam0``.
        target_count: optional (U,) int64 training count of each user's test target, by user index;
            with it (and chunks that carry ``at_score``, ``score_position``) the result adds ``at_target``.
    Returns:
        None when no process collected anything (standard layers); else JSON-ready
        {"units", "precision_summary",
        "per_layer": [{"layer", "K", "lam_obs", "n_eff", "Q_mean"}] (one entry per (B, L) key and
        ``<key>_mean`` per parameter), "by_item_freq": [{"bin", "lo", "hi", "n_tokens", "K",
        "K_per_layer", "lam0"[, "lam0_start"]}], "cold_users": {"max_history", "n_tokens", "K", "lam0"},
        "warm_users": {...}, "groupings": {...}[, "at_target": {"overall", "by_target_freq": [{"bin", "lo",
        "hi", "n_users", "K", "K_per_layer", "lam0"}], "cold_users", "warm_users"}]}. K without a layer index is
        the mean over layers (and tokens, or users at the target).
    """
    s = reduce_sums(mechanism_sums(sink, train_counts, bins, history_len, cold_max_history, tau_start,
                                   target_count))
    if not s:
        return None
    token_keys = [k[len("all/layer."):] for k in s if k.startswith("all/layer.")]
    params = [k[len("param/"):] for k in s if k.startswith("param/")]
    n_layers = len(s["all/layer.K"])
    n_all = float(s["all/n"])
    units = next((c["mech"].get("units") for c in sink), None) if sink else None
    out: dict = {"units": units,
                 "precision_summary": "lam0, lam_obs: per token the geometric mean over D (BFT.md §6), "
                                      "then the arithmetic mean over tokens",
                 "per_layer": [{"layer": i, **{k: _mean(s[f"all/layer.{k}"][i], n_all) for k in token_keys},
                                **{f"{k}_mean": float(s[f"param/{k}"][i]) for k in params}}
                               for i in range(n_layers)], "by_item_freq": []}

    def stratum(g: str) -> dict:
        n = float(s[f"{g}/n"])
        return {"n_tokens": int(n), "K": _mean(s[f"{g}/layer.K"].sum(), n * n_layers),
                "K_per_layer": [_mean(x, n) for x in s[f"{g}/layer.K"]], "lam0": _mean(s[f"{g}/lam0"], n),
                **({"lam0_start": _mean(s[f"{g}/lam0_start"], n)} if f"{g}/lam0_start" in s else {})}

    for b, info in enumerate(bins):
        out["by_item_freq"].append({"bin": info["bin"], "lo": info["lo"], "hi": info["hi"], **stratum(f"bin{b}")})
    for name, g in (("cold_users", "cold"), ("warm_users", "warm")):
        st = stratum(g)
        del st["K_per_layer"]
        out[name] = {"max_history" if g == "cold" else "min_history": int(cold_max_history) + (g == "warm"), **st}
    out["groupings"] = {"by_item_freq": GROUPINGS["by_item_freq"]}
    if "tgt_all/n" in s:
        out["groupings"]["at_target"] = GROUPINGS["at_target"]
        out["at_target"] = _at_target(s, bins, cold_max_history, n_layers)
    return out


def _at_target(s: dict, bins: list[dict], cold_max_history: int, n_layers: int) -> dict:
    """The ``at_target`` block from the reduced ``tgt_<g>/...`` sums (``_target_sums``)."""
    def group(g: str) -> dict:
        n = float(s[f"tgt_{g}/n"])
        return {"n_users": int(n), "K": _mean(s[f"tgt_{g}/K"].sum(), n * n_layers),
                "K_per_layer": [_mean(x, n) for x in s[f"tgt_{g}/K"]], "lam0": _mean(s[f"tgt_{g}/lam0"], n)}

    return {"overall": group("all"),
            "by_target_freq": [{"bin": info["bin"], "lo": info["lo"], "hi": info["hi"], **group(f"bin{b}")}
                               for b, info in enumerate(bins)],
            "cold_users": {"max_history": int(cold_max_history), **group("cold")},
            "warm_users": {"min_history": int(cold_max_history) + 1, **group("warm")}}
