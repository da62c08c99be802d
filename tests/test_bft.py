"""Tests of the BFT layer (``bftrec.layers.bft``, ``bftrec.layers.precision``, ``bftrec.models.sasrec_bft``)
against BFT.md §5.

§5.1 degenerate case (both ``bft.units``), §5.2 limits, §5.3 expanded square (and the exact Kish
``n − 1``), §5.4 no leakage (and the s₀² buffer semantics of §1), §5.5 batch independence, §5.7
Jacobian (§5.6, §5.10 and the §7 acceptance on real data: ``tests/test_bft_real_data.py``); plus
NaN-free empty rows, gradient flow, ``detach_precision_grad``, the parameter overhead of §0, config
errors and the mechanism format of §6. §5.8 (cost) is ``scripts/bench_layer.py``, never a timed test.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from bftrec.config import ConfigError, merge_schema
from bftrec.layers import (
    LAYER_BUILDERS,
    LAYER_CONFIGS,
    StandardLayerConfig,
    build_masks,
    build_stack,
    masked_softmax,
)
from bftrec.layers.bft import (
    BFTHLayerConfig,
    BFTLayerConfig,
    BFTParams,
    BFTStack,
    TauConfig,
    bft_overhead,
)
from bftrec.layers.precision import (
    ffn_jacobian_diag,
    kalman_update,
    kish_b,
    kish_sums,
    kriging_moments,
    kriging_stats,
    prenorm_ffn_jacobian_diag,
    prenorm_ffn_jacobian_diag_fused,
    reml_shrinkage,
    valid_rows,
)
from bftrec.models import MODELS, DataInfo
from bftrec.models.sasrec import SASRecBlock, SASRecConfig
from bftrec.models.sasrec_bft import BFTSASRecBlock

N_ITEMS = 40
ROOT = Path(__file__).resolve().parents[1]


def bft_cfg(**kw) -> BFTLayerConfig:
    """BFTLayerConfig with overrides ``tau_<field>`` / ``bft_<field>``."""
    tau = {k[4:]: v for k, v in kw.items() if k.startswith("tau_")}
    bft = {k[4:]: v for k, v in kw.items() if k.startswith("bft_")}
    return BFTLayerConfig(tau=TauConfig(**tau), bft=BFTParams(**bft))


def info(n_items: int = N_ITEMS, seed: int = 0) -> DataInfo:
    counts = np.random.default_rng(seed).integers(0, 30, n_items + 1)
    counts[0] = 0
    return DataInfo(n_items=n_items, train_counts=counts.astype(np.int64))


def sasrec(layer_cfg, seed: int = 0, dropout: float = 0.0, **kw):
    torch.manual_seed(seed)
    cfg = SASRecConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=12, dropout=dropout,
                       attn_dropout=dropout, **kw)
    return MODELS.get("sasrec")(cfg, layer_cfg, info())


def sequences(B: int = 4, L: int = 12, seed: int = 0, pad: tuple = (0, 3, 7, 11)) -> torch.Tensor:
    """(B, L) int64 left-padded item ids; row i has ``pad[i]`` padding columns."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, N_ITEMS + 1, (B, L), generator=g)
    for i, p in enumerate(pad[:B]):
        x[i, :p] = 0
    return x


def buffers(model) -> dict:
    return {k: v.clone() for k, v in model.named_buffers()}


def restore(model, saved: dict) -> None:
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(saved[k])


def units_cfg(units: str, **kw) -> BFTLayerConfig:
    """``bft_cfg`` under ``bft.units=units`` with that unit's default ``tau.scale`` (count; h: embedding)."""
    return bft_cfg(bft_units=units, tau_scale={"count": "count", "h": "embedding"}[units], **kw)


# ------------------------------------------------------------------------------------------ §5.1
@pytest.mark.parametrize("units", ["count", "h"])
def test_degenerate_uniform_equals_standard_and_learned_differs(units):
    std = sasrec(StandardLayerConfig(), seed=1, dropout=0.2)
    uni = sasrec(units_cfg(units, bft_precision="uniform"), seed=2, dropout=0.2)
    lrn = sasrec(units_cfg(units), seed=3, dropout=0.2)
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences()], 1)  # (4, 13) training windows
    for m in (uni, lrn):
        m.train()
        m.calibrate({"seq": seq})  # non-trivial s0² (the state a trained model has)
        missing, unexpected = m.load_state_dict(std.state_dict(), strict=False)
        assert not unexpected
        extras = {"stack.tau.tau"} | {f"stack.blocks.{i}.{n}" for i in range(2)
                                       for n in ("theta_q", "s0sq", "s0sq_ready")}
        assert set(missing) == extras
    for m in (std, uni, lrn):
        m.eval()
    batch = {"item_seq": sequences(seed=5)}
    with torch.no_grad():
        ref, got, other = std.score_items(batch), uni.score_items(batch), lrn.score_items(batch)
        mech = uni.mechanism(batch)
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(got))
    assert torch.allclose(got[fin], ref[fin], atol=1e-5, rtol=0)
    assert (other[fin] - ref[fin]).abs().max() > 1e-4  # learned precision changes the scores (>> 1e-5)
    valid = batch["item_seq"] != 0
    for layer in mech["layers"]:  # uniform: K = 1, while λ^obs is still computed
        assert torch.allclose(layer["K"][valid], torch.ones(int(valid.sum())))
        assert (layer["lam_obs"][valid] > 0).all() and torch.isfinite(layer["lam_obs"]).all()


