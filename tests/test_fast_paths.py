"""The opt-in fast paths of the trainer (issue 49 item 2 and 3), each against its reference: the last-position
encoder under prefixes, the mask dropout and the fused optimizer; a path the model or device cannot honour is
refused in one line; metrics.json records which paths ran."""
import json

import numpy as np
import pytest
import torch
from torch import nn

from bftrec.config import ConfigError, EvalConfig, TrainerConfig
from bftrec.experiment import run
from bftrec.layers import LAYER_CONFIGS
from bftrec.models import MODELS, DataInfo
from bftrec.trainer import MaskDropout, check_fast_paths, check_trainer_config, use_mask_dropout
from tests.test_train_e2e import smoke_cfg

N, L = 40, 8
TINY = dict(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=L, dropout=0.0, attn_dropout=0.0, loss="ce")


def _model(name: str, layer: str = "standard"):
    torch.manual_seed(0)
    cls = MODELS.get(name)
    counts = np.arange(N + 1, dtype=np.int64)
    info = DataInfo(n_items=N, train_counts=counts, has_timestamps=True)
    return cls(cls.Config(**TINY), LAYER_CONFIGS[layer](), info)


def _prefix_batch() -> dict:
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(1, N + 1, (6, L + 1), generator=g)
    seq[3, :4] = 0  # left padding
    seq[5, :7] = 0
    time = (1_600_000_000 + torch.arange(L + 1).expand(6, -1) * 3600) * seq.ne(0)
    return {"seq": seq, "time": time, "last_target_only": True}


@pytest.mark.parametrize("name", ["sasrec", "hstu"])
def test_last_position_only_gives_the_full_forwards_loss_and_gradients(name):
    """Without dropout the last-position encoder is the same function of the weights: loss and every gradient
    equal the full forward's to float32 rounding. With dropout the kept positions draw other masks (documented)."""
    out = {}
    for fast in (False, True):
        model = _model(name).train()
        loss = model.training_loss({**_prefix_batch(), "last_position_only": fast})
        loss.backward()
        out[fast] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    assert out[True][1].keys() == out[False][1].keys()
    for n in out[False][1]:
        torch.testing.assert_close(out[True][1][n], out[False][1][n], atol=1e-5, rtol=1e-4, msg=n)


def test_a_fast_path_the_model_or_settings_cannot_honour_is_refused():
    cfg = TrainerConfig(train_windows="prefixes", last_position_only=True)
    check_fast_paths(cfg, _model("sasrec"), torch.device("cpu"))  # the standard stack has the path
    for name, layer in (("sasrec", "bft"), ("gru4rec", "standard")):
        with pytest.raises(ConfigError, match="trainer.last_position_only=true: .*computes every position"):
            check_fast_paths(cfg, _model(name, layer), torch.device("cpu"))
    with pytest.raises(ConfigError, match="last_position_only=true needs trainer.train_windows=prefixes"):
        check_trainer_config(TrainerConfig(last_position_only=True), EvalConfig())
    with pytest.raises(ConfigError, match="trainer.dropout"):
        check_trainer_config(TrainerConfig(dropout="fast"), EvalConfig())


def test_compile_precision_is_refused_without_a_bft_stack_or_the_compiler_inductor_calls(monkeypatch):
    cfg = TrainerConfig(compile_precision=True)
    with pytest.raises(ConfigError, match="trainer.compile_precision=true: SASRec with Stack has no precision chain"):
        check_fast_paths(cfg, _model("sasrec"), torch.device("cpu"))
    check_fast_paths(cfg, _model("sasrec", "bft"), torch.device("cpu"))  # a BFT stack, g++ here (CI installs it)
    monkeypatch.setenv("CXX", "/nonexistent/g++")  # Inductor calls $CXX when set, whatever else is installed
    with pytest.raises(ConfigError, match="the C.. compiler /nonexistent/g.. .*is not found; install it or set"):
        check_fast_paths(cfg, _model("sasrec", "bft"), torch.device("cpu"))


def _spy(forward, calls: list):
    """``forward`` that records, per call, whether the compiled precision path is active."""
    from bftrec.layers.precision.compile import _ON

    def wrapped(*args, **kwargs):
        calls.append(_ON.get())
        return forward(*args, **kwargs)
    return wrapped


