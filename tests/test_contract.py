"""The backbone contract, checked for every registered backbone x every layer variant.

The parametrisation reads the registry (``MODELS.names()`` x ``sorted(LAYER_CONFIGS)``), so a new
backbone (one model file, one import line, one yaml; docs/ADD_A_BACKBONE.md) is covered without
editing this file. A pair whose layer variant does not exist yet (``build_stack`` raises a
``ConfigError`` saying "not available", e.g. a backbone without a BFT twin) is marked
``xfail(strict=True)`` at collection: the suite stays green, and the mark disappears by itself, so the
checks start to bind, as soon as the variant exists.

Every check is a plain function ``check_*(factory)`` over a model factory, so the same functions run
on the toy backbone (``tests/toy_backbone.py``), which is registered only inside its own tests (a
scoped copy of the registry), so that no other test file ever sees it.

Tiny setting: d_model 16, 2 blocks, 2 heads, max_len 8, 30 items, 5 left-padded random sequences
with increasing unix timestamps.
"""
from __future__ import annotations

import functools
import importlib.util
import io
import math
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import bftrec.models  # noqa: F401  the import lines register every backbone
from bftrec.config import ConfigError, merge_schema
from bftrec.layers import LAYER_CONFIGS
from bftrec.models import MODELS, DataInfo

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
TOY_FILE = Path(__file__).resolve().parent / "toy_backbone.py"
TOY_CONFIG_DIR = Path(__file__).resolve().parent / "configs"

N_ITEMS, MAX_LEN, BATCH = 30, 8, 5
COMMON_FIELDS = ("name", "d_model", "n_layers", "n_heads", "d_ff", "dropout", "attn_dropout", "max_len",
                 "loss", "n_negatives", "init_std")
TINY = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=MAX_LEN, dropout=0.1, attn_dropout=0.1,
            n_negatives=8)
ATOL = 1e-5
# Parameter tensors that legitimately get no gradient from the training loss (regex on the name;
# ``{last}`` = index of the last block), each with its reason. Keep this list short and explained.
NO_GRAD_OK = {
    r"stack\.blocks\.{last}\.theta_q": "BFT: the last block's process noise Q only shapes the final "
    "precision λ'' (BFT.md §3), which no loss reads; BFTStack does not even compute it then",
}


# one torch thread for the whole suite: tests/conftest.py


# ----------------------------------------------------------------------------------------------
# data and model factories
# ----------------------------------------------------------------------------------------------
def data_info(has_timestamps: bool = True, n_items: int = N_ITEMS, seed: int = 0) -> DataInfo:
    counts = np.random.default_rng(seed).integers(1, 20, n_items + 1).astype(np.int64)
    counts[0] = 0
    return DataInfo(n_items=n_items, train_counts=counts, has_timestamps=has_timestamps)


def batches(seed: int = 0) -> tuple[dict, dict]:
    """A training batch ``seq``/``time`` (B, L + 1) and a scoring batch ``item_seq``/``time`` (B, L).

    Row lengths (of the L + 1 window) are L + 1, L, 5, 2, 1: full rows and left padding; every
    scoring row holds at least one item. Timestamps strictly increase along a row, 0 on padding.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([MAX_LEN + 1, MAX_LEN, 5, 2, 1])  # (B,)
    seq = torch.randint(1, N_ITEMS + 1, (BATCH, MAX_LEN + 1), generator=g)  # (B, L + 1)
    valid = torch.arange(MAX_LEN + 1)[None] >= (MAX_LEN + 1 - lengths[:, None])  # (B, L + 1)
    time = (1_600_000_000 + torch.randint(1, 10**6, seq.shape, generator=g).cumsum(1)) * valid
    seq = seq * valid
    return {"seq": seq, "time": time}, {"item_seq": seq[:, 1:], "time": time[:, 1:]}


def _calibrate(model, train: dict) -> None:
    """What the trainer does before the first step (a no-op for standard layers)."""
    rng = torch.get_rng_state()
    model.calibrate(train)
    torch.set_rng_state(rng)


def training_sequences(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a statistical model counts (``fit_statistics``): 20 users' training items, 3 to 12 each, as flat
    (nnz,) int64 ids with (U,) int64 start and end bounds; the seed changes the items."""
    rng = np.random.default_rng(100 + seed)
    lengths = rng.integers(3, 13, 20)
    end = np.cumsum(lengths)
    return rng.integers(1, N_ITEMS + 1, int(end[-1])).astype(np.int64), end - lengths, end


def is_trainable(model) -> bool:
    """False for a statistical model (``pop``, ``markov``): it counts (``fit_statistics``) instead of training,
    so the checks of a training step (loss, gradients, overfitting, trimming) do not apply to it."""
    return getattr(model, "trainable", True)


class Factory:
    """``factory(seed=0, **overrides)`` -> a tiny, calibrated model of one backbone x layer; a statistical model
    is counted instead, on ``training_sequences(seed)`` with training counts drawn from ``seed``."""

    def __init__(self, model_cls: type, layer: str, has_timestamps: bool = True, **overrides) -> None:
        self.model_cls, self.layer, self.has_timestamps = model_cls, layer, has_timestamps
        self.overrides = {**TINY, **overrides}

    def __call__(self, seed: int = 0, **overrides):
        torch.manual_seed(seed)
        cfg = self.model_cls.Config(**{**self.overrides, **overrides})
        if not getattr(self.model_cls, "trainable", True):
            model = self.model_cls(cfg, LAYER_CONFIGS[self.layer](), data_info(self.has_timestamps, seed=seed))
            model.fit_statistics(*training_sequences(seed))
            return model
        model = self.model_cls(cfg, LAYER_CONFIGS[self.layer](), data_info(self.has_timestamps))
        _calibrate(model, batches()[0])
        return model


def unavailable(model_cls: type, layer: str) -> str | None:
    """The ConfigError text when ``layer`` has no variant for this backbone yet, else None."""
    try:
        Factory(model_cls, layer)()
    except ConfigError as e:
        if "not available" in str(e):
            return str(e)
    except Exception:  # any other failure surfaces in the tests themselves, not at collection
        pass
    return None