# ------------------------------------------------------------------------------------------ §5.2
def test_kalman_limits():
    torch.manual_seed(0)
    n, D = 7, 4
    h, o = torch.randn(n, D), torch.randn(n, D)
    lam = torch.rand(n, D) + 0.5
    h1, lam1, K = kalman_update(h, o, lam, torch.full((n, D), 1e-12))  # λ^obs -> 0
    assert K.max() < 1e-11 and torch.allclose(h1, h, atol=1e-10) and torch.allclose(lam1, lam)
    h1, _, K = kalman_update(h, o, torch.full((n, D), 1e-12), torch.rand(n, D) + 0.5)  # λ -> 0
    assert torch.allclose(K, torch.ones_like(K), atol=1e-11) and torch.allclose(h1, h + o, atol=1e-6)
    _, lam1, K = kalman_update(h, o, lam, lam)  # equal precisions: K = 1/2, λ' = 2λ
    assert torch.allclose(K, torch.full_like(K, 0.5)) and torch.allclose(lam1, 2 * lam)
    h1, lam1, K = kalman_update(h, o, lam, lam, uniform=True)  # the standard residual, λ' still computed
    assert torch.equal(h1, h + o) and (K == 1).all() and torch.allclose(lam1, 2 * lam)


def test_padding_has_zero_precision_and_gain():
    model = sasrec(bft_cfg())
    model.eval()
    x = sequences()
    masks = build_masks(x, True)
    mech: dict = {}
    with torch.no_grad():
        _, lam = model.stack.forward_with_precision(model.embed(x), x, masks, mech=mech)
    pad = ~masks.valid
    assert (lam[pad] == 0).all() and (lam[~pad] > 0).all()
    assert (mech["lam0"][pad] == 0).all() and all((layer["K"][pad] == 0).all() for layer in mech["layers"])


# ------------------------------------------------------------------------------------------ §5.3
def test_expanded_square_matches_naive():
    torch.manual_seed(0)
    B, H, T, d = 3, 2, 6, 5
    items = torch.randint(1, 9, (B, T))
    items[1, :4] = 0  # left padding: query rows 0..3 have no valid key
    items[2, :] = 0  # all padding
    masks = build_masks(items, causal=True)
    alpha = masked_softmax(torch.randn(B, H, T, T, dtype=torch.float64) * 3, masks.attn)
    v = torch.randn(B, H, T, d, dtype=torch.float64)
    m, S = kriging_moments(alpha, v)
    m_naive = (alpha[..., None] * v[:, :, None, :, :]).sum(3)  # (B, H, T, T, d) -> (B, H, T, d)
    S_naive = (alpha[..., None] * (v[:, :, None, :, :] - m_naive[:, :, :, None, :]) ** 2).sum(3)
    assert torch.allclose(m, m_naive, atol=1e-12) and torch.allclose(S, S_naive, atol=1e-12)
    a2, b = kish_sums(alpha)
    ok = alpha.sum(-1) > 0
    assert torch.equal(ok, masks.attn.any(-1).expand(B, H, T))
    n_naive = 1 / (alpha ** 2).sum(-1)[ok]
    assert torch.allclose(1 / a2[ok], n_naive) and torch.allclose(b[ok] / a2[ok], n_naive - 1, atol=1e-10)
    assert (a2[~ok] == 0).all() and (b[~ok] == 0).all() and (m[~ok] == 0).all() and (S[~ok] == 0).all()
    # the layer's fused node: same values, and gradients equal to autograd through the reference
    alpha.requires_grad_()
    v.requires_grad_()
    fused = kriging_stats(alpha, v)
    assert all(torch.allclose(x, y, atol=1e-12) for x, y in zip(fused, (m, S, a2, b)))
    w = [torch.randn_like(x) for x in fused]
    g_f = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(fused, w)), (alpha, v))
    ref = (*kriging_moments(alpha, v), *kish_sums(alpha))
    g_r = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(ref, w)), (alpha, v))
    assert all(torch.allclose(x, y, atol=1e-10) for x, y in zip(g_f, g_r))
    small = (torch.softmax(torch.randn(1, 2, 4, 4, dtype=torch.float64), -1).requires_grad_(),
             torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True))  # S > 0: away from the clamp
    assert torch.autograd.gradcheck(kriging_stats, small)


