"""Tests of the BERT4Rec (post-LN) and HSTU (sandwich) BFT twins (``bftrec.models.bert4rec_bft``,
``bftrec.models.hstu_bft``, the §4 maths in ``bftrec.layers.precision``).

Against ``docs/BFT.md``: §5.1 degenerate case (and learned precision is not vacuous), §4
sandwich center/meat and shrinkage against naive computations, §4 relative reliability (uniform λ̄
gives back w, leak-free normaliser), §5.4 no leakage in the causal HSTU model, §2/§3 post-LN rules and
§4 output variance through a float64 reference of each block (the BERT4Rec post-LN Jacobian against
autograd in place), §6 mechanism format, NaN-free empty rows, §5.5 batch independence, the §1 s₀²
buffer semantics, ``detach_precision_grad``, and that the contract suite now sees both variants.

Models are tiny (D 16, 2 blocks, 2 heads, max_len 12); ``init_std=0.2`` so that attention outputs,
and hence the Kalman gains, are far enough from the ``K ≈ 1`` of a 0.02 initialisation for the
"learned precision changes the scores" checks to mean something.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bftrec.layers import Masks, StandardLayerConfig, build_masks, masked_softmax
from bftrec.layers.bft import BFTParams, LayerRun, bft_variant_for
from bftrec.layers.precision import (
    gather_rows,
    relative_reliability,
    sandwich_stats,
    sandwich_variance,
    scatter_rows,
    valid_rows,
)
from bftrec.models import MODELS, DataInfo
from bftrec.models.bert4rec import BERT4RecBlock
from bftrec.models.bert4rec_bft import BFTBERT4RecBlock
from bftrec.models.hstu import HSTUBlock
from bftrec.models.hstu_bft import BFTHSTUBlock
from bftrec.models.sasrec_bft import BFTSASRecBlock
from tests.test_bft import bft_cfg, buffers, restore, units_cfg

N_ITEMS, L = 40, 12
BACKBONES = ["bert4rec", "hstu"]
EXTRAS = {"stack.tau.tau"} | {f"stack.blocks.{i}.{n}" for i in range(2) for n in ("theta_q", "s0sq", "s0sq_ready")}


def info() -> DataInfo:
    counts = np.random.default_rng(0).integers(0, 30, N_ITEMS + 1)
    counts[0] = 0
    return DataInfo(n_items=N_ITEMS, train_counts=counts.astype(np.int64), has_timestamps=True)


def model(name: str, layer_cfg, seed: int = 0, dropout: float = 0.0, **kw):
    torch.manual_seed(seed)
    over = dict(d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=L, dropout=dropout, attn_dropout=dropout,
                init_std=0.2)
    if name == "hstu":
        over["n_negatives"] = 8
    cls = MODELS.get(name)
    return cls(cls.Config(**{**over, **kw}), layer_cfg, info())


def windows(B: int = 4, seed: int = 0, pad: tuple = (0, 3, 7, 11)) -> dict:
    """A training batch: ``seq`` (B, L + 1) left-padded ids (row i: ``pad[i]`` + 1 padding columns,
    the first column always padding) and increasing ``time`` (B, L + 1) int64, 0 on padding."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, N_ITEMS + 1, (B, L + 1), generator=g)
    seq[:, 0] = 0
    for i, p in enumerate(pad[:B]):
        seq[i, :p + 1] = 0
    time = (1_600_000_000 + torch.randint(1, 10**6, seq.shape, generator=g).cumsum(1)) * seq.ne(0)
    return {"seq": seq, "time": time}


def scoring(batch: dict) -> dict:
    """The scoring batch of a training batch: ``item_seq``/``time`` (B, L)."""
    return {"item_seq": batch["seq"][:, 1:], "time": batch["time"][:, 1:]}


def calibrated(name: str, layer_cfg, seed: int = 0, dropout: float = 0.0, **kw):
    m = model(name, layer_cfg, seed, dropout, **kw)
    m.calibrate(windows())  # non-trivial s₀² (the state a trained model has)
    return m


# ------------------------------------------------------------------------------------------ registration
def test_variants_are_registered_and_the_contract_sees_them():
    from tests.test_contract import Factory, unavailable  # the strict-xfail condition of the contract suite

    assert bft_variant_for(BERT4RecBlock) is BFTBERT4RecBlock and bft_variant_for(HSTUBlock) is BFTHSTUBlock
    for name in BACKBONES:
        assert unavailable(MODELS.get(name), "bft") is None  # so the bft pairs are no longer xfailed
        want = {"bert4rec": BFTBERT4RecBlock, "hstu": BFTHSTUBlock}[name]
        assert all(type(b) is want for b in Factory(MODELS.get(name), "bft")().stack.blocks)