def contract_params(registry=MODELS) -> list:
    """pytest params (name, layer) over the registry x LAYER_CONFIGS, with automatic strict xfail."""
    params = []
    for name in registry.names():
        for layer in sorted(LAYER_CONFIGS):
            reason = unavailable(registry.get(name), layer)
            marks = (pytest.mark.xfail(strict=True, raises=ConfigError, reason=f"no variant yet: {reason}")
                     if reason else ())
            params.append(pytest.param(name, layer, marks=marks, id=f"{name}-{layer}"))
    return params


# ----------------------------------------------------------------------------------------------
# the contract checks (plain functions, reused on the toy backbone)
# ----------------------------------------------------------------------------------------------
def check_shapes(factory: Callable) -> None:
    """encode (B, L, D) float; score_items (B, N + 1) float32 with column 0 -inf; scalar finite loss."""
    train, score = batches()
    model = factory().eval()
    with torch.no_grad():
        h = model.encode(score["item_seq"], score["time"])
        s = model.score_items(score)
    assert s.shape == (BATCH, N_ITEMS + 1) and s.dtype == torch.float32
    assert torch.isneginf(s[:, 0]).all(), "column 0 (padding) must be -inf"
    assert torch.isfinite(s[:, 1:]).all(), "every item column must be finite"
    if not is_trainable(model):  # no hidden states, no loss: (B, L, 0) and nothing to train
        assert h.shape == (BATCH, MAX_LEN, 0)
        return
    assert h.shape == (BATCH, MAX_LEN, model.cfg.d_model) and h.is_floating_point()
    assert torch.isfinite(h).all()
    loss = model.train().training_loss(train)
    assert loss.dim() == 0 and torch.isfinite(loss)


def check_no_nan_on_padding(factory: Callable) -> None:
    """An all-padding row gives finite states and scores, and a finite loss and gradients."""
    train, score = batches()
    score = {k: torch.cat([torch.zeros_like(v[:1]), v[-1:]]) for k, v in score.items()}  # (2, L)
    model = factory().eval()
    with torch.no_grad():
        assert torch.isfinite(model.encode(score["item_seq"], score["time"])).all()
        s = model.score_items(score)
    assert torch.isfinite(s[:, 1:]).all() and torch.isneginf(s[:, 0]).all()
    if not is_trainable(model):
        return
    train = {k: torch.cat([torch.zeros_like(v[:1]), v]) for k, v in train.items()}  # (B + 1, L + 1)
    model.train()
    loss = model.training_loss(train)
    loss.backward()
    assert torch.isfinite(loss)
    for n, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), n