def test_kish_n_minus_one_does_not_collapse_in_float32():
    alpha = torch.softmax(torch.tensor([[0.0, -math.log(1e8)]]), -1)  # weights ≈ (1 − 1e-8, 1e-8)
    a2, b = kish_sums(alpha)
    assert (1 / a2 - 1).item() == 0.0  # the subtraction collapses in float32 ...
    assert b.item() / a2.item() == pytest.approx(1e-8, rel=1e-3)  # ... the elementwise sum does not


def test_kish_b_is_exact_to_float_rounding():
    """BFT.md §1: n − 1 = Σα̃(1 − α̃)/Σα̃², elementwise. ``α̃ − α̃²`` loses ~1e-4 relative at α̃ = 1 − 3000·2⁻²⁴."""
    a = 1.0 - 3000 * 2.0 ** -24
    alpha = torch.tensor([[a, 1.0 - a]], dtype=torch.float32)  # one row, sums to 1 exactly
    exact = 2 * alpha.double().prod()  # Σ α̃(1 − α̃) for two weights
    v = torch.randn(1, 1, 2, 3)
    for b in (kish_sums(alpha)[1], kriging_stats(alpha[None, None].expand(1, 1, 2, 2).contiguous(), v)[3][0, 0, :1]):
        assert abs(float(b.double().sum()) / float(exact) - 1) < 1e-6
    g = (torch.rand(2, 1, 3, 5, dtype=torch.float64) / 5).requires_grad_()
    assert torch.autograd.gradcheck(kish_b, (g,))


def test_reml_shrinkage_limits():
    S = torch.full((3, 1, 3), 4.0)  # (rows, H, d)
    S[0] = 0.0  # one key: the plug-in variance is 0
    s0sq = torch.full((1, 3), 9.0)
    ok = torch.tensor([[True], [True], [False]])
    a2 = torch.tensor([[1.0], [1e-4], [0.0]])  # n = 1, n = 1e4, no key
    b = torch.tensor([[0.0], [1 - 1e-4], [0.0]])
    var_m = reml_shrinkage(S, a2, b, s0sq, 1.0, ok)
    assert torch.allclose(var_m[0, 0], torch.full((3,), 9.0))  # n = 1: the prior alone decides
    n = 1e4
    assert torch.allclose(var_m[1, 0], torch.full((3,), (9 + n * 4) / n / n))  # (ν₀s₀² + nS)/(ν₀+n−1)/n
    assert (var_m[2] == 0).all()


# ------------------------------------------------------------------------------------------ §5.4
def _outputs(model, seq: torch.Tensor, seed: int, saved: dict) -> dict:
    """h, final λ, mechanism and per-position CE of one training window seq (B, L + 1).

    Both forwards start from the same buffers ``saved`` (a training forward updates s₀² afterwards).
    """
    inputs, targets = seq[:, :-1], seq[:, 1:]
    restore(model, saved)
    torch.manual_seed(seed)
    mech: dict = {}
    h = model.encode(inputs, mech=mech)
    restore(model, saved)
    torch.manual_seed(seed)
    _, lam = model.stack.forward_with_precision(model.embed(inputs), inputs, build_masks(inputs, True))
    logits = h @ model.item_emb.weight.t()  # (B, L, N + 1)
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, L)
    out = {"h": h, "lam": lam, "ce": ce, "lam0": mech["lam0"]}
    for i, layer in enumerate(mech["layers"]):
        out.update({f"{k}{i}": layer[k] for k in ("K", "lam_obs", "n_eff")})
    return out


@pytest.mark.parametrize("train", [True, False])
def test_no_leakage_from_future_tokens(train):
    model = sasrec(bft_cfg(), dropout=0.2)
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12)], 1)  # (4, 13)
    model.calibrate({"seq": seq})
    model.train(train)
    saved = buffers(model)
    t = 7
    seq2 = seq.clone()
    seq2[:, t + 1:] = torch.randint(1, N_ITEMS + 1, seq2[:, t + 1:].shape, generator=torch.Generator().manual_seed(9))
    a = _outputs(model, seq, 3, saved)
    b = _outputs(model, seq2, 3, saved)
    for k in a:
        cut = t if k == "ce" else t + 1  # the loss term at t has target seq[t + 1], which changed
        assert torch.equal(a[k][:, :cut], b[k][:, :cut]), k
    assert not torch.allclose(a["h"][:, t + 1:], b["h"][:, t + 1:])  # the change is real


