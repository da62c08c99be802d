"""The full-softmax CE head (bftrec/models/base.py): chunked CE against the materialised reference.

``chunked_ce`` must equal ``plain_ce`` (and the historical formulation: logits over the whole table
with column 0 masked, ``ignore_index`` on padding targets) in loss and gradients w.r.t. the hidden
states, the item table and the bias, to float32 rounding; it must save no (P, N) tensor for the
backward; every backbone with a CE mode must give the same loss and parameter gradients with
``ce_chunk`` > 0 and with the reference ``ce_chunk=0``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bftrec.models  # noqa: F401  registers the backbones
from bftrec.config import ConfigError
from bftrec.layers import LAYER_CONFIGS
from bftrec.models import MODELS, DataInfo, base
from bftrec.models.base import chunked_ce, next_item_loss, plain_ce

TOL = dict(atol=1e-6, rtol=1e-5)


def _inputs(P: int, N: int, D: int, dtype=torch.float32, seed: int = 0, cosine: bool = False):
    """h (P, D), targets (P,), table (N, D), bias (N,); unit rows with ``cosine`` (logits in [-1, 1])."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(P, D, generator=g, dtype=dtype)
    table = torch.randn(N, D, generator=g, dtype=dtype) * 0.5
    if cosine:
        h, table = F.normalize(h, dim=-1), F.normalize(table, dim=-1)
    h, table = h.requires_grad_(), table.requires_grad_()
    bias = (torch.randn(N, generator=g, dtype=dtype) * 0.1).requires_grad_()
    targets = torch.randint(0, N, (P,), generator=g)
    return h, targets, table, bias


def _loss_and_grads(fn, h, table, bias):
    loss = fn()
    return (loss, *torch.autograd.grad(loss, (h, table, bias)))


@pytest.mark.parametrize("P,chunk", [(37, 10), (37, 37), (5, 64), (9, 1)])  # ragged, exact, P < chunk, 1 row
@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_chunked_equals_plain_loss_and_grads_fp32(P: int, chunk: int, scale: float) -> None:
    h, t, table, bias = _inputs(P, 53, 16, cosine=scale != 1.0)  # scale 20: HSTU's cosine / 0.05
    ref = _loss_and_grads(lambda: plain_ce(h, t, table, bias, scale), h, table, bias)
    got = _loss_and_grads(lambda: chunked_ce(h, t, table, bias, scale, chunk=chunk), h, table, bias)
    assert got[0].dtype == torch.float32
    for name, a, b in zip(("loss", "d/dh", "d/dtable", "d/dbias"), got, ref):
        torch.testing.assert_close(a, b, **TOL, msg=name)


def test_chunked_without_bias_and_under_no_grad() -> None:
    h, t, table, _ = _inputs(23, 40, 8)
    ref = plain_ce(h, t, table)
    h_grad, w_grad = torch.autograd.grad(chunked_ce(h, t, table, chunk=4), (h, table))
    torch.testing.assert_close(h_grad, torch.autograd.grad(ref, h, retain_graph=True)[0], **TOL)
    torch.testing.assert_close(w_grad, torch.autograd.grad(ref, table)[0], **TOL)
    with torch.no_grad():  # the calibration pass: no gradient work, same value
        torch.testing.assert_close(chunked_ce(h, t, table, chunk=4), plain_ce(h, t, table), **TOL)


def test_gradcheck_fp64() -> None:
    h, t, table, bias = _inputs(7, 5, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: chunked_ce(a, t, b, c, 3.0, chunk=3), (h, table, bias))


def test_chunked_saves_no_P_by_N_tensor() -> None:
    """The reference keeps (P, N) log-probabilities for the backward; the chunked CE keeps none."""
    P, N = 40, 300
    h, t, table, bias = _inputs(P, N, 8)

    def saved_sizes(fn) -> list:
        sizes: list = []
        with torch.autograd.graph.saved_tensors_hooks(lambda x: sizes.append(x.numel()) or x, lambda x: x):
            fn().backward()
        return sizes

    assert max(saved_sizes(lambda: plain_ce(h, t, table, bias))) >= P * N  # the check can fail
    assert max(saved_sizes(lambda: chunked_ce(h, t, table, bias, chunk=8))) < P * N