def check_causality(factory: Callable) -> None:
    """Causal: perturbing items/times after t changes nothing of ``encode`` at <= t (eval mode).

    Bidirectional (``causal = False``): the same perturbation must change something at <= t, so a
    backbone cannot silently lose its bidirectional mask either.
    """
    _, score = batches()
    model = factory().eval()
    g = torch.Generator().manual_seed(1)
    for t in (1, MAX_LEN // 2, MAX_LEN - 2):
        item_seq, time = score["item_seq"].clone(), score["time"].clone()
        item_seq[:, t + 1:] = torch.randint(1, N_ITEMS + 1, item_seq[:, t + 1:].shape, generator=g)
        time[:, t + 1:] = time[:, t:t + 1] + torch.randint(1, 10**7, time[:, t + 1:].shape, generator=g)
        with torch.no_grad():
            h0 = model.encode(score["item_seq"], score["time"])[:, : t + 1]
            h1 = model.encode(item_seq, time)[:, : t + 1]
        if model.causal:
            torch.testing.assert_close(h1, h0, atol=ATOL, rtol=ATOL, msg=f"future leaks into position <= {t}")
        else:
            assert not torch.allclose(h1, h0, atol=ATOL), "bidirectional model ignores later positions"


def check_left_padding_invariance(factory: Callable) -> None:
    """Extra left padding (and any timestamp on it) changes no score (eval mode)."""
    _, score = batches()
    short = {k: v[:, 2:] for k, v in score.items()}  # (B, L - 2)
    padded = {"item_seq": torch.cat([torch.zeros_like(short["item_seq"][:, :2]), short["item_seq"]], 1),
              "time": torch.cat([torch.full_like(short["time"][:, :2], 123), short["time"]], 1)}  # (B, L)
    model = factory().eval()
    with torch.no_grad():
        torch.testing.assert_close(model.score_items(padded), model.score_items(short), atol=ATOL, rtol=ATOL)


def check_batch_independence(factory: Callable) -> None:
    """At eval, a sequence's scores do not depend on the other sequences of its batch."""
    _, score = batches()
    model = factory().eval()
    with torch.no_grad():
        full = model.score_items(score)
        for i in range(BATCH):
            one = model.score_items({k: v[i: i + 1] for k, v in score.items()})
            torch.testing.assert_close(one, full[i: i + 1], atol=ATOL, rtol=ATOL)


def check_trim_invariance(factory: Callable) -> None:
    """The training loss is the same on a batch whose common left padding is trimmed (as the trainer
    does, ``bftrec.data.batches.trim_left``), with the same RNG state and no dropout."""
    train, _ = batches()
    if not is_trainable(factory()):
        pytest.skip("a statistical model has no training loss to trim")
    train = {k: v[2:] for k, v in train.items()}  # rows of length 5, 2, 1 -> 4 all-padding columns
    trimmed = {k: v[:, 4:] for k, v in train.items()}
    assert trimmed["seq"][:, 0].ne(0).any() and train["seq"][:, :4].eq(0).all()
    losses = []
    for b in (train, trimmed):
        model = factory(dropout=0.0, attn_dropout=0.0).train()
        torch.manual_seed(5)
        losses.append(model.training_loss(b))
    torch.testing.assert_close(losses[1], losses[0], atol=ATOL, rtol=ATOL)


def check_gradients(factory: Callable) -> None:
    """One training step's gradient reaches every parameter tensor, finite.

    Per tensor, not per element: rows that one batch does not use (item rows of absent items,
    position rows beyond the longest sequence, the padding row) legitimately get zero gradient.
    The only tensors allowed no gradient at all are those of ``NO_GRAD_OK`` (with reasons).
    """
    import re

    train, _ = batches()
    model = factory().train()
    if not is_trainable(model):
        assert not list(model.parameters()), "a statistical model has buffers, not parameters"
        return
    model.training_loss(train).backward()
    last = len(model.stack.blocks) - 1 if hasattr(model, "stack") else -1
    exempt = [re.compile(pat.replace("{last}", str(last))) for pat in NO_GRAD_OK]
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None or any(e.fullmatch(n) for e in exempt), f"no gradient reaches {n}"
            assert p.grad is None or torch.isfinite(p.grad).all(), f"non-finite gradient in {n}"


def check_determinism(factory: Callable) -> None:
    """Same seed -> same initial weights, same training loss (dropout, masks, negatives) and scores."""
    train, score = batches()
    out = []
    for _ in range(2):
        model = factory(seed=3).train()
        torch.manual_seed(11)
        loss = model.training_loss(train) if is_trainable(model) else torch.zeros(())
        with torch.no_grad():
            out.append((loss.detach(), model.eval().score_items(score)))
    assert torch.equal(out[0][0], out[1][0])
    assert torch.equal(out[0][1], out[1][1])


def check_overfit(factory: Callable, steps: int = 100) -> None:
    """Adam on one fixed batch: the loss of the last 10 steps is < 50% of the first step's."""
    train, _ = batches()
    model = factory(dropout=0.0, attn_dropout=0.0).train()
    if not is_trainable(model):
        pytest.skip("a statistical model is counted, not optimised")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    losses = []
    for _ in range(steps):
        loss = model.training_loss(train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = sum(losses[-10:]) / 10
    assert final < 0.5 * losses[0], f"loss {losses[0]:.3f} -> {final:.3f}: cannot overfit one batch"


def check_state_dict_round_trip(factory: Callable) -> None:
    """save -> a model built with another seed -> load -> identical scores (buffers included)."""
    train, score = batches()
    model = factory(seed=0).train()
    if is_trainable(model):  # a statistical model's buffers are its counts (seed 0's sequences)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.training_loss(train).backward()  # also moves any running buffers (BFT s0²)
        opt.step()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    other = factory(seed=1).eval()
    model.eval()
    with torch.no_grad():
        assert not torch.equal(other.score_items(score), model.score_items(score)), "seeds give equal models"
        buf.seek(0)
        other.load_state_dict(torch.load(buf, weights_only=True))
        assert torch.equal(other.score_items(score), model.score_items(score))


def _every_position(stack_forward, *args, last_only: bool = False, **kwargs):
    """A stack's forward with the scoring shortcut switched off: every position is computed."""
    return stack_forward(*args, **kwargs)


def check_scoring_shortcut(factory: Callable) -> None:
    """``score_items`` in eval mode (the last block computes the last position only,
    ``Stack(last_only=True)``) equals scoring from the whole (B, L, D) encoding, to float32 rounding; in
    training mode it is that same computation, dropout draws included."""
    _, score = batches()
    out = {}
    with torch.no_grad():
        for name in ("fast", "full"):
            model = factory(seed=0)  # one model each: a BFT stack updates its running prior in training mode
            if not hasattr(model, "stack"):
                return  # a backbone without a Stack has no shortcut: nothing to compare
            if name == "full":
                model.stack.forward = functools.partial(_every_position, model.stack.forward)
            out[name, "eval"] = model.eval().score_items(score)
            torch.manual_seed(7)
            out[name, "train"] = model.train().score_items(score)
            out[name, "rng"] = torch.rand(3)  # what dropout left of the RNG stream
    torch.testing.assert_close(out["fast", "eval"], out["full", "eval"], atol=ATOL, rtol=ATOL)
    assert torch.equal(out["fast", "train"], out["full", "train"])
    assert torch.equal(out["fast", "rng"], out["full", "rng"])


CHECKS = [check_shapes, check_no_nan_on_padding, check_causality, check_left_padding_invariance,
          check_batch_independence, check_trim_invariance, check_gradients, check_determinism, check_overfit,
          check_state_dict_round_trip, check_scoring_shortcut]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name,layer", contract_params())
def test_contract(name: str, layer: str, check: Callable) -> None:
    check(Factory(MODELS.get(name), layer))


# ----------------------------------------------------------------------------------------------
# config contract over the registry
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS.names())
def test_config_has_common_fields_and_yaml(name: str) -> None:
    """Common fields (shared overrides), a class-level ``causal``, and ``configs/model/<name>.yaml``
    with keys exactly the dataclass fields and ``name`` equal to the registry name."""
    cls = MODELS.get(name)
    names = [f.name for f in fields(cls.Config)]
    assert set(COMMON_FIELDS) <= set(names), f"missing common fields {set(COMMON_FIELDS) - set(names)}"
    assert isinstance(cls.causal, bool)
    yaml = OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml")
    assert list(yaml.keys()) == names
    assert yaml.name == name == cls.Config().name


def _smoke_params() -> list:
    smoke = OmegaConf.load(CONFIG_DIR / "debug" / "smoke.yaml")
    n_items = smoke.dataset.synthetic.n_items
    params = []
    for name in MODELS.names():
        cfg = MODELS.get(name).Config()
        blocked = (cfg.loss == "sampled_softmax" and "n_negatives" not in smoke.model
                   and cfg.n_negatives >= n_items)
        marks = (pytest.mark.xfail(strict=True, raises=ConfigError,
                                   reason=f"debug/smoke.yaml must set model.n_negatives < {n_items} "
                                          f"(default {cfg.n_negatives} for {name})") if blocked else ())
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _smoke_params())
def test_smoke_overrides_build(name: str) -> None:
    """``debug=smoke``'s model overrides build every backbone on the smoke data size."""
    smoke = OmegaConf.load(CONFIG_DIR / "debug" / "smoke.yaml")
    node = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "model" / f"{name}.yaml"), smoke.model)
    cfg = merge_schema(MODELS.get(name).Config, node, "model")
    model = MODELS.get(name)(cfg, LAYER_CONFIGS["standard"](), data_info(n_items=smoke.dataset.synthetic.n_items))
    assert model.cfg.d_model == smoke.model.d_model