def test_prior_buffer_uses_pre_forward_value_and_eval_does_not_update():
    model = sasrec(bft_cfg(bft_s0_momentum=0.5), dropout=0.2)
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12)], 1)
    model.calibrate({"seq": seq})
    other = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12, seed=4)], 1)
    saved = buffers(model)
    model.eval()
    with torch.no_grad():
        e1 = model.encode(seq[:, :-1])
    assert all(torch.equal(v, saved[k]) for k, v in model.named_buffers())  # eval: no update
    model.train()
    torch.manual_seed(0)
    h1 = model.encode(other[:, :-1])  # uses the saved s0², then updates the buffers
    assert not torch.equal(model.stack.blocks[0].s0sq, saved["stack.blocks.0.s0sq"])
    torch.manual_seed(0)
    h2 = model.encode(other[:, :-1])  # uses the updated s0²: differs, so the buffer matters
    assert not torch.allclose(h1, h2, atol=1e-6)
    restore(model, saved)
    torch.manual_seed(0)
    h3 = model.encode(other[:, :-1])  # same pre-forward buffer: identical output
    assert torch.equal(h1, h3)
    model.eval()
    restore(model, saved)
    with torch.no_grad():
        assert torch.equal(model.encode(seq[:, :-1]), e1)


def test_calibration_sets_prior_layer_by_layer():
    model = sasrec(bft_cfg())
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12)], 1)
    assert not any(bool(b.s0sq_ready) for b in model.stack.blocks)
    model.eval()
    model.calibrate({"seq": seq})
    first = [b.s0sq.clone() for b in model.stack.blocks]
    assert all(bool(b.s0sq_ready) for b in model.stack.blocks)
    assert all((s > 0).all() and not torch.allclose(s, torch.ones_like(s)) for s in first)
    assert first[0].abs().sub(first[1].abs()).abs().max() > 0  # per layer
    model.calibrate({"seq": seq})  # fixed point: layer l only sees calibrated layers < l
    assert all(torch.allclose(b.s0sq, s) for b, s in zip(model.stack.blocks, first))