# ------------------------------------------------------------------------------------------ §5.1
@pytest.mark.parametrize("units", ["count", "h"])
@pytest.mark.parametrize("name", BACKBONES)
def test_degenerate_uniform_equals_standard_and_learned_differs(name, units):
    std = model(name, StandardLayerConfig(), seed=1, dropout=0.2)
    uni = calibrated(name, units_cfg(units, bft_precision="uniform"), seed=2, dropout=0.2)
    lrn = calibrated(name, units_cfg(units), seed=3, dropout=0.2)
    for m in (uni, lrn):
        missing, unexpected = m.load_state_dict(std.state_dict(), strict=False)
        assert not unexpected and set(missing) == EXTRAS  # same native names; only the BFT extras are new
    batch = scoring(windows(seed=5))
    with torch.no_grad():
        ref, got, other = (m.eval().score_items(batch) for m in (std, uni, lrn))
        short = {k: v[:, 1:] for k, v in batch.items()}  # (B, L - 1): BERT4Rec's scoring input keeps every column
        mech = uni.mechanism(short)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got))
    assert torch.allclose(got[fin], ref[fin], atol=1e-5, rtol=0)
    assert (other[fin] - ref[fin]).abs().max() > 1e-2  # learned precision changes the scores (>> 1e-5)
    valid = short["item_seq"] != 0
    for layer in mech["layers"]:  # uniform: K = 1, while λ^obs is still computed
        assert torch.allclose(layer["K"][valid], torch.ones(int(valid.sum())))
        assert (layer["lam_obs"][valid] > 0).all() and torch.isfinite(layer["lam_obs"]).all()
    # training mode: the dropout draws are aligned with the native block's, so the losses agree too
    train = windows(seed=6)
    losses = []
    for m in (std, uni):
        m.train()
        torch.manual_seed(7)
        losses.append(m.training_loss(train))
    assert torch.allclose(losses[1], losses[0], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ §4 sandwich
def _weights(seed: int = 0, B: int = 3, H: int = 2, T: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed pointwise-like weights (B, H, T, T) float64, causal, row 0 of batch 1 all padding, batch 2 empty."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, 9, (B, T), generator=g)
    items[1, :2] = 0
    items[2] = 0
    masks = build_masks(items, causal=True)
    w = F.silu(torch.randn(B, H, T, T, generator=g, dtype=torch.float64) * 3) / T
    return w.masked_fill(~masks.attn, 0.0), masks.valid


def test_sandwich_center_and_meat_match_naive():
    w, _ = _weights()
    B, H, T, _ = w.shape
    d = 5
    v = torch.randn(B, H, T, d, dtype=torch.float64)
    c, meat, a1, a2, b = sandwich_stats(w, v)
    ok = a1 > 0
    a1_n = w.abs().sum(-1)  # (B, H, T)
    c_n = (w.abs()[..., None] * v[:, :, None]).sum(3) / a1_n.clamp_min(1e-300)[..., None]  # via (B, H, T, T, d)
    M_n = (w[..., None] ** 2 * (v[:, :, None] - c_n[:, :, :, None]) ** 2).sum(3)  # Σ_j w̃²(v_j − c)², naive
    sq = (w ** 2).sum(-1)
    n_n = a1_n ** 2 / sq.clamp_min(1e-300)
    assert torch.allclose(a1, a1_n) and torch.equal(ok, a1_n > 0) and (~ok).any()
    assert torch.allclose(c[ok], c_n[ok], atol=1e-12)
    assert torch.allclose((meat * (a1 ** 2)[..., None])[ok], M_n[ok], atol=1e-12)
    assert torch.allclose(1 / a2[ok], n_n[ok]) and torch.allclose(b[ok] / a2[ok], n_n[ok] - 1, atol=1e-10)
    assert (c[~ok] == 0).all() and (meat[~ok] == 0).all() and (a2[~ok] == 0).all() and (b[~ok] == 0).all()
    # shrinkage: σ̂² = M/Σw̃², σ² = (ν₀s₀² + nσ̂²)/(ν₀ + n − 1), Var(m) = σ²·Σw̃²; rows via the valid mask
    s0sq, nu = torch.rand(H, d, dtype=torch.float64) + 0.5, 1.5
    okr = ok.permute(0, 2, 1).reshape(-1, H)  # (B·T, H): every position as a row

    def rows(x):
        return x.transpose(1, 2).reshape(B * T, H, *x.shape[3:])

    var_m, prior = sandwich_variance(rows(meat), rows(a1), rows(a2), rows(b), s0sq, nu, okr, want_prior=True)
    sig_hat = M_n / sq.clamp_min(1e-300)[..., None]
    sig2 = (nu * s0sq[None, :, None] + n_n[..., None] * sig_hat) / (nu + n_n[..., None] - 1)
    want = torch.where(ok[..., None], sig2 * sq[..., None], torch.zeros_like(sig2))
    assert torch.allclose(var_m, rows(want), atol=1e-14, rtol=1e-10)
    keep = ok & (n_n > 1.01)  # s₀² statistic: mean of σ̂² n/(n − 1) over rows with n > 1.01
    stat = sig_hat * (n_n / (n_n - 1))[..., None]
    total = torch.stack([stat[:, h][keep[:, h]].sum(0) for h in range(H)])  # (H, d)
    assert torch.allclose(prior[0], total) and torch.equal(prior[1], keep.sum((0, 2)).double())


def test_sandwich_n_minus_one_does_not_collapse_in_float32():
    w = torch.tensor([[[[1.0, 1e-8, 0.0]]]])  # (1, 1, 1, 3): one weight dominates
    _, _, _, a2, b = sandwich_stats(w, torch.randn(1, 1, 3, 2))
    assert b.item() / a2.item() == pytest.approx(1e-8, rel=1e-3)  # n − 1, never by subtraction


# ------------------------------------------------------------------------------------------ §4 reliability
def test_relative_reliability_matches_naive_and_uniform_gives_w():
    w, valid = _weights(1)
    w = w.float()
    B, H, T, _ = w.shape
    lam_bar = torch.rand(B, T) * 10 + 0.1
    got = relative_reliability(w, lam_bar, valid)
    want = torch.zeros_like(w)
    for bb in range(B):
        for t in range(T):
            keys = [j for j in range(t + 1) if valid[bb, j]]
            if keys:
                mean = lam_bar[bb, keys].mean()
                for j in keys:
                    want[bb, :, t, j] = w[bb, :, t, j] * lam_bar[bb, j] / mean
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    const = torch.tensor([0.3, 7.0, 1e4])[:, None].expand(B, T)  # uniform λ̄ within each sequence
    assert torch.allclose(relative_reliability(w, const, valid), w, atol=1e-7, rtol=1e-5)
    # leak-free: λ̄ of positions > t changes nothing in the rows <= t
    t = 3
    moved = lam_bar.clone()
    moved[:, t + 1:] = torch.rand(B, T - t - 1) * 100
    assert torch.equal(relative_reliability(w, moved, valid)[:, :, : t + 1], got[:, :, : t + 1])


def _hstu_outputs(m, batch: dict, seed: int, saved: dict) -> dict:
    """h, final λ, mechanism and per-position CE of one HSTU training window (from the same buffers)."""
    seq, time = batch["seq"], batch["time"]
    inputs, targets, t_in = seq[:, :-1], seq[:, 1:], time[:, :-1]
    restore(m, saved)
    torch.manual_seed(seed)
    mech: dict = {}
    h = m.encode(inputs, t_in, mech=mech)
    restore(m, saved)
    torch.manual_seed(seed)
    _, lam = m.stack.forward_with_precision(m.embed(inputs), inputs, build_masks(inputs, True),
                                          **m.block_context(t_in))
    logits = h @ m.item_table().t() / m.cfg.temperature  # (B, L, N + 1)
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, L)
    out = {"h": h, "lam": lam, "ce": ce, "lam0": mech["lam0"]}
    for i, layer in enumerate(mech["layers"]):
        out.update({f"{k}{i}": layer[k] for k in ("K", "lam_obs", "n_eff")})
    return out


@pytest.mark.parametrize("train", [True, False])
def test_hstu_no_leakage_from_future_tokens(train):
    m = calibrated("hstu", bft_cfg(), dropout=0.2)
    m.train(train)
    saved = buffers(m)
    base = windows()
    t = 7
    g = torch.Generator().manual_seed(9)
    other = {k: v.clone() for k, v in base.items()}
    other["seq"][:, t + 1:] = torch.randint(1, N_ITEMS + 1, other["seq"][:, t + 1:].shape, generator=g)
    other["time"][:, t + 1:] = other["time"][:, t:t + 1] + torch.randint(1, 10**8, other["time"][:, t + 1:].shape,
                                                                        generator=g).cumsum(1)
    a = _hstu_outputs(m, base, 3, saved)
    b = _hstu_outputs(m, other, 3, saved)
    for k in a:
        cut = t if k == "ce" else t + 1  # the loss term at t has target seq[t + 1], which changed
        assert torch.equal(a[k][:, :cut], b[k][:, :cut]), k
    assert not torch.allclose(a["h"][:, t + 1:], b["h"][:, t + 1:])  # the change is real


# ------------------------------------------------------------------------------------------ float64 references
def _block_inputs(D: int, seed: int = 0):
    """h (2, 5, D), λ rows, masks with one left-padded row."""
    g = torch.Generator().manual_seed(seed)
    items = torch.tensor([[3, 4, 5, 6, 7], [0, 0, 2, 9, 1]])
    h = torch.randn(2, 5, D, generator=g) * items.ne(0)[..., None]
    rows = valid_rows(items.ne(0))
    lam = torch.rand(len(rows), D, generator=g) * 3 + 0.2
    return h, lam, items, rows


def _ln(x, ln):
    return F.layer_norm(x, x.shape[-1:], ln.weight, ln.bias, ln.eps)


def _perturb(block, seed: int) -> None:
    """Random γ, β, s₀², θ_Q: every factor of the rules is exercised (γ = 1 would hide a missing γ²)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for ln in (block.ln1, block.ln2):
            ln.weight.copy_(torch.rand(ln.weight.shape, generator=g) + 0.5)
            ln.bias.copy_(torch.randn(ln.bias.shape, generator=g) * 0.1)
        block.s0sq.copy_(torch.rand(block.s0sq.shape, generator=g) + 0.2)
        block.theta_q.copy_(torch.randn(block.theta_q.shape, generator=g) - 1)


@pytest.mark.parametrize("units", ["count", "h"])
def test_bert4rec_block_matches_float64_reference(units):
    """Kriging with the padding mask, §2 update inside LN1 with λ·σ²/γ², §3 post-LN J (autograd) + Q, LN2 rule;
    λ^obs = 1/Var(o) (h) or Var₁(o)/Var(o) with Var₁(o) = (W_O⊙W_O) s₀² (count, §7); λ̄^obs geometric over D (§6)."""
    torch.manual_seed(0)
    D, H, nu = 8, 2, 1.0
    block = BFTBERT4RecBlock(D, H, 16, 0.0, 0.0, bft_cfg=BFTParams(prior_dof=nu, units=units)).eval()
    _perturb(block, 1)
    h, lam, items, rows = _block_inputs(D)
    masks = build_masks(items, causal=False)
    with torch.no_grad():
        h2, lam2, st = block(h, lam, masks, run=LayerRun(want_stats=True))
    r = copy.deepcopy(block).double()
    hd, lamd = h.double(), scatter_rows(lam.double(), rows, 2, 5)  # (B, T, D), 0 on padding
    valid = masks.valid
    q, k, v = r.attn.heads(hd)  # (B, H, T, d)
    lbar = torch.where(valid, lamd.clamp_min(1e-300).log().mean(-1), torch.zeros(2, 5, dtype=torch.float64))
    alpha = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(D // H) + lbar[:, None, None, :], masks.attn)
    m = alpha @ v
    S = (alpha[..., None] * (v[:, :, None] - m[:, :, :, None]) ** 2).sum(3)  # naive (B, H, T, T, d)
    n = 1 / (alpha ** 2).sum(-1)
    s0 = r.s0sq.view(H, -1)[None, :, None]
    var_m = (nu * s0 + n[..., None] * S) / (nu + n[..., None] - 1) / n[..., None]  # σ²/n
    var_o = var_m.transpose(1, 2).reshape(2, 5, D) @ (r.attn.out.weight ** 2).t()
    var_1 = r.s0sq @ (r.attn.out.weight ** 2).t()  # (D,): one value at the prior scale, a = 1
    lam_obs = 1 / var_o if units == "h" else var_1 / var_o
    o = r.attn.out(m.transpose(1, 2).reshape(2, 5, D))
    K = lam_obs / (lamd + lam_obs)
    x1 = hd + K * o * valid[..., None]
    h1 = _ln(x1, r.ln1)
    lam1 = (lamd + lam_obs) * (x1.var(-1, unbiased=False, keepdim=True) + r.ln1.eps) / r.ln1.weight ** 2
    x2 = h1 + r.ffn(h1)
    J = torch.stack([torch.autograd.functional.jacobian(r.ffn, h1[b, t]).diagonal()
                     for b, t in zip(rows // 5, rows % 5)])  # (n, D): exact diagonal, no LN term
    lam_pred = 1 / ((1 + J) ** 2 / gather_rows(lam1, rows) + r.theta_q.exp())
    want_lam2 = lam_pred * (gather_rows(x2, rows).var(-1, unbiased=False, keepdim=True) + r.ln2.eps) / r.ln2.weight ** 2
    want_h2 = _ln(x2, r.ln2)
    assert torch.allclose(h2.double()[valid], want_h2[valid], atol=1e-5, rtol=1e-4)
    assert torch.allclose(lam2.double(), want_lam2, rtol=1e-4, atol=0)
    assert torch.allclose(st["K"].double(), gather_rows(K, rows).mean(-1), rtol=1e-4, atol=1e-6)
    assert torch.allclose(st["lam_obs"].double(), gather_rows(lam_obs, rows).log().mean(-1).exp(), rtol=1e-4, atol=0)
    assert torch.allclose(st["n_eff"].double(), torch.where(valid, n.mean(1), torch.zeros_like(n[:, 0])), rtol=1e-5)


@pytest.mark.parametrize("units", ["count", "h"])
def test_hstu_block_matches_float64_reference(units):
    """Relative reliability, sandwich estimate and shrinkage, delta method through f₂(LN(m) ⊙ u), §2, §3 HSTU;
    under count λ̂^obs = Var₁(o)/Var(o), Var₁(o)_k = Σ_c (f₂ u γ/σ_m)²_kc s₀²_c (Σ|w̃|)² (§7)."""
    torch.manual_seed(0)
    D, H, nu, T = 8, 2, 1.0, 5
    block = BFTHSTUBlock(D, H, 0.0, 0.0, T, "max_len", 0, 0.3, bft_cfg=BFTParams(prior_dof=nu, units=units)).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    _perturb(block, 2)
    h, lam, items, rows = _block_inputs(D, seed=3)
    masks = build_masks(items, causal=True)
    with torch.no_grad():
        h1, lam2, st = block(h, lam, masks, run=LayerRun(want_stats=True))
    r = copy.deepcopy(block).double()
    hd, lamd = h.double(), scatter_rows(lam.double(), rows, 2, T)
    valid = masks.valid
    u, q, k, v = r.attn.project(_ln(hd, r.ln1))
    w = r.attn.weights(q, k, masks, None)  # (B, H, T, T), the native pointwise weights
    lbar = torch.where(valid, lamd.clamp_min(1e-300).log().mean(-1).exp(), torch.zeros(2, T, dtype=torch.float64))
    wt = torch.zeros_like(w)
    for b in range(2):
        for t in range(T):
            keys = [j for j in range(t + 1) if valid[b, j]]
            if keys:
                wt[b, :, t, keys] = w[b, :, t, keys] * lbar[b, keys] / lbar[b, keys].mean()
    m = wt @ v
    a1 = wt.abs().sum(-1)
    c = (wt.abs()[..., None] * v[:, :, None]).sum(3) / a1[..., None]
    M = (wt[..., None] ** 2 * (v[:, :, None] - c[:, :, :, None]) ** 2).sum(3)
    sq = (wt ** 2).sum(-1)
    n = a1 ** 2 / sq
    s0 = r.s0sq.view(H, -1)[None, :, None]
    sig2 = (nu * s0 + n[..., None] * M / sq[..., None]) / (nu + n[..., None] - 1)
    var_m = (sig2 * sq[..., None]).transpose(1, 2).reshape(2, T, D)
    mc = m.transpose(1, 2).reshape(2, T, D)
    sig_m2 = mc.var(-1, unbiased=False, keepdim=True) + r.ln2.eps
    var_o = (var_m * (u * r.ln2.weight) ** 2 / sig_m2) @ (r.f2.weight ** 2).t()
    one = (r.s0sq.view(H, -1)[None, :, None] * (a1 ** 2)[..., None]).transpose(1, 2).reshape(2, T, D)  # s₀² a²
    var_1 = (one * (u * r.ln2.weight) ** 2 / sig_m2) @ (r.f2.weight ** 2).t()
    lam_obs = 1 / var_o if units == "h" else var_1 / var_o
    K = lam_obs / (lamd + lam_obs)
    want_h1 = hd + K * r.f2(_ln(mc, r.ln2) * u)
    want_lam2 = 1 / (1 / (gather_rows(lamd + lam_obs, rows)) + r.theta_q.exp())
    assert torch.allclose(h1.double()[valid], want_h1[valid], atol=1e-5, rtol=1e-4)
    assert torch.allclose(lam2.double(), want_lam2, rtol=1e-4, atol=0)
    assert torch.allclose(st["lam_obs"].double(), gather_rows(lam_obs, rows).log().mean(-1).exp(), rtol=1e-4, atol=0)
    assert torch.allclose(st["K"].double(), gather_rows(K, rows).mean(-1), rtol=1e-4, atol=1e-6)
    n_eff = torch.where(valid, n.mean(1), torch.zeros_like(n[:, 0]))
    assert torch.allclose(st["n_eff"].double(), n_eff, rtol=1e-5)
    assert st["n_eff"][0, 0] == 1 and st["n_eff"][1, 2] == 1  # one key: n = 1


@pytest.mark.parametrize("variant", ["sasrec", "bert4rec", "hstu"])
def test_valid_query_without_keys_gets_zero_gain(variant):
    """A valid query that may attend no key: zero gain, zero observation precision, finite gradients."""
    torch.manual_seed(0)
    if variant == "sasrec":
        block = BFTSASRecBlock(8, 2, 16, 0.0, 0.0, bft_cfg=BFTParams())
    elif variant == "bert4rec":
        block = BFTBERT4RecBlock(8, 2, 16, 0.0, 0.0, bft_cfg=BFTParams())
    else:
        block = BFTHSTUBlock(8, 2, 0.0, 0.0, 4, "max_len", 0, 0.3, bft_cfg=BFTParams())
    h = torch.randn(2, 4, 8, requires_grad=True)
    lam = torch.rand(8, 8) + 1  # (n = 2·4 rows, D)
    valid = torch.ones(2, 4, dtype=torch.bool)
    attn = torch.ones(4, 4, dtype=torch.bool).tril().expand(2, 1, 4, 4).clone()
    attn[0, 0, 2] = False  # a valid query (row 2) that may attend no key
    h2, lam2, st = block(h, lam, Masks(attn=attn, valid=valid), run=LayerRun(want_stats=True))
    assert st["K"][2] == 0 and st["lam_obs"][2] == 0 and st["n_eff"][0, 2] == 0
    assert (st["K"][[0, 1, 3]] > 0).all()
    (h2.sum() + lam2.sum()).backward()
    assert torch.isfinite(h2).all() and torch.isfinite(lam2).all() and torch.isfinite(h.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in block.parameters() if p.grad is not None)
    if variant == "sasrec":  # every SASRec block weight takes part in this forward
        assert all(p.grad is not None for p in block.parameters())


# ------------------------------------------------------------------------------------------ §6, NaN, §5.5
@pytest.mark.parametrize("name", BACKBONES)
def test_mechanism_format(name):
    m = calibrated(name, bft_cfg()).eval()
    batch = scoring(windows())
    batch = {k: v[:, 1:] for k, v in batch.items()}  # (B, L - 1): BERT4Rec's scoring input keeps every column
    mech = m.mechanism(batch)
    valid = batch["item_seq"] != 0
    B, T = valid.shape
    assert mech["lam0"].shape == (B, T) and mech["lam0"].dtype == torch.float32
    assert (mech["lam0"][~valid] == 0).all() and (mech["lam0"][valid] > 0).all()
    assert len(mech["layers"]) == 2
    for layer in mech["layers"]:
        assert set(layer) == {"K", "lam_obs", "n_eff", "Q"}
        for k in ("K", "lam_obs", "n_eff"):
            assert layer[k].shape == (B, T) and layer[k].dtype == torch.float32 and not layer[k].requires_grad
            assert (layer[k][~valid] == 0).all() and torch.isfinite(layer[k]).all()
        assert ((layer["K"][valid] > 0) & (layer["K"][valid] < 1)).all()
        assert (layer["n_eff"][valid] >= 1 - 1e-5).all() and (layer["lam_obs"][valid] > 0).all()
        assert layer["Q"].shape == (16,) and layer["Q"].dtype == torch.float32
    if name == "hstu":  # causal: the first valid position has one key, n = 1
        first = valid.float().argmax(1)
        assert torch.allclose(mech["layers"][0]["n_eff"][torch.arange(B), first], torch.ones(B))


@pytest.mark.parametrize("name", BACKBONES)
def test_all_padding_rows_have_no_nan(name):
    m = calibrated(name, bft_cfg(), dropout=0.2)
    train = windows(B=5, pad=(0, 3, 7, 11, 12))  # the last row is all padding
    m.train()
    loss = m.training_loss(train)
    loss.backward()
    assert torch.isfinite(loss)
    for n, p in m.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), n
    m.eval()
    x, t = train["seq"][:, :-1], train["time"][:, :-1]
    mech: dict = {}
    with torch.no_grad():
        h, lam = m.stack.forward_with_precision(m.embed(x), x, build_masks(x, m.causal), mech=mech,
                                                **m.block_context(t))
        s = m.score_items({"item_seq": x, "time": t})
    pad = x == 0
    assert torch.isfinite(h).all() and torch.isfinite(lam).all() and (lam[pad] == 0).all() and (lam[~pad] > 0).all()
    assert all((layer["K"][pad] == 0).all() and torch.isfinite(layer["K"]).all() for layer in mech["layers"])
    assert torch.isfinite(s[:, 1:]).all()


@pytest.mark.parametrize("name", BACKBONES)
def test_batch_independence_at_eval(name):
    m = calibrated(name, bft_cfg(), dropout=0.2).eval()
    x = scoring(windows(seed=1))
    with torch.no_grad():
        full = m.score_items(x)
        for i in range(len(x["item_seq"])):
            others = scoring(windows(B=3, seed=10 + i))
            mix = {k: torch.cat([x[k][i:i + 1], others[k]]) for k in x}
            alone = m.score_items({k: v[i:i + 1] for k, v in x.items()})
            mixed = m.score_items(mix)[:1]
            fin = torch.isfinite(full[i:i + 1])
            assert torch.allclose(alone[fin], full[i:i + 1][fin], atol=1e-5, rtol=0)
            assert torch.allclose(mixed[fin], full[i:i + 1][fin], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ §1 s₀², detach
@pytest.mark.parametrize("name", BACKBONES)
def test_prior_buffer_semantics(name):
    """Calibration sets s₀² layer by layer (a fixed point); a training forward uses the pre-forward value and
    updates it afterwards; eval never updates."""
    m = model(name, bft_cfg(bft_s0_momentum=0.5), dropout=0.2)
    assert not any(bool(b.s0sq_ready) for b in m.stack.blocks)
    m.eval()
    torch.manual_seed(0)  # BERT4Rec's cloze masks are drawn from the global RNG
    m.calibrate(windows())
    first = [b.s0sq.clone() for b in m.stack.blocks]
    assert all(bool(b.s0sq_ready) and (s > 0).all() and not torch.allclose(s, torch.ones_like(s))
               for b, s in zip(m.stack.blocks, first))
    torch.manual_seed(0)
    m.calibrate(windows())  # fixed point: layer l only sees calibrated layers < l
    assert all(torch.allclose(b.s0sq, s) for b, s in zip(m.stack.blocks, first))
    saved = buffers(m)
    x = scoring(windows(seed=4))
    with torch.no_grad():
        m.encode(x["item_seq"], x["time"])
    assert all(torch.equal(v, saved[k]) for k, v in m.named_buffers())  # eval: no update
    m.train()
    outs = []
    for reset in (False, False, True):
        if reset:
            restore(m, saved)
        torch.manual_seed(0)
        outs.append(m.encode(x["item_seq"], x["time"]))
    assert not torch.equal(m.stack.blocks[0].s0sq, saved["stack.blocks.0.s0sq"])
    assert not torch.allclose(outs[0], outs[1], atol=1e-6)  # the second forward saw the updated s₀²
    assert torch.equal(outs[0], outs[2])  # same pre-forward buffer: identical output


@pytest.mark.parametrize("name", BACKBONES)
def test_detach_precision_grad(name):
    """Detached: λ carries no gradient into activations or block weights; τ and Q still learn; same forward."""
    full = model(name, bft_cfg(), seed=0)
    det = model(name, bft_cfg(bft_detach_precision_grad=True), seed=0)
    det.load_state_dict(full.state_dict())
    x = scoring(windows())
    masks = build_masks(x["item_seq"], full.causal)
    for m in (full, det):
        m.eval()
        _, lam = m.stack.forward_with_precision(m.embed(x["item_seq"]), x["item_seq"], masks,
                                                **m.block_context(x["time"]))
        lam[masks.valid].log().sum().backward()
    grads = [p.grad for n, p in det.named_parameters() if ".blocks." in n and "theta_q" not in n]
    assert all(g is None or not g.any() for g in grads)
    assert det.stack.tau.tau.grad.abs().sum() > 0 and all(b.theta_q.grad.abs().sum() > 0 for b in det.stack.blocks)
    full_block = [p.grad for n, p in full.named_parameters() if ".blocks.0." in n and "theta_q" not in n]
    assert sum(float(g.abs().sum()) for g in full_block if g is not None) > 0  # default: λ depends on weights
    with torch.no_grad():
        # same forward value through another code path: equal to float32 rounding, not bit for bit
        torch.testing.assert_close(full.encode(x["item_seq"], x["time"]), det.encode(x["item_seq"], x["time"]),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", BACKBONES)
def test_precision_is_float32_under_autocast(name):
    m = calibrated(name, bft_cfg()).eval()
    x = scoring(windows())
    masks = build_masks(x["item_seq"], m.causal)
    mech: dict = {}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h, lam = m.stack.forward_with_precision(m.embed(x["item_seq"]), x["item_seq"], masks, mech=mech,
                                                **m.block_context(x["time"]))
    assert lam.dtype == torch.float32 and all(la["K"].dtype == torch.float32 for la in mech["layers"])
    assert torch.isfinite(lam).all() and torch.isfinite(h.float()).all() and (lam[masks.valid] > 0).all()


# ------------------------------------------------------------------------------------------ item-3 fixes, §5.9
@pytest.mark.parametrize("units", ["count", "h"])
def test_hstu_sigma_m_reads_the_undropped_estimate(units):
    """BFT.md §4: σ_m is the spread of the estimate m, not of a dropout draw: λ^obs is the same in train and eval."""
    torch.manual_seed(0)
    block = BFTHSTUBlock(8, 2, 0.0, 0.5, 5, "max_len", 0, 0.3, bft_cfg=BFTParams(units=units))
    h, lam, items, rows = _block_inputs(8, seed=3)
    masks = build_masks(items, causal=True)
    with torch.no_grad():
        stats = [block.train(mode)(h, lam, masks, run=LayerRun(want_stats=True, rows=rows))[2]["lam_obs"]
                 for mode in (True, False)]
    torch.testing.assert_close(stats[0], stats[1])


@pytest.mark.parametrize("name", ["sasrec"] + BACKBONES)
def test_one_key_row_has_gain_one_half(name):
    """BFT.md §5.9: under units=count a query with exactly one valid key has S = 0, σ² = s₀², λ̂^obs = 1 and, with
    τ = 0, layer-0 gain K = 1/2 (causal: the first valid position; BERT4Rec: a one-item sequence)."""
    m = calibrated(name, bft_cfg(), init_std=0.02).eval()  # s₀² from real statistics; τ₀ = 0
    x = scoring(windows())
    x = {k: v.clone() for k, v in x.items()}
    x["item_seq"][3, :-1] = 0  # row 3: one item only
    x["time"] = x["time"] * x["item_seq"].ne(0)
    with torch.no_grad():
        mech = m.mechanism(x) if name != "bert4rec" else _bert4rec_mech_of(m, x["item_seq"])
    first = (mech["lam0"] > 0).float().argmax(1)  # (B,) first position with a token
    K0 = mech["layers"][0]["K"][torch.arange(len(first)), first]
    rows = [3] if name == "bert4rec" else list(range(len(first)))
    torch.testing.assert_close(K0[rows], torch.full((len(rows),), 0.5), rtol=0, atol=1e-6)
    lam_obs = mech["layers"][0]["lam_obs"][torch.arange(len(first)), first][rows]
    torch.testing.assert_close(lam_obs, torch.ones_like(lam_obs), rtol=0, atol=2e-6)


def _bert4rec_mech_of(m, item_seq):
    """BERT4Rec's mechanism of ``encode(item_seq)`` itself (no appended [MASK]): row 3 then has one valid key."""
    mech: dict = {}
    m.encode(item_seq, mech=mech)
    return mech


def test_bert4rec_mask_token_starts_at_offset_zero():
    """BFT.md §0: special tokens have their own τ, which starts at τ₀ (offset 0) under tau.freq_slope."""
    m = model("bert4rec", bft_cfg(tau_freq_slope=1.0))
    tau = m.stack.tau.tau.detach()[:, 0].double()  # (N + 2,)
    counts = torch.from_numpy(info().train_counts).double()
    want = torch.log1p(counts[1:]) - torch.log1p(counts[1:]).mean()  # real items 1..N only
    assert tau[m.mask_id] == 0.0
    torch.testing.assert_close(tau[1:N_ITEMS + 1], want, rtol=0, atol=1e-6)