# ----------------------------------------------------------------------------------------------
# the toy backbone: the three-file recipe of docs/ADD_A_BACKBONE.md
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def toy_cls(monkeypatch):
    """Register the toy through the real path (its ``@MODELS.register``), scoped to one test.

    ``MODELS._items`` is swapped for a copy and the module is executed fresh under a private name
    (this stands in for the import line in ``bftrec/models/__init__.py``); both are restored after
    the test, so the registry-parametrised tests in other files never see "toy".
    """
    monkeypatch.setattr(MODELS, "_items", dict(MODELS._items))
    spec = importlib.util.spec_from_file_location("bftrec_tests_toy_backbone", TOY_FILE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return MODELS.get("toy")


def test_layer_library_imports_no_backbone() -> None:
    """bftrec/layers is backbone-agnostic: no module there imports bftrec.models (imports run models -> layers),
    so a backbone with a BFT twin touches only its own files, its import line and its yaml."""
    import ast

    for path in sorted((ROOT / "bftrec" / "layers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "bftrec.models" or n.startswith("bftrec.models.") for n in names), (path.name, names)


@pytest.mark.parametrize("layer", sorted(LAYER_CONFIGS))
def test_toy_passes_contract(toy_cls, layer: str, request) -> None:
    """Every contract check passes on the toy; a missing layer variant is the same strict xfail."""
    reason = unavailable(toy_cls, layer)
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, raises=ConfigError, reason=f"no variant: {reason}"))
    for check in CHECKS:
        check(Factory(toy_cls, layer))


def test_toy_is_picked_up_by_the_parametrisation(toy_cls) -> None:
    """Registered before collection, the toy would be in every contract test: no test edit needed."""
    ids = [p.id for p in contract_params()]
    assert {f"toy-{layer}" for layer in LAYER_CONFIGS} <= set(ids)
    assert {f"{name}-standard" for name in MODELS.names()} <= set(ids)


def test_toy_composes_through_hydra(toy_cls) -> None:
    """``model=toy`` composes with the real ``train.yaml`` and ``debug=smoke`` through an extra search
    path (``tests/configs``), merges into ``ToyConfig`` and builds; yaml keys equal the fields."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[
            "model=toy", "debug=smoke", f"hydra.searchpath=[file://{TOY_CONFIG_DIR}]"])
    assert list(cfg.model.keys()) == [f.name for f in fields(toy_cls.Config)]
    mc = merge_schema(MODELS.get(cfg.model.name).Config, cfg.model, "model")
    assert mc.max_len == cfg.model.max_len == 12  # the smoke override reached the toy
    model = MODELS.get(cfg.model.name)(mc, LAYER_CONFIGS[cfg.layer.name](),
                                       data_info(n_items=cfg.dataset.synthetic.n_items))
    s = model.eval().score_items({"item_seq": torch.tensor([[0, 3, 4]])})
    assert s.shape == (1, cfg.dataset.synthetic.n_items + 1)


# ----------------------------------------------------------------------------------------------
# backbone-specific checks (BERT4Rec cloze, HSTU options)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key,value", [("mask_prob", 0.0), ("mask_prob", 1.0), ("last_item_mask_share", 1.5),
                                       ("max_len", 1), ("head", "mlp"), ("positions", "left")])
def test_bert4rec_config_errors(key: str, value) -> None:
    with pytest.raises(ConfigError, match=key) as e:
        Factory(MODELS.get("bert4rec"), "standard")(**{key: value})
    assert "\n" not in str(e.value)


def test_bert4rec_cloze_masks() -> None:
    train, _ = batches()
    seq = train["seq"][:, 1:]  # (B, L)
    model = Factory(MODELS.get("bert4rec"), "standard")(last_item_mask_share=0.0)
    mask_id = N_ITEMS + 1
    for seed in range(20):
        torch.manual_seed(seed)
        inputs, targets = model.cloze(seq)
        masked = inputs.eq(mask_id)
        assert (masked.sum(1) >= 1).all(), "every non-empty sequence masks at least one item"
        assert not (masked & seq.eq(0)).any(), "padding is never masked"
        assert torch.equal(targets, seq * masked) and torch.equal(inputs[~masked], seq[~masked])
    model.cfg.last_item_mask_share = 1.0
    inputs, targets = model.cloze(seq)
    last_only = torch.zeros_like(seq, dtype=torch.bool)
    last_only[:, -1] = True
    assert torch.equal(inputs.eq(mask_id), last_only)
    # the share is per sequence: roughly last_item_mask_share of the rows mask only the last item
    model.cfg.last_item_mask_share, model.cfg.mask_prob = 0.3, 0.5
    torch.manual_seed(0)
    big = train["seq"][:1, 1:].repeat(2000, 1)  # (2000, L) full rows
    masked = model.cloze(big)[0].eq(mask_id)  # (2000, L)
    only_last = masked.sum(1).eq(1) & masked[:, -1]
    assert 0.2 < only_last.float().mean() < 0.4
    # per-item Bernoulli(mask_prob) on the other rows (Klenitskiy & Vasilev 2023; FeiSun's mean)
    model.cfg.last_item_mask_share = 0.0
    share = model.cloze(big)[0].eq(mask_id).float().mean()
    assert 0.48 < share < 0.52


@pytest.mark.parametrize("head", ["mlm", "tied"])
def test_bert4rec_cloze_loss_and_head(head: str) -> None:
    """The loss is the mean full-softmax CE over the batch's masked positions (both references),
    with logits ``head(h) . E_j + b_j`` (mlm) or ``h . E_j`` (tied: no transform, no bias)."""
    model = Factory(MODELS.get("bert4rec"), "standard")(head=head).eval()  # eval: no dropout
    train, score = batches()
    torch.manual_seed(3)
    loss = model.training_loss(train)
    torch.manual_seed(3)
    inputs, targets = model.cloze(train["seq"][:, 1:])  # the same masks
    h = model.encode(inputs)  # (B, L, D)
    table = model.item_emb.weight[1: N_ITEMS + 1]  # (N, D) items 1..N: no padding, no [MASK] class
    if head == "mlm":
        h = model.head(h)
        logits = h @ table.t() + model.out_bias[1: N_ITEMS + 1]  # (B, L, N)
    else:
        assert model.out_bias is None and not any(n.startswith("head.") for n, _ in model.named_parameters())
        logits = h @ table.t()
    keep = targets.ne(0)
    torch.testing.assert_close(loss, F.cross_entropy(logits[keep], targets[keep] - 1))
    # scoring reads the same head at the appended [MASK]
    x = model.scoring_input(score["item_seq"])
    hs = model.encode(x)[:, -1]  # (B, D)
    ref = model.head(hs) @ table.t() + (model.out_bias[1: N_ITEMS + 1] if head == "mlm" else 0)
    torch.testing.assert_close(model.score_items(score)[:, 1:], ref)


def test_bert4rec_scores_at_appended_mask() -> None:
    model = Factory(MODELS.get("bert4rec"), "standard")().eval()
    _, score = batches()
    x = model.scoring_input(score["item_seq"])  # (B, max_len)
    assert x.shape == (BATCH, MAX_LEN) and x[:, -1].eq(N_ITEMS + 1).all()
    assert torch.equal(x[:, :-1], score["item_seq"][:, 1:])  # the most recent max_len - 1 items
    assert model.score_items(score).shape == (BATCH, N_ITEMS + 1)  # [MASK] is never a candidate


def test_bert4rec_mechanism_is_aligned_to_history() -> None:
    """The scoring forward's (B, L) statistics come back on the history columns they describe."""
    model = Factory(MODELS.get("bert4rec"), "standard")().eval()
    _, score = batches()

    def fake_encode(x, timestamps=None, mech=None):  # the stack would fill mech like this
        mech["lam0"] = x.float()  # (B, L_in): the token id as the "statistic"
        mech["layers"] = [{"K": x.float(), "Q": torch.ones(model.cfg.d_model)}]
        return torch.zeros(*x.shape, model.cfg.d_model)

    model.encode = fake_encode
    out = model.mechanism(score)
    seen = score["item_seq"].float()
    seen[:, 0] = 0  # the oldest column of a full window is dropped for the [MASK]
    assert torch.equal(out["lam0"], seen) and torch.equal(out["layers"][0]["K"], seen)
    assert out["layers"][0]["Q"].shape == (model.cfg.d_model,)
    # the scoring position is the appended [MASK] (id N + 1), not the last history column
    mask_id = torch.full((BATCH,), float(N_ITEMS + 1))
    assert torch.equal(out["at_score"]["lam0"], mask_id) and torch.equal(out["at_score"]["K"], mask_id[None])


def test_hstu_time_bias_needs_timestamps() -> None:
    with pytest.raises(ConfigError, match="model.time_bias=false") as e:
        Factory(MODELS.get("hstu"), "standard", has_timestamps=False)()
    assert "\n" not in str(e.value)
    model = Factory(MODELS.get("hstu"), "standard", has_timestamps=False)(time_bias=False)
    assert model.eval().score_items({"item_seq": batches()[1]["item_seq"]}).shape == (BATCH, N_ITEMS + 1)


def test_hstu_config_errors() -> None:
    for over in ({"loss": "bce"}, {"attn_norm": "softmax"}, {"temperature": 0.0}, {"positions": "start"}):
        with pytest.raises(ConfigError, match=f"model.{next(iter(over))}") as e:
            Factory(MODELS.get("hstu"), "standard")(**over)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("over", [{"attn_norm": "valid"}, {"time_bias": False}, {"loss": "ce"},
                                  {"positions": "from_start"}],
                         ids=["valid_norm", "position_only", "ce", "from_start"])
def test_hstu_options_keep_the_contract(over: dict) -> None:
    factory = Factory(MODELS.get("hstu"), "standard", **over)
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_left_padding_invariance,
                  check_gradients):
        check(factory)


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_hstu_from_start_keeps_the_scoring_shortcut(layer: str) -> None:
    check_scoring_shortcut(Factory(MODELS.get("hstu"), layer, positions="from_start"))