# ------------------------------------------------------------------------------------------ §5.5
def test_batch_independence_at_eval():
    model = sasrec(bft_cfg(), dropout=0.2)
    model.calibrate({"seq": torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences()], 1)})
    model.eval()
    x = sequences(seed=1)
    with torch.no_grad():
        full = model.score_items({"item_seq": x})
        for i in range(len(x)):
            mix = torch.cat([x[i:i + 1], sequences(B=3, seed=10 + i)], 0)
            alone = model.score_items({"item_seq": x[i:i + 1]})
            mixed = model.score_items({"item_seq": mix})[:1]
            fin = torch.isfinite(full[i:i + 1])
            assert torch.allclose(alone[fin], full[i:i + 1][fin], atol=1e-5, rtol=0)
            assert torch.allclose(mixed[fin], full[i:i + 1][fin], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ §5.6
# on real data, for every backbone and both units: tests/test_bft_real_data.py


# ------------------------------------------------------------------------------------------ §5.7
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_jacobian_closed_form_matches_autograd(approximate):
    torch.manual_seed(0)
    D, Fw = 5, 7
    dt = torch.float64
    gamma, beta = torch.randn(D, dtype=dt), torch.randn(D, dtype=dt)
    w1, b1 = torch.randn(Fw, D, dtype=dt), torch.randn(Fw, dtype=dt)
    w2, b2 = torch.randn(D, Fw, dtype=dt), torch.randn(D, dtype=dt)
    x = torch.randn(2, 3, D, dtype=dt)

    def ffn(y):
        return F.linear(F.gelu(F.linear(y, w1, b1), approximate=approximate), w2, b2)

    J = prenorm_ffn_jacobian_diag(x, gamma, beta, 1e-5, w1, b1, w2, approximate)
    J_post = ffn_jacobian_diag(F.linear(x, w1, b1), w1, w2, approximate)
    for i in range(2):
        for t in range(3):
            full = torch.autograd.functional.jacobian(lambda v: ffn(F.layer_norm(v, (D,), gamma, beta, 1e-5)),
                                                      x[i, t])
            assert torch.allclose(J[i, t], full.diagonal(), atol=1e-5, rtol=0)
            full_post = torch.autograd.functional.jacobian(ffn, x[i, t])
            assert torch.allclose(J_post[i, t], full_post.diagonal(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fused_jacobian_matches_reference_values_and_gradients(approximate):
    """The layer's Jacobian node (hand-written backward, valid rows only, chunked) equals the reference."""
    torch.manual_seed(1)
    D, Fw, dt = 4, 6, torch.float64
    valid = torch.tensor([[False, True, True], [True, True, True]])
    args = (torch.randn(2, 3, D, dtype=dt), torch.randn(D, dtype=dt) + 1, torch.randn(D, dtype=dt),
            torch.randn(Fw, D, dtype=dt), torch.randn(Fw, dtype=dt), torch.randn(D, Fw, dtype=dt))
    args = tuple(a.requires_grad_() for a in args)

    def z_of(x, g, b, w1, b1):
        return F.linear(F.layer_norm(x, (D,), g, b, 1e-5), w1, b1)

    def fused(x, g, b, w1, b1, w2):
        return prenorm_ffn_jacobian_diag_fused(x, g, b, 1e-5, w1, b1, w2, approximate, rows=valid_rows(valid), chunk=2)

    def reference(x, g, b, w1, b1, w2):
        J = prenorm_ffn_jacobian_diag(x, g, b, 1e-5, w1, b1, w2, approximate, z=z_of(x, g, b, w1, b1))
        return J[valid]  # (n, D) rows

    assert torch.allclose(fused(*args), reference(*args), atol=1e-12)
    w = torch.randn(5, D, dtype=dt)
    g_f = torch.autograd.grad((fused(*args) * w).sum(), args)
    g_r = torch.autograd.grad((reference(*args) * w).sum(), args)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(g_f, g_r))
    assert torch.autograd.gradcheck(fused, args)


# ------------------------------------------------------------------------------------------ §5 (NaN, gradients)
def test_rows_without_valid_key_have_no_nan_and_gradients_reach_everything():
    model = sasrec(bft_cfg(), dropout=0.2)
    seq = torch.cat([torch.zeros(5, 1, dtype=torch.long), sequences(B=5, pad=(0, 3, 7, 11, 12))], 1)
    model.calibrate({"seq": seq})
    model.train()
    h = model.encode(seq[:, :-1])
    assert torch.isfinite(h).all()
    loss = model.training_loss({"seq": seq})
    loss.backward()
    last = f"stack.blocks.{len(model.stack.blocks) - 1}.theta_q"
    for name, p in model.named_parameters():
        if name == last:  # the last λ'' feeds no later layer nor the loss: Q of the last layer has no gradient
            assert p.grad is None
            continue
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name != "item_emb.weight":
            assert p.grad.abs().sum() > 0, name
    present = torch.unique(seq[:, :-1][seq[:, :-1] != 0])
    assert (model.stack.tau.tau.grad[present].abs() > 0).all()


def test_detach_precision_grad():
    """Detached: λ carries no gradient into activations or block weights; τ and Q still learn; same forward."""
    full = sasrec(bft_cfg(), seed=0)
    det = sasrec(bft_cfg(bft_detach_precision_grad=True), seed=0)
    det.load_state_dict(full.state_dict())
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences()], 1)
    x = seq[:, :-1]
    masks = build_masks(x, True)
    for m in (full, det):
        m.eval()
        m.zero_grad()
        _, lam = m.stack.forward_with_precision(m.embed(x), x, masks)
        lam[masks.valid].log().sum().backward()
    block_grads = [p.grad for n, p in det.named_parameters() if ".blocks." in n and "theta_q" not in n]
    assert all(g is None or not g.any() for g in block_grads)  # no gradient from λ into block weights
    assert det.item_emb.weight.grad is None or not det.item_emb.weight.grad.any()
    assert det.stack.tau.tau.grad.abs().sum() > 0
    assert all(b.theta_q.grad.abs().sum() > 0 for b in det.stack.blocks)
    assert full.stack.blocks[0].ffn.w1.weight.grad.abs().sum() > 0  # default: λ'' depends on J(W₁)
    for m in (full, det):
        m.zero_grad()
        m.training_loss({"seq": seq}).backward()
    # the forward is the same value, reached by another code path (fused kriging moments vs attn @ v):
    # equal to float32 rounding, never bit-for-bit (differs by 1 ulp on some CPUs)
    torch.testing.assert_close(full.encode(x), det.encode(x), rtol=1e-5, atol=1e-6)
    assert det.stack.tau.tau.grad.abs().sum() > 0 and det.stack.blocks[0].theta_q.grad.abs().sum() > 0
    g_full, g_det = full.stack.blocks[0].attn.out.weight.grad, det.stack.blocks[0].attn.out.weight.grad
    assert not torch.allclose(g_full, g_det)  # the W_O ⊙ W_O path is cut


def test_precision_is_float32_under_autocast():
    model = sasrec(bft_cfg())
    model.eval()
    x = sequences()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mech: dict = {}
        h, lam = model.stack.forward_with_precision(model.embed(x), x, build_masks(x, True), mech=mech)
    assert lam.dtype == torch.float32 and mech["layers"][0]["K"].dtype == torch.float32
    assert torch.isfinite(lam).all() and torch.isfinite(h.float()).all()