def test_chunk_must_be_positive() -> None:
    h, t, table, _ = _inputs(3, 4, 2)
    with pytest.raises(ValueError, match="chunk=0"):
        chunked_ce(h, t, table, chunk=0)


def test_chunked_under_cpu_autocast_is_close() -> None:
    h, t, table, bias = _inputs(30, 50, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain_ce(h, t, table, bias)
        got = chunked_ce(h, t, table, bias, chunk=7)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref.float(), atol=5e-2, rtol=1e-2)


@pytest.mark.parametrize("ce_chunk", [0, 4])
@pytest.mark.parametrize("temperature", [1.0, 0.05])
def test_next_item_loss_ce_matches_masked_formulation(ce_chunk: int, temperature: float) -> None:
    """Padding targets (0) are ignored; padding (row 0) and special rows past N are never classes."""
    B, L, D, n_items = 3, 6, 8, 20
    g = torch.Generator().manual_seed(1)
    h, table = torch.randn(B, L, D, generator=g), torch.randn(n_items + 2, D, generator=g)  # + a [MASK] row
    if temperature != 1.0:  # HSTU: cosines / temperature
        h, table = F.normalize(h, dim=-1), F.normalize(table, dim=-1)
    h, table = h.requires_grad_(), table.requires_grad_()
    bias = torch.randn(n_items + 2, generator=g).requires_grad_()
    targets = torch.randint(1, n_items + 1, (B, L), generator=g)
    targets[0, :2] = 0
    targets[2, :5] = 0
    got = _loss_and_grads(lambda: next_item_loss(h, targets, table, "ce", 0, n_items, bias, temperature,
                                                 ce_chunk=ce_chunk), h, table, bias)

    def historical():
        logits = (h.reshape(-1, D) @ table[: n_items + 1].t() + bias[: n_items + 1]) / temperature  # (B L, N + 1)
        logits = logits.masked_fill(torch.arange(n_items + 1) == 0, float("-inf"))
        return F.cross_entropy(logits, targets.reshape(-1), ignore_index=0)

    ref = _loss_and_grads(historical, h, table, bias)
    for name, a, b in zip(("loss", "d/dh", "d/dtable", "d/dbias"), got, ref):
        torch.testing.assert_close(a, b, **TOL, msg=name)
    assert got[2][0].abs().max() == 0 and got[2][-1].abs().max() == 0  # padding and [MASK] rows untouched


# ---------------------------------------------------------------------------------------------- backbones


def _ce_models() -> list[str]:
    """Every registered backbone whose config accepts ``loss=ce`` (all of them use the shared head)."""
    return [name for name in MODELS.names() if "ce_chunk" in MODELS.get(name).Config.__dataclass_fields__]


def _model(name: str, ce_chunk: int):
    torch.manual_seed(0)
    cls = MODELS.get(name)
    cfg = cls.Config(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8, dropout=0.0, attn_dropout=0.0,
                     loss="ce", ce_chunk=ce_chunk)
    counts = np.arange(31, dtype=np.int64)
    return cls(cfg, LAYER_CONFIGS["standard"](), DataInfo(n_items=30, train_counts=counts, has_timestamps=True))


def test_every_backbone_has_the_ce_chunk_key() -> None:
    assert set(_ce_models()) == set(MODELS.names())


@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_backbone_training_loss_chunked_equals_reference(name: str) -> None:
    if not getattr(MODELS.get(name), "trainable", True):
        pytest.skip(f"{name} is counted, not trained: no loss head")
    g = torch.Generator().manual_seed(2)
    seq = torch.randint(1, 31, (4, 9), generator=g)
    seq[1, :4] = 0
    seq[3, :7] = 0
    time = (1_600_000_000 + torch.randint(1, 1000, seq.shape, generator=g).cumsum(1)) * seq.ne(0)
    batch = {"seq": seq, "time": time}
    out = []
    for ce_chunk in (0, 5):
        model = _model(name, ce_chunk)
        torch.manual_seed(3)  # BERT4Rec's cloze masking draws the same positions
        loss = model.training_loss(batch)
        loss.backward()
        out.append((loss.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}))
    (ref, ref_g), (got, got_g) = out
    torch.testing.assert_close(got, ref, **TOL)
    assert set(got_g) == set(ref_g) and ref_g
    for k in ref_g:  # absolute tolerance on the gradient's own scale (HSTU's temperature 0.05 makes it ~20)
        scale = max(1.0, float(ref_g[k].abs().max()))
        torch.testing.assert_close(got_g[k], ref_g[k], atol=TOL["atol"] * scale, rtol=TOL["rtol"], msg=k)