# position ids each ``model.positions`` rule gives a left-padded (2, 5) batch ([[0, 0, x, x, x], [x, x, x, x, x]])
POSITION_RULES = (("from_end", [[0, 0, 2, 3, 4], [0, 1, 2, 3, 4]]),
                  ("from_start", [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]))


def test_hstu_positions_build_what_they_say() -> None:
    """from_end: the last column is max_len - 1; from_start: each row's first item is 0, as the reference
    (positions counted from the oldest item of its window)."""
    seq = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])  # (2, 5), left-padded
    for positions, want in POSITION_RULES:
        m = Factory(MODELS.get("hstu"), "standard", positions=positions, max_len=5)().eval()
        with torch.no_grad():
            got = m.embed(seq) - m.item_embedding(seq)  # (2, 5, D): the position part, 0 on padding
            ref = m.pos_emb(torch.tensor(want)) * seq.ne(0).unsqueeze(-1)
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=ATOL)
    end = Factory(MODELS.get("hstu"), "standard", max_len=5)().eval()
    start = Factory(MODELS.get("hstu"), "standard", max_len=5, positions="from_start")().eval()
    start.load_state_dict(end.state_dict())  # same weights: only the position rule differs
    _, score = batches()
    short = {"item_seq": torch.tensor([[0, 0, 3, 4, 5]]), "time": score["time"][:1, -5:]}
    full = {"item_seq": torch.tensor([[1, 2, 3, 4, 5]]), "time": score["time"][:1, -5:]}
    with torch.no_grad():
        assert not torch.allclose(start.score_items(short)[:, 1:], end.score_items(short)[:, 1:])
        torch.testing.assert_close(start.score_items(full)[:, 1:], end.score_items(full)[:, 1:], atol=ATOL, rtol=ATOL)