# ------------------------------------------------------------------------------------------ §6
def test_mechanism_format():
    model = sasrec(bft_cfg())
    model.eval()
    x = sequences()
    mech = model.mechanism({"item_seq": x})
    valid = x != 0
    B, L = x.shape
    assert mech["lam0"].shape == (B, L) and mech["lam0"].dtype == torch.float32
    assert (mech["lam0"][~valid] == 0).all() and (mech["lam0"][valid] > 0).all()
    assert len(mech["layers"]) == 2
    for layer in mech["layers"]:
        assert set(layer) == {"K", "lam_obs", "n_eff", "Q"}
        for k in ("K", "lam_obs", "n_eff"):
            assert layer[k].shape == (B, L) and layer[k].dtype == torch.float32 and not layer[k].requires_grad
            assert (layer[k][~valid] == 0).all()
        assert ((layer["K"][valid] > 0) & (layer["K"][valid] < 1)).all()
        assert (layer["n_eff"][valid] >= 1 - 1e-5).all()
        assert layer["Q"].shape == (16,) and layer["Q"].dtype == torch.float32
    # Kish n of the first valid position is exactly 1 (one key: itself)
    first = valid.float().argmax(1)
    assert torch.allclose(mech["layers"][0]["n_eff"][torch.arange(B), first], torch.ones(B))


# ------------------------------------------------------------------------------------------ §0, config
@pytest.mark.parametrize("kw", [{}, {"tau_dims": 16}, {"tau_kind": "mlp"}, {"tau_kind": "mlp", "tau_dims": 16}])
def test_parameter_overhead(kw):
    n_std = sum(p.numel() for p in sasrec(StandardLayerConfig()).parameters())
    cfg = bft_cfg(**kw)
    n_bft = sum(p.numel() for p in sasrec(cfg).parameters())
    n_tokens, n_layers, D = N_ITEMS + 1, 2, 16
    assert n_bft - n_std == bft_overhead(cfg, n_tokens, n_layers, D)
    if cfg.tau.kind == "item":
        assert n_bft - n_std == n_tokens * cfg.tau.dims + n_layers * D
    else:
        assert n_bft - n_std == 16 * (D + 1) + cfg.tau.dims * 17 + n_layers * D


def test_initial_precision_scale_slope_and_q():
    model = sasrec(bft_cfg())  # default: units=count, tau.scale=count: τ₀ = 0, Q₀ = 0.1 (BFT.md §7)
    tau = model.stack.tau.tau.detach()
    assert (tau == 0).all()
    q = model.stack.blocks[1].process_noise()
    assert torch.allclose(q, torch.full_like(q, 0.1), rtol=1e-6)
    v1 = sasrec(units_cfg("h"))  # v1: τ₀ = log(1/v₀), Q = 0.1/λ⁰ (BFT.md §0)
    v0 = v1.input_variance()
    tau = v1.stack.tau.tau.detach()[1:, 0]
    assert torch.allclose(tau, torch.full_like(tau, math.log(1 / v0)))
    q = v1.stack.blocks[1].process_noise()
    assert torch.allclose(q, torch.full_like(q, 0.1 * v0), rtol=1e-5)
    for cfg in (bft_cfg(bft_units="h", tau_scale="unit", tau_freq_slope=0.5), bft_cfg(tau_freq_slope=0.5)):
        unit = sasrec(cfg)
        counts = torch.from_numpy(info().train_counts).double()
        want = 0.5 * (torch.log1p(counts[1:]) - torch.log1p(counts[1:]).mean())
        assert torch.allclose(unit.stack.tau.tau.detach()[1:, 0].double(), want, atol=1e-6)
    mlp = sasrec(bft_cfg(tau_kind="mlp"))
    mech = mlp.mechanism({"item_seq": sequences()})
    valid = sequences() != 0
    assert torch.allclose(mech["lam0"][valid], torch.ones(int(valid.sum())))  # MLP's last layer starts at 0
    loss = mlp.training_loss({"seq": torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences()], 1)})
    loss.backward()
    assert mlp.stack.tau.mlp_w2.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["item", "mlp"])