def test_negative_ce_chunk_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="model.ce_chunk=-1"):
        _model("sasrec", -1)


@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_ce_chunk_default_is_the_measured_one(name: str) -> None:
    """Dataclass, model yaml and ``CE_CHUNK`` (chosen by scripts/bench_train.py) agree."""
    from omegaconf import OmegaConf

    from bftrec.config import CONFIG_DIR
    from bftrec.models.base import CE_CHUNK

    yaml = OmegaConf.load(f"{CONFIG_DIR}/model/{name}.yaml")
    assert MODELS.get(name).Config().ce_chunk == yaml.ce_chunk == CE_CHUNK


# --- sampled softmax: negatives shared by the batch, or drawn per position (HSTU's reference) ---

def _sampled_reference(h, pos, table, neg, temperature, bias=None):
    """Loop over positions: -log softmax of [pos, negatives of that row], accidental hits removed."""
    terms = []
    for p in range(len(pos)):
        row_neg = neg[p] if neg.dim() == 2 else neg
        cand = torch.cat([pos[p:p + 1], row_neg[row_neg != pos[p]]])
        logits = table[cand] @ h[p]
        if bias is not None:
            logits = logits + bias[cand]
        terms.append(-torch.log_softmax(logits / temperature, dim=0)[0])
    return torch.stack(terms).mean()


ROUTES = {"gather": 0, "dense": 10**9}  # DENSE_NEGATIVES_RATIO forcing each route of per_position_logits


@pytest.mark.parametrize("per, route", [("batch", "gather"), ("position", "gather"), ("position", "dense")])
@pytest.mark.parametrize("with_bias", [False, True])
def test_sampled_softmax_matches_the_per_position_loop(per: str, route: str, with_bias: bool, monkeypatch) -> None:
    monkeypatch.setattr(base, "DENSE_NEGATIVES_RATIO", ROUTES[route])
    monkeypatch.setattr(base, "DENSE_NEGATIVES_BLOCK", 40)  # dense route: 4 rows per block, 4 blocks
    h, targets, table, bias = _inputs(P=13, N=9, D=6, seed=4)
    table = torch.cat([torch.zeros(1, 6), table])  # row 0 = padding, items 1..9
    bias = torch.cat([torch.zeros(1), bias]) if with_bias else None
    targets = targets + 1  # item ids 1..9
    torch.manual_seed(7)
    got = next_item_loss(h[None], targets[None], table, "sampled_softmax", n_negatives=5, n_items=9,
                         bias=bias, temperature=0.5, negatives_per=per)
    torch.manual_seed(7)  # the same draw as inside next_item_loss
    shape = (13, 5) if per == "position" else (5,)
    neg = torch.randint(1, 10, shape)
    torch.testing.assert_close(got, _sampled_reference(h, targets, table, neg, 0.5, bias), **TOL)


