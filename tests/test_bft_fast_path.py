"""The BFT layer's fast paths equal the reference computation (BFT.md §1, §3, §5.8).

``precision.kriging_attention`` (masked softmax, attention dropout, value path, kriging moments and Kish
sums in one autograd node) against ``masked_softmax`` → ``nn.Dropout`` → ``@ v`` beside ``kriging_stats``
→ ``gather_head_rows``; and whole blocks with ``reference_observe`` on and off: forward values and
gradients to ~1e-5 relative in float32, never bit equality.
"""
from __future__ import annotations

import pytest
import torch

from bftrec.layers import build_masks, masked_softmax
from bftrec.layers.bft import BFTParams, LayerRun
from bftrec.layers.precision import gather_head_rows, kriging_attention, kriging_stats, valid_rows
from bftrec.models.bert4rec import BERT4RecBlock
from bftrec.models.sasrec import SASRecBlock

RTOL, ATOL = 1e-5, 1e-6


def _items(B: int = 4, T: int = 7) -> torch.Tensor:
    torch.manual_seed(0)
    items = torch.randint(1, 20, (B, T))
    items[1, :3] = 0  # left padding: query rows without a valid key under the causal mask
    items[2, :] = 0  # an all-padding row
    return items


def _reference(logits, bias, allowed, v, rows, p, train):
    alpha = masked_softmax(logits + bias, allowed)  # (B, H, T, T)
    mv = torch.nn.functional.dropout(alpha, p, train) if p > 0 and train else alpha
    m, S, a2, b = kriging_stats(alpha, v)
    mv = mv @ v if p > 0 and train else m
    return mv, gather_head_rows(S, rows), gather_head_rows(a2, rows), gather_head_rows(b, rows)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kriging_attention_matches_reference_values_and_gradients(p, dtype):
    items = _items()
    B, T = items.shape
    H, d = 2, 3
    masks = build_masks(items, causal=True)
    rows = valid_rows(masks.valid)
    allowed = masks.attn & masks.valid[:, None, None, :]
    torch.manual_seed(1)
    inputs = [torch.randn(B, H, T, T, dtype=dtype) * 2, torch.randn(B, 1, 1, T, dtype=dtype),
              torch.randn(B, H, T, d, dtype=dtype)]
    inputs = [x.requires_grad_() for x in inputs]
    torch.manual_seed(5)
    fast = kriging_attention(inputs[0], inputs[1], allowed, inputs[2], rows, p, True)[:4]
    torch.manual_seed(5)  # the same dropout draw: aten.native_dropout and F.dropout share the generator
    ref = _reference(inputs[0], inputs[1], allowed, inputs[2], rows, p, True)
    tol = dict(rtol=RTOL, atol=ATOL) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, **tol)
        assert torch.isfinite(a).all()
    w = [torch.randn_like(x) for x in ref]
    g_fast = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(fast, w)), inputs)
    g_ref = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(ref, w)), inputs)
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, **tol)
    assert (g_fast[0][2] == 0).all()  # an all-padding sequence gets no gradient and no NaN


def test_kriging_attention_gradcheck():
    items = _items(B=3, T=4)
    masks = build_masks(items, causal=True)
    rows = valid_rows(masks.valid)
    allowed = masks.attn & masks.valid[:, None, None, :]
    torch.manual_seed(2)
    x = (torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(3, 1, 1, 4, dtype=torch.float64),
         torch.randn(3, 2, 4, 3, dtype=torch.float64))

    def f(logits, bias, v):
        return kriging_attention(logits, bias, allowed, v, rows)[:4]

    assert torch.autograd.gradcheck(f, tuple(t.requires_grad_() for t in x))


def _block_outputs(block_cls, causal: bool, detach: bool, reference: bool, train: bool):
    from bftrec.layers.bft import bft_variant_for
    items = _items(B=5, T=9)
    masks = build_masks(items, causal=causal)
    rows = valid_rows(masks.valid)
    torch.manual_seed(3)
    block = bft_variant_for(block_cls)(16, 2, 32, 0.2, 0.25, bft_cfg=BFTParams(detach_precision_grad=detach))
    block.reference_observe = reference
    torch.manual_seed(4)
    h = torch.randn(5, 9, 16, requires_grad=True)
    lam = (torch.rand(len(rows), 16) * 5 + 0.5).requires_grad_()
    block.eval()
    with torch.no_grad():
        block(h, lam, masks, run=LayerRun(calibrate=True, rows=rows))
    block.train(train)
    torch.manual_seed(7)  # the same dropout draws on both paths
    h2, lam2, _ = block(h, lam, masks, run=LayerRun(rows=rows))
    torch.manual_seed(8)
    loss = (h2 * torch.randn_like(h2)).sum() + (lam2 * torch.randn_like(lam2)).sum()
    params = [h, lam] + [p for p in block.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [h2, lam2] + [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


@pytest.mark.parametrize("block_cls,causal", [(SASRecBlock, True), (BERT4RecBlock, False)])
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_block_fast_path_matches_reference(block_cls, causal, detach, train):
    """Whole block (observe fast path, and for SASRec the Jacobian that recomputes z on rows) vs reference."""
    fast = _block_outputs(block_cls, causal, detach, reference=False, train=train)
    ref = _block_outputs(block_cls, causal, detach, reference=True, train=train)
    for a, b in zip(fast, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