def test_mean_count_start_is_set_by_calibration(kind):
    """BFT.md §7 ``tau.scale=mean_count``: the calibration sets τ₀ = log n̄ (n̄ = mean layer-0 λ̄̂^obs of the batch)
    and Q̂₀ = 0.1/n̄, once; layer-0 λ̂^obs does not depend on τ₀, so the calibrated s₀² equal those of ``count``."""
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12)], 1)
    ref, mc = sasrec(bft_cfg(tau_kind=kind)), sasrec(bft_cfg(tau_kind=kind, tau_scale="mean_count"))
    for m in (ref, mc):
        m.calibrate({"seq": seq})
    x = seq[:, :-1]  # the calibration forward's input (SASRec's training_loss)
    mech = ref.eval().mechanism({"item_seq": x})
    n_bar = float(mech["layers"][0]["lam_obs"][x != 0].mean())
    tau0 = float(mc.stack.tau.start_values()[1])
    assert n_bar > 1 and tau0 == pytest.approx(math.log(n_bar), rel=1e-4)
    q = mc.stack.blocks[0].process_noise()
    torch.testing.assert_close(q, torch.full_like(q, 0.1 / n_bar), rtol=1e-4, atol=0)
    torch.testing.assert_close(mc.stack.blocks[0].s0sq, ref.stack.blocks[0].s0sq)
    got = mc.eval().mechanism({"item_seq": x})
    torch.testing.assert_close(got["layers"][0]["lam_obs"], mech["layers"][0]["lam_obs"])
    torch.testing.assert_close(got["lam0"][x != 0], torch.full((int((x != 0).sum()),), n_bar), rtol=1e-4, atol=0)
    mc.calibrate({"seq": seq})  # once: a second calibration keeps τ
    assert float(mc.stack.tau.start_values()[1]) == tau0


@pytest.mark.parametrize("kind", ["item", "mlp"])
def test_tau_lr_scale_is_a_param_group(kind):
    """layer.tau.lr_scale: τ learns at lr·lr_scale (its own optimizer param group); 1 keeps one group, unchanged."""
    from bftrec.config import TrainerConfig
    from bftrec.trainer import _optimizer

    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences()], 1)
    steps = {}
    for scale in (1.0, 10.0):
        model = sasrec(bft_cfg(tau_kind=kind, tau_lr_scale=scale))
        model.calibrate({"seq": seq})
        opt = _optimizer(model, TrainerConfig(lr=1e-3))
        tau = list(model.stack.tau.parameters())
        if scale == 1.0:
            assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == list(model.parameters())
        else:
            assert [g["lr"] for g in opt.param_groups] == [1e-3, pytest.approx(1e-2)]
            assert opt.param_groups[1]["params"] == tau
        before = [p.detach().clone() for p in tau]
        model.training_loss({"seq": seq}).backward()
        opt.step()
        steps[scale] = max(float((p.detach() - b).abs().max()) for p, b in zip(tau, before))
    assert steps[10.0] == pytest.approx(10 * steps[1.0], rel=1e-3)  # Adam's first step: lr per coordinate


def test_tau_mlp_reads_the_item_embedding_only():
    """BFT.md §0: τ = τ₀ + MLP(e_x): no position, no dropout. The same item has the same λ⁰ anywhere, in training."""
    model = sasrec(bft_cfg(tau_kind="mlp"), dropout=0.5)
    with torch.no_grad():
        model.stack.tau.mlp_w2.normal_()  # a non-trivial MLP
    x = torch.tensor([[0, 5, 7, 5, 9, 5, 7, 5, 3, 5, 1, 5]])  # item 5 at six positions
    model.train()
    torch.manual_seed(0)
    lam0 = model.stack.initial_precision(x, valid_rows(x != 0), model.item_embedding)[:, 0]  # (n,)
    at5 = lam0[(x[x != 0] == 5)]
    assert torch.allclose(at5, at5[0].expand_as(at5)) and not torch.allclose(lam0, lam0[0].expand_as(lam0))
    mech: dict = {}
    torch.manual_seed(1)
    model.encode(x, mech=mech)  # through the backbone: the same item embedding, dropout on
    torch.testing.assert_close(mech["lam0"][x == 5], at5)


def test_calibration_runs_without_dropout():
    """s₀² and the gains after calibration do not depend on a dropout draw; the training mode is restored."""
    seq = torch.cat([torch.zeros(4, 1, dtype=torch.long), sequences(L=12)], 1)
    s0 = []
    for seed in (0, 1):
        model = sasrec(bft_cfg(), dropout=0.5)
        model.train()
        torch.manual_seed(seed)
        model.calibrate({"seq": seq})
        assert model.training
        s0.append(torch.cat([b.s0sq for b in model.stack.blocks]))
    torch.testing.assert_close(s0[0], s0[1])


@pytest.mark.parametrize("kw,key", [
    ({"tau_kind": "table"}, "layer.tau.kind"),
    ({"tau_scale": "log"}, "layer.tau.scale"),
    ({"bft_units": "h", "tau_scale": "log"}, "layer.tau.scale"),
    ({"bft_units": "counts"}, "layer.bft.units"),
    ({"bft_precision": "fixed"}, "layer.bft.precision"),
    ({"bft_prior_dof": 0.0}, "layer.bft.prior_dof"),
    ({"bft_prior_dof": -1.0}, "layer.bft.prior_dof"),
    ({"tau_dims": 3}, "layer.tau.dims"),
    ({"bft_s0_momentum": 0.0}, "layer.bft.s0_momentum"),
    ({"bft_clamp_min": 0.0}, "layer.bft.clamp_min"),
    ({"tau_lr_scale": 0.0}, "layer.tau.lr_scale"),
])
def test_bad_config_values_raise(kw, key):
    with pytest.raises(ConfigError) as err:
        sasrec(bft_cfg(**kw))
    msg = str(err.value)
    assert key in msg and "\n" not in msg and str(next(iter(kw.values()))) in msg
    if key in ("layer.tau.scale", "layer.bft.units"):  # the line lists the valid values
        want = ("count, mean_count", "embedding, unit") if key == "layer.tau.scale" else ("count, h",)
        assert any(w in msg for w in want)