def test_hstu_relative_bias_rows_match_the_full_table() -> None:
    """RelativeBias(Tq) computes the last Tq query rows of the full (T, T) bias (the scoring shortcut's path),
    and the full table is pos_w[t - j] + time_w[bucket(τ_t - τ_j)] for each query t and key j."""
    from bftrec.models.hstu import RelativeBias, time_buckets

    torch.manual_seed(0)
    rab = RelativeBias(max_len=12, n_time_buckets=16, init_std=0.02)
    time = batches()[1]["time"]  # (B, L) int64
    bucket = time_buckets(time[:, :, None] - time[:, None, :], 16)  # (B, L, L)
    full = rab(time.shape[1], bucket, time.device)  # (B, 1, L, L)
    for Tq in (1, 3):
        torch.testing.assert_close(rab(time.shape[1], bucket, time.device, Tq), full[..., -Tq:, :], atol=0, rtol=0)
    L = time.shape[1]
    for t, j in ((L - 1, 0), (L - 1, L - 2), (3, 1)):
        want = rab.pos_w[t - j] + rab.time_w[time_buckets(time[:, t] - time[:, j], 16)]  # (B,)
        torch.testing.assert_close(full[:, 0, t, j], want, atol=0, rtol=0)


def test_hstu_time_bias_is_used() -> None:
    """Changing a past timestamp changes the scores (the time bias is wired through the stack)."""
    model = Factory(MODELS.get("hstu"), "standard")().eval()
    _, score = batches()
    moved = dict(score, time=score["time"].clone())
    moved["time"][0, 0] -= 10**8  # ~3 years earlier: other bucket
    with torch.no_grad():
        assert not torch.allclose(model.score_items(moved)[0, 1:], model.score_items(score)[0, 1:])
        assert math.isfinite(float(model.score_items(moved)[0, 1:].sum()))


SASREC_CONVENTIONS = {"post_ln": {"block": "post_ln"}, "no_emb_scale": {"emb_scale": False},
                      "from_start": {"positions": "from_start"},
                      "recbole": {"block": "post_ln", "emb_scale": False, "positions": "from_start"}}


@pytest.mark.parametrize("layer", ["standard", "bft"])
@pytest.mark.parametrize("name", SASREC_CONVENTIONS)
def test_sasrec_conventions_keep_the_contract(name: str, layer: str) -> None:
    factory = Factory(MODELS.get("sasrec"), layer, **SASREC_CONVENTIONS[name])
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_left_padding_invariance,
                  check_gradients, check_scoring_shortcut):
        check(factory)


def test_sasrec_conventions_build_what_they_say() -> None:
    from bftrec.models.bert4rec import BERT4RecBlock
    from bftrec.models.sasrec import SASRecBlock

    default = Factory(MODELS.get("sasrec"), "standard")().eval()
    post = Factory(MODELS.get("sasrec"), "standard", block="post_ln")().eval()
    assert all(type(b) is SASRecBlock for b in default.stack.blocks) and hasattr(default, "final_ln")
    assert not hasattr(default, "emb_ln")  # the default's parameters are unchanged by the switches
    assert all(type(b) is BERT4RecBlock for b in post.stack.blocks) and not hasattr(post, "final_ln")
    # positions: from_end puts the last item at max_len - 1; from_start puts each row's first item at 0
    seq = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])  # (2, 5), left-padded
    for positions, want in POSITION_RULES:
        m = Factory(MODELS.get("sasrec"), "standard", positions=positions, emb_scale=False, max_len=5)().eval()
        with torch.no_grad():
            got = m.embed(seq) - m.item_emb(seq)  # (2, 5, D): the position part, 0 on padding
            ref = m.pos_emb(torch.tensor(want)) * seq.ne(0).unsqueeze(-1)
        torch.testing.assert_close(got, ref, atol=ATOL, rtol=ATOL)
    scaled = Factory(MODELS.get("sasrec"), "standard")()
    assert torch.allclose(scaled.item_embedding(seq), scaled.item_emb(seq) * math.sqrt(scaled.cfg.d_model))


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_bert4rec_from_start_keeps_the_contract(layer: str) -> None:
    factory = Factory(MODELS.get("bert4rec"), layer, positions="from_start")
    for check in (check_shapes, check_no_nan_on_padding, check_left_padding_invariance, check_trim_invariance,
                  check_gradients, check_scoring_shortcut):
        check(factory)


def test_bert4rec_positions_build_what_they_say() -> None:
    """from_end: the last column is max_len - 1; from_start: each row's first token (item or [MASK]) is 0,
    whatever the left padding, as both references (Sun et al.'s and Klenitskiy & Vasilev's code)."""
    seq = torch.tensor([[0, 0, 3, 4, 9], [1, 2, 3, 4, 9]])  # (2, 5), left-padded; 9 stands for any token
    for positions, want in POSITION_RULES:
        m = Factory(MODELS.get("bert4rec"), "standard", positions=positions, max_len=5)().eval()
        with torch.no_grad():
            ref = m.emb_ln(m.item_emb(seq) + m.pos_emb(torch.tensor(want))) * seq.ne(0).unsqueeze(-1)
            torch.testing.assert_close(m.embed(seq), ref, atol=ATOL, rtol=ATOL)
    # the [MASK] of a short history is scored at position len(history) under from_start, not max_len - 1
    end = Factory(MODELS.get("bert4rec"), "standard", max_len=5)().eval()
    start = Factory(MODELS.get("bert4rec"), "standard", max_len=5, positions="from_start")().eval()
    start.load_state_dict(end.state_dict())  # same weights: only the position rule differs
    with torch.no_grad():
        short = {"item_seq": torch.tensor([[0, 0, 3, 4]])}
        full = {"item_seq": torch.tensor([[1, 2, 3, 4]])}
        assert not torch.allclose(start.score_items(short)[:, 1:], end.score_items(short)[:, 1:])
        # a full window numbers the same under both rules (scoring keeps max_len - 1 = 4 items + [MASK])
        torch.testing.assert_close(start.score_items(full)[:, 1:], end.score_items(full)[:, 1:], atol=ATOL, rtol=ATOL)