@pytest.mark.parametrize("backend, names", [("aot_eager", ("sasrec", "bert4rec", "hstu")), ("inductor", ("sasrec",))])
def test_compiled_precision_gives_the_eager_loss_and_gradients(monkeypatch, backend, names, layer="bft"):
    """trainer.compile_precision: the same formulas through torch.compile; the loss and every gradient (which
    carry λ, K and J through both blocks) equal the eager path's to float32 rounding, in training (dropout off:
    the draws are the same either way). Every backbone's precision functions are traced (``aot_eager``: the
    graphs and their backward partition, no C++ build); SASRec, the benchmarked case, also runs Inductor's
    fused kernels (a C++ build, ~20 s on a cold cache)."""
    from bftrec.layers.precision import compile as pc
    from bftrec.layers.precision import compiling
    from bftrec.layers.precision.compile import _ON
    from bftrec.trainer import inductor_compiler_missing

    if backend == "inductor" and inductor_compiler_missing(torch.device("cpu")):
        pytest.skip(inductor_compiler_missing(torch.device("cpu")))  # Inductor's C++ build needs it
    graphs: list = []

    def counting(gm, example_inputs):  # the named backend, counting the graphs it is handed
        graphs.append(gm)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    monkeypatch.setattr(pc, "BACKEND", counting)  # a new backend: every function compiles afresh
    batch = {k: v for k, v in _prefix_batch().items() if k != "last_target_only"}
    for name in names:
        out = {}
        for on in (False, True):
            model = _model(name, layer).train()
            model.stack.compile_precision = on
            calls = []
            with pytest.MonkeyPatch.context() as mp:  # record whether the compiled path was active in the blocks
                mp.setattr(model.stack.blocks[0], "forward", _spy(model.stack.blocks[0].forward, calls))
                loss = model.training_loss(dict(batch))
            loss.backward()
            out[on] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            assert calls == [on], (name, calls)
        torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5, msg=name)
        assert out[True][1].keys() == out[False][1].keys()
        for n in out[False][1]:
            torch.testing.assert_close(out[True][1][n], out[False][1][n], atol=1e-5, rtol=1e-4, msg=f"{name} {n}")
    # SASRec alone compiles five: kriging bias, REML shrinkage, output precision, Kalman and predicted precision
    assert len(graphs) >= 5, len(graphs)
    assert not _ON.get()  # the block closed: eager again outside the stack
    with compiling():
        assert _ON.get()


def test_mask_dropout_keeps_the_rate_and_the_expectation():
    torch.manual_seed(0)
    d = MaskDropout(0.3).train()
    y = d(torch.ones(1_000_000))
    kept = y.ne(0)
    assert abs(kept.float().mean().item() - 0.7) < 0.003  # 6.5 binomial SDs: never fails by chance
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.7))  # the kept scaled by 1 / (1 - p)
    assert torch.equal(d.eval()(torch.ones(5)), torch.ones(5)) and torch.equal(MaskDropout(0.0).train()(y), y)
    model = _model("sasrec")
    keys = set(model.state_dict())
    n = sum(type(m) is nn.Dropout for m in model.modules())
    assert use_mask_dropout(model) == n > 0 and not any(type(m) is nn.Dropout for m in model.modules())
    assert set(model.state_dict()) == keys  # checkpoints load either way


def test_fused_optimizer_takes_the_same_steps_or_is_refused():
    cfg = TrainerConfig(fused_optimizer=True)
    try:
        check_fast_paths(cfg, _model("sasrec"), torch.device("cpu"))
    except ConfigError as e:
        assert "trainer.fused_optimizer=true: torch" in str(e) and "drop the flag" in str(e)
        return
    params = {}
    for fused in (False, True):
        model = _model("sasrec").train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, fused=fused)
        for _ in range(5):
            opt.zero_grad()
            model.training_loss(_prefix_batch()).backward()
            opt.step()
        params[fused] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(params[False], params[True]):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-3)  # Adam amplifies rounding near 0 grads


def test_metrics_json_records_the_fast_paths(tmp_path):
    run(smoke_cfg(tmp_path, "trainer.dropout=mask", "trainer.train_windows=prefixes",
                  "trainer.last_position_only=true"), tmp_path / "run")
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["fast_paths"] == {"fused_optimizer": False, "dropout": "mask", "last_position_only": True,
                               "compile_precision": False}


def test_mask_dropout_keeps_the_rate_in_bfloat16():
    torch.manual_seed(0)
    y = MaskDropout(0.1).train()(torch.ones(2_000_000, dtype=torch.bfloat16))
    assert abs(y.ne(0).float().mean().item() - 0.9) < 0.0015  # 7 SDs; bf16 uniform draws gave 0.898