@pytest.mark.parametrize("units,scale,fix", [
    ("count", "embedding", "layer.bft.units=h"), ("count", "unit", "layer.bft.units=h"),
    ("h", "count", "layer.bft.units=count"), ("h", "mean_count", "layer.bft.units=count"),
])
def test_scale_of_the_other_units_is_refused(units, scale, fix):
    """BFT.md §0/§7: each tau.scale belongs to one bft.units; the error names the combination and the fix."""
    for make in (lambda: bft_cfg(bft_units=units, tau_scale=scale),  # typed config
                 lambda: merge_schema(LAYER_CONFIGS["bft"], {"tau": {"scale": scale}, "bft": {"units": units}},
                                      "layer")):  # the yaml path: fails at start, when the config is merged
        with pytest.raises(ConfigError) as err:
            make()
        msg = str(err.value)
        assert "\n" not in msg and f"layer.tau.scale={scale}" in msg and f"layer.bft.units={units}" in msg
        assert fix in msg


def test_no_variant_for_unknown_block():
    class OtherBlock(SASRecBlock):
        pass

    msg = "layer=bft is not available for OtherBlock; BFT variants exist for: .*SASRecBlock"
    with pytest.raises(ConfigError, match=msg):
        build_stack(BFTLayerConfig(), OtherBlock, 2, n_tokens=5, precision_ctx={"input_variance": 1.0},
                    d_model=8, n_heads=2, d_ff=16, dropout=0.0, attn_dropout=0.0)
    stack = build_stack(BFTLayerConfig(), SASRecBlock, 2, n_tokens=5, precision_ctx={"input_variance": 1.0},
                        d_model=8, n_heads=2, d_ff=16, dropout=0.0, attn_dropout=0.0)
    assert isinstance(stack, BFTStack) and all(type(b) is BFTSASRecBlock for b in stack.blocks)


def test_yaml_matches_dataclass():
    raw_h = OmegaConf.load(ROOT / "configs" / "layer" / "bft_h.yaml")
    assert merge_schema(LAYER_CONFIGS["bft_h"], raw_h, "layer") == BFTHLayerConfig()
    assert BFTHLayerConfig().bft.units == "h" and BFTHLayerConfig().tau.scale == "embedding"  # v1
    assert LAYER_BUILDERS.get("bft_h") is LAYER_BUILDERS.get("bft")
    raw = OmegaConf.load(ROOT / "configs" / "layer" / "bft.yaml")
    assert merge_schema(LAYER_CONFIGS["bft"], raw, "layer") == BFTLayerConfig()
    assert BFTLayerConfig().bft.units == "count" and BFTLayerConfig().tau.scale == "count"
    assert set(raw.tau) == set(TauConfig.__dataclass_fields__) and set(raw.bft) == set(BFTParams.__dataclass_fields__)
    bad = copy.deepcopy(raw)
    bad.tau.kindd = "item"
    with pytest.raises(ConfigError, match="kindd"):
        merge_schema(LAYER_CONFIGS["bft"], bad, "layer")


def test_bench_layer_calibrates_the_bft_block():
    """scripts/bench_layer.py times the layer with the s₀² a calibration pass gives, not the buffer's initial 1."""
    from tests.scripts import load_script

    runner = load_script("bench_layer").LayerRunner("bft", torch.device("cpu"), False)
    assert bool(runner.block.s0sq_ready) and not torch.allclose(runner.block.s0sq, torch.ones_like(runner.block.s0sq))
    assert runner.block.training


@pytest.mark.parametrize("model", ["bert4rec", "hstu"])
def test_bench_layer_builds_the_other_backbones_with_their_bft_twin(model):
    """bench_layer --model: the e2e runner builds that backbone with the BFT stack and takes a training step."""
    import numpy as np

    from tests.scripts import load_script

    bench = load_script("bench_layer")
    windows, _ = bench.training_windows(np.random.default_rng(0))
    runner = bench.E2ERunner("bft", torch.device("cpu"), False, "sampled_softmax", windows[:64], batch=16, model=model)
    assert type(runner.model).__name__.lower().startswith(model[:4])
    assert type(runner.model.stack).__name__ == "BFTStack"
    before = [p.detach().clone() for p in runner.model.parameters()]
    runner.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, runner.model.parameters()))