def test_sasrec_original_block_keeps_the_contract() -> None:
    factory = Factory(MODELS.get("sasrec"), "standard", block="original", emb_scale=False)
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_left_padding_invariance,
                  check_gradients, check_scoring_shortcut):
        check(factory)


def test_sasrec_original_block_computes_the_original() -> None:
    """``block=original``: q = LN1 h; h' = q + Attn(q, kv=h); f = LN2 h'; out = f + FFN_relu(f), against a
    reference written out with torch.nn.functional (eval mode, so no dropout), to 1e-6."""
    from bftrec.layers import build_masks
    from bftrec.models.sasrec import OriginalSASRecBlock, PointWiseFFN, SelfAttention

    torch.manual_seed(0)
    blk = OriginalSASRecBlock(16, 2, 16, dropout=0.3, attn_dropout=0.3).eval()
    items = torch.tensor([[0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])  # (2, 6), left-padded
    masks = build_masks(items, causal=True)
    h = torch.randn(2, 6, 16) * items.ne(0).unsqueeze(-1)
    with torch.no_grad():
        q = F.layer_norm(h, (16,), blk.ln1.weight, blk.ln1.bias)
        w, b = blk.attn.qkv.weight, blk.attn.qkv.bias
        Q, K, V = F.linear(q, w[:16], b[:16]), F.linear(h, w[16:32], b[16:32]), F.linear(h, w[32:], b[32:])
        Q, K, V = (t.view(2, 6, 2, 8).transpose(1, 2) for t in (Q, K, V))  # (B, H, L, d)
        logits = (Q @ K.transpose(-2, -1) / math.sqrt(8)).masked_fill(~masks.attn, float("-inf"))
        att = torch.nan_to_num(logits.softmax(-1)) @ V  # (B, H, L, d); a query with no key gives 0
        h1 = q + blk.attn.out(att.transpose(1, 2).reshape(2, 6, 16))
        f = F.layer_norm(h1, (16,), blk.ln2.weight, blk.ln2.bias)
        ref = f + blk.ffn.w2(F.relu(blk.ffn.w1(f)))
        torch.testing.assert_close(blk(h, masks), ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(blk(h, masks, last_only=True), ref[:, -1:], atol=1e-6, rtol=1e-6)
        attn = SelfAttention(16, 2, 0.0).eval()  # kv=x is the ordinary self-attention
        torch.testing.assert_close(attn(h, masks, kv=h), attn(h, masks), atol=1e-6, rtol=1e-6)
    assert isinstance(blk.ffn.act, torch.nn.ReLU) and blk.ffn.hidden_drop.p == 0.3
    blk.ffn.train()  # the hidden dropout acts in training: some hidden units are zeroed, so outputs move
    with torch.no_grad():
        assert not torch.allclose(blk.ffn(f), blk.ffn.eval()(f))
    with pytest.raises(ConfigError, match="PointWiseFFN act"):
        PointWiseFFN(16, 16, act="swish")
    default = Factory(MODELS.get("sasrec"), "standard")()
    assert all(isinstance(b.ffn.hidden_drop, torch.nn.Identity) for b in default.stack.blocks)  # default unchanged


def test_sasrec_no_key_padding_mask_attends_to_padding() -> None:
    """``model.key_padding_mask=false`` (RecTools' default, with ``block=original``): the contract holds
    except left-padding invariance, which it breaks by design (padded keys are attendable bias-only
    projections: more padding, more weight on them); against a reference that zeroes the padding and
    masks causally only, to 1e-6; and it is refused with any other block, in one line."""
    from bftrec.layers import build_masks
    from bftrec.models.sasrec import OriginalSASRecBlock

    factory = Factory(MODELS.get("sasrec"), "standard", block="original", emb_scale=False, key_padding_mask=False)
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_gradients, check_scoring_shortcut):
        check(factory)
    with pytest.raises(AssertionError):
        check_left_padding_invariance(factory)
    # the masks encode() builds: causal only, padding included; the default keeps the key padding mask
    model, default = factory().eval(), Factory(MODELS.get("sasrec"), "standard", block="original")().eval()
    items = torch.tensor([[0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])  # (2, 6), left-padded
    seen = {}
    for name, m in (("off", model), ("on", default)):
        m.stack.blocks[0].register_forward_pre_hook(lambda mod, args, name=name: seen.__setitem__(name, args[1]))
        with torch.no_grad():
            m.encode(items)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(seen["off"].attn[0, 0], causal) and torch.equal(seen["off"].attn[1, 0], causal)
    assert torch.equal(seen["on"].attn, build_masks(items, causal=True).attn)
    # one block against a reference: padding zeroed on entry, padded keys and values are the biases
    torch.manual_seed(0)
    blk = OriginalSASRecBlock(16, 2, 16, dropout=0.0, attn_dropout=0.0).eval()
    h = torch.randn(2, 6, 16)  # padding NOT zeroed on purpose: the block zeroes it
    masks = seen["off"]
    with torch.no_grad():
        h0 = h * items.ne(0).unsqueeze(-1)
        q = F.layer_norm(h0, (16,), blk.ln1.weight, blk.ln1.bias)
        w, b = blk.attn.qkv.weight, blk.attn.qkv.bias
        Q, K, V = F.linear(q, w[:16], b[:16]), F.linear(h0, w[16:32], b[16:32]), F.linear(h0, w[32:], b[32:])
        torch.testing.assert_close(K[0, :2], b[16:32].expand(2, 16))  # padded keys: the key bias alone
        Q, K, V = (t.view(2, 6, 2, 8).transpose(1, 2) for t in (Q, K, V))  # (B, H, L, d)
        logits = (Q @ K.transpose(-2, -1) / math.sqrt(8)).masked_fill(~causal, float("-inf"))
        h1 = q + blk.attn.out((logits.softmax(-1) @ V).transpose(1, 2).reshape(2, 6, 16))
        f = F.layer_norm(h1, (16,), blk.ln2.weight, blk.ln2.bias)
        ref = f + blk.ffn.w2(F.relu(blk.ffn.w1(f)))
        torch.testing.assert_close(blk(h, masks), ref, atol=1e-6, rtol=1e-6)
        # with the mask, the first row's last position ignores the padding; without, it does not
        assert not torch.allclose(blk(h, masks)[0, -1], blk(h, build_masks(items, causal=True))[0, -1])
    with pytest.raises(ConfigError, match="model.key_padding_mask=false needs model.block=original"):
        Factory(MODELS.get("sasrec"), "standard", key_padding_mask=False)()


def test_sasrec_original_block_has_no_bft_twin() -> None:
    with pytest.raises(ConfigError, match="model.block=original has no BFT twin.*use layer=standard"):
        Factory(MODELS.get("sasrec"), "bft", block="original")()


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_sasrec_xavier_init_keeps_the_contract(layer: str) -> None:
    factory = Factory(MODELS.get("sasrec"), layer, init="xavier_normal")
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_gradients):
        check(factory)


def test_sasrec_xavier_init_draws_each_matrix_at_its_glorot_scale() -> None:
    """``model.init=xavier_normal`` (RecTools): every matrix at std sqrt(2 / (fan_in + fan_out)), within 10%
    (the smallest, the position table, has MAX_LEN x 64 = 512 entries); padding row, biases and LayerNorm
    as ``normal`` leaves them; the BFT τ table keeps its own initialisation; the default stays N(0, init_std)."""
    n_items, D = 2000, 64
    info = data_info(n_items=n_items)
    cfg = dict(TINY, d_model=D, d_ff=128, init="xavier_normal")
    torch.manual_seed(0)
    model = MODELS.get("sasrec")(MODELS.get("sasrec").Config(**cfg), LAYER_CONFIGS["bft"](), info)
    ref = MODELS.get("sasrec")(MODELS.get("sasrec").Config(**dict(cfg, init="normal")), LAYER_CONFIGS["bft"](), info)
    for name, p in model.named_parameters():
        if p.dim() > 1 and not name.startswith("stack.tau"):
            w = p[1:] if name == "item_emb.weight" else p
            fan_out, fan_in = p.shape[0], p.shape[1]
            assert float(w.detach().std()) == pytest.approx(math.sqrt(2 / (fan_in + fan_out)), rel=0.1), name
    assert torch.count_nonzero(model.item_emb.weight[0]) == 0
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        if p.dim() == 1 or name.startswith("stack.tau"):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)
    default = Factory(MODELS.get("sasrec"), "standard")(d_model=D, d_ff=128)
    assert float(default.stack.blocks[0].ffn.w1.weight.detach().std()) == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize("layer", ["standard", "bft"])