def test_per_position_logits_routes_agree_in_value_and_gradient(monkeypatch) -> None:
    """The dense route (matmul + column gather, in blocks) and the (P, K, D) gather give the same
    logits and gradients for h and the table, and the auto choice follows DENSE_NEGATIVES_RATIO."""
    g = torch.Generator().manual_seed(11)
    h0 = torch.randn(37, 6, generator=g, dtype=torch.float64)
    table0 = torch.randn(41, 6, generator=g, dtype=torch.float64)
    neg = torch.randint(0, 41, (37, 8), generator=g)
    w = torch.randn(37, 8, generator=g, dtype=torch.float64)
    # ML-1M's HSTU (3,707 rows, K=128) takes the dense route; Sports' (18,358 rows) the gather
    assert 18357 + 1 > base.DENSE_NEGATIVES_RATIO * 128 >= 3706 + 1
    got, real_gather, blocks = {}, torch.gather, []
    monkeypatch.setattr(torch, "gather", lambda *a, **k: blocks.append(1) or real_gather(*a, **k))
    monkeypatch.setattr(base, "DENSE_NEGATIVES_BLOCK", 41 * 5)  # 5 positions per block: 8 blocks, the last short
    for route, ratio in ROUTES.items():
        monkeypatch.setattr(base, "DENSE_NEGATIVES_RATIO", ratio)
        h, table = h0.clone().requires_grad_(), table0.clone().requires_grad_()
        blocks.clear()
        out = base.per_position_logits(h, table, neg)
        assert len(blocks) == (8 if route == "dense" else 0), (route, len(blocks))
        assert base.per_position_logits(h[:0], table, neg[:0]).shape == (0, 8), route  # no positions
        (out * w).sum().backward()
        got[route] = (out.detach(), h.grad, table.grad)
    loop = torch.stack([table0[neg[p]] @ h0[p] for p in range(37)])
    torch.testing.assert_close(got["gather"][0], loop, rtol=1e-12, atol=1e-12)
    for a, b in zip(got["dense"], got["gather"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_negatives_per_position_are_drawn_per_position(monkeypatch) -> None:
    """With one negative each, 200 positions see many distinct negatives; a shared draw gives one."""
    h = torch.randn(200, 4)
    pos = torch.ones(200, dtype=torch.long)
    table = torch.randn(51, 4)
    real = torch.randint
    for per, distinct_min, distinct_max in (("batch", 1, 1), ("position", 20, 50)):
        seen = []
        monkeypatch.setattr(torch, "randint", lambda *a, seen=seen, **k: seen.append(real(*a, **k)) or seen[-1])
        next_item_loss(h[None], pos[None], table, "sampled_softmax", 1, 50, negatives_per=per)
        monkeypatch.setattr(torch, "randint", real)
        (neg,) = seen
        assert distinct_min <= neg.unique().numel() <= distinct_max, (per, neg.shape)


@pytest.mark.parametrize("layer", ["standard", "bft"])
@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_every_backbone_passes_negatives_per(name: str, layer: str) -> None:
    """Each backbone's training loss, standard or BFT, changes with ``negatives_per`` (the key is not ignored)."""
    from omegaconf import OmegaConf

    from bftrec.config import CONFIG_DIR

    cls = MODELS.get(name)
    if not getattr(cls, "trainable", True):
        pytest.skip(f"{name} is counted, not trained: no loss head")
    assert cls.Config().negatives_per == OmegaConf.load(f"{CONFIG_DIR}/model/{name}.yaml").negatives_per == "batch"
    seq = torch.randint(1, 31, (4, 9), generator=torch.Generator().manual_seed(2))
    time = (1_600_000_000 + torch.arange(9).expand(4, 9) * 60) * seq.ne(0)
    losses = {}
    for per in ("batch", "position"):
        cfg = cls.Config(d_model=8, n_heads=1, d_ff=8, n_layers=1, max_len=8, dropout=0.0, attn_dropout=0.0,
                         loss="sampled_softmax", n_negatives=4, negatives_per=per)
        torch.manual_seed(0)
        try:
            model = cls(cfg, LAYER_CONFIGS[layer](),
                        DataInfo(n_items=30, train_counts=np.arange(31, dtype=np.int64), has_timestamps=True))
        except ConfigError as e:  # a backbone without the optional BFT twin (docs/ADD_A_BACKBONE.md) is skipped
            if "not available" in str(e):
                pytest.skip(f"{name} has no {layer} variant: {e}")
            raise
        torch.manual_seed(3)
        losses[per] = model.training_loss({"seq": seq, "time": time}).item()
        assert np.isfinite(losses[per]), (per, losses)
    assert abs(losses["batch"] - losses["position"]) > 1e-4, losses


def test_unknown_negatives_per_is_a_config_error() -> None:
    cls = MODELS.get("hstu")
    with pytest.raises(ConfigError, match="model.negatives_per"):
        cls(cls.Config(negatives_per="user"), LAYER_CONFIGS["standard"](),
            DataInfo(n_items=30, train_counts=np.arange(31, dtype=np.int64), has_timestamps=True))
