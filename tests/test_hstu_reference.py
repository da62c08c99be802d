"""HSTU matches its reference (meta-recsys/generative-recommenders, research/modeling/sequential/hstu.py)
in initialisation and eps; the deliberate deviations are listed in ``bftrec/models/hstu.py``."""
import math

import numpy as np
import pytest
import torch

from bftrec.layers import LAYER_CONFIGS
from bftrec.models import MODELS, DataInfo

D, N_ITEMS, MAX_LEN = 64, 3000, 50


def _hstu(layer: str = "standard", time_bias: bool = False):
    torch.manual_seed(0)
    cls = MODELS.get("hstu")
    cfg = cls.Config(d_model=D, max_len=MAX_LEN, n_layers=2, time_bias=time_bias)
    info = DataInfo(n_items=N_ITEMS, train_counts=np.ones(N_ITEMS + 1, dtype=np.int64), has_timestamps=time_bias)
    return cls(cfg, LAYER_CONFIGS[layer](), info)


TRUNC_STD = 0.8796  # std of N(0, 1) truncated at ±2


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_blocks_have_the_reference_eps_and_init(layer):
    for block in _hstu(layer).stack.blocks:
        assert block.ln1.eps == block.ln2.eps == 1e-6
        assert block.attn.uvqk.bias is None  # the reference's uvqk is a bare matrix
        torch.testing.assert_close(block.attn.uvqk.weight.std().item(), 0.02, rtol=0.05, atol=0)
        w = block.f2.weight  # Xavier uniform: U(±sqrt(6 / (2D))), std sqrt(1 / D)
        assert w.abs().max() <= math.sqrt(3 / D)
        torch.testing.assert_close(w.std().item(), D ** -0.5, rtol=0.05, atol=0)
        b = block.f2.bias  # torch's default Linear bias: U(±1/sqrt(D)), not zero
        assert b.abs().max() <= D ** -0.5 and b.abs().max() > 0.5 * D ** -0.5


def test_embeddings_have_the_reference_init():
    model = _hstu()
    item, pos = model.item_emb.weight, model.pos_emb.weight
    assert item[0].abs().sum() == 0  # padding row
    assert item.abs().max() <= 2 * 0.02 + 1e-7
    torch.testing.assert_close(item[1:].std().item(), 0.02 * TRUNC_STD, rtol=0.03, atol=0)
    assert pos.abs().max() <= 2 * D ** -0.5 + 1e-7
    torch.testing.assert_close(pos.std().item(), D ** -0.5 * TRUNC_STD, rtol=0.06, atol=0)


def test_time_buckets_are_the_reference_log_buckets():
    """floor(ln(max(|gap|, 1)) / 0.301), clipped: 0 s and 1 s share bucket 0, a minute is bucket 13,
    a day bucket 37; the sign of the gap does not matter; large gaps stop at n_buckets."""
    from bftrec.models.hstu import time_buckets

    gaps = torch.tensor([0, 1, 2, 60, -60, 3600, 86400, 10**9])
    assert time_buckets(gaps, 128).tolist() == [0, 0, 2, 13, 13, 27, 37, 68]
    assert time_buckets(gaps, 30).tolist() == [0, 0, 2, 13, 13, 27, 30, 30]


@pytest.mark.parametrize("n_buckets", [16, 128, 200])
def test_time_buckets_from_starts_equal_the_formula(n_buckets):
    """The bucketize route gives the formula's integers on every bucket's first second, the second
    before it and after it, and on random gaps of up to 2^61 s either sign."""
    from bftrec.models.hstu import _bucket_starts, _reference_buckets, time_buckets

    starts = _bucket_starts(n_buckets)
    assert len(starts) == min(n_buckets, 142) and bool((starts[1:] >= starts[:-1]).all())
    g = torch.Generator().manual_seed(0)
    gaps = torch.cat([starts - 1, starts, starts + 1, -starts, torch.arange(-100, 101),
                      torch.randint(-10**10, 10**10, (20_000,), generator=g),
                      torch.randint(-2**61, 2**61, (2_000,), generator=g)])
    assert torch.equal(time_buckets(gaps, n_buckets), _reference_buckets(gaps, n_buckets))


def test_block_context_is_the_bucket_table_once():
    """HSTU.block_context: {} without the time bias; with it the (B, T, T) bucket table of the last
    max_len columns; a missing time column fails with the message naming batch['time']."""
    from bftrec.models.hstu import time_buckets

    model = _hstu(time_bias=True)
    t = torch.arange(2 * model.cfg.max_len).repeat(3, 1) * 1000  # (3, 2 max_len) seconds
    ctx = model.block_context(t)
    T = model.cfg.max_len
    assert set(ctx) == {"time_bucket"} and ctx["time_bucket"].shape == (3, T, T)
    tail = t[:, -T:]
    assert torch.equal(ctx["time_bucket"], time_buckets(tail[:, :, None] - tail[:, None, :], model.cfg.n_time_buckets))
    with pytest.raises(ValueError, match=r"batch\['time'\]"):
        model.block_context(None)
    assert _hstu().block_context(t) == {}


def test_time_buckets_refuse_float_gaps():
    """Float gaps would be bucketed differently from the formula below 2 s: refused in one line."""
    from bftrec.models.hstu import time_buckets

    with pytest.raises(TypeError, match="integer seconds"):
        time_buckets(torch.tensor([1.5]), 128)