def test_sasrec_item_dropout_keeps_the_contract(layer: str) -> None:
    factory = Factory(MODELS.get("sasrec"), layer, item_dropout=0.3)
    for check in (check_shapes, check_no_nan_on_padding, check_causality, check_gradients, check_scoring_shortcut):
        check(factory)


def test_sasrec_item_dropout_is_one_draw_shared_by_input_and_output() -> None:
    """``model.item_dropout`` (RecTools): in training, the loss is next_item_loss over the encoding of ONE
    dropout draw of the item table, the same draw as output table; other dropouts at 0, so the draw is the
    only use of the RNG and the reference replays it, to 1e-6. Eval scores ignore it."""
    from bftrec.models.base import next_item_loss

    train, score = batches()
    model = Factory(MODELS.get("sasrec"), "standard", dropout=0.0, attn_dropout=0.0, item_dropout=0.5)().train()
    torch.manual_seed(3)
    got = model.training_loss(train)
    torch.manual_seed(3)
    table = F.dropout(model.item_emb.weight, 0.5, True)  # (N + 1, D): the same draw
    seq = train["seq"]
    inputs, targets = seq[:, :-1], seq[:, 1:] * seq[:, :-1].ne(0)  # (B, L) each
    want = next_item_loss(model.encode(inputs, table=table), targets, table, "ce", 8, N_ITEMS)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    undropped = next_item_loss(model.encode(inputs), targets, model.item_emb.weight, "ce", 8, N_ITEMS)
    assert abs(float((got - undropped).detach())) > 1e-4  # the draw does act in training
    half = next_item_loss(model.encode(inputs, table=table), targets, model.item_emb.weight, "ce", 8, N_ITEMS)
    assert abs(float((got - half).detach())) > 1e-4  # and on the output side too, not only the input lookup
    off = Factory(MODELS.get("sasrec"), "standard", dropout=0.0, attn_dropout=0.0)()
    off.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model.eval().score_items(score), off.eval().score_items(score), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("key,value", [("block", "postln"), ("positions", "start"), ("init", "xavier"),
                                       ("item_dropout", 1.0), ("item_dropout", -0.1)])
def test_sasrec_convention_errors(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"model.{key}"):
        Factory(MODELS.get("sasrec"), "standard")(**{key: value})


@pytest.mark.parametrize("last_only", [False, True])
def test_self_attention_eval_path_matches_the_reference(last_only: bool) -> None:
    """Eval mode (torch's fused attention) equals the training path (masked_softmax, dropout 0) to 1e-6,
    with an all-padding row and left-padded rows (queries with no allowed key give 0, not NaN)."""
    from bftrec.layers import build_masks
    from bftrec.models.sasrec import SelfAttention

    torch.manual_seed(0)
    attn = SelfAttention(16, 2, attn_dropout=0.0)
    items = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])  # (3, 6)
    x = torch.randn(3, 6, 16)
    for causal in (True, False):
        masks = build_masks(items, causal=causal)
        with torch.no_grad():
            ref = attn.train()(x, masks, last_only)
            got = attn.eval()(x, masks, last_only)
        assert got.shape == (3, 1 if last_only else 6, 16) and torch.isfinite(got).all()
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)
