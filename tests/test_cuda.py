"""The CUDA path: every backbone x layer scores the same on the GPU as on the CPU (within tolerance),
trains there with finite gradients, a run trained on the GPU rescores to the same metrics on the CPU, and a
GPU run resumes on the GPU.

Skipped where torch sees no CUDA device (CI, the 2-core development machine); run on a GPU machine with
``pytest -m gpu``. Tolerances, not bit equality: CPU and GPU kernels sum in different orders.
"""
import copy

import pytest
import torch

from bftrec.evaluate import rescore
from bftrec.experiment import run
from bftrec.models import MODELS
from tests.test_contract import Factory, batches, contract_params
from tests.test_train_e2e import smoke_cfg

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _cuda(batch: dict) -> dict:
    return {k: v.cuda() for k, v in batch.items()}


@pytest.mark.parametrize("name,layer", contract_params())
def test_scores_match_the_cpu(name, layer):
    """Same weights, same batch: score_items (B, N + 1) float32 on the GPU within 1e-4 of the CPU's."""
    cpu = Factory(MODELS.get(name), layer)().eval()
    gpu = copy.deepcopy(cpu).cuda()
    _, score = batches()
    with torch.no_grad():
        want = cpu.score_items(score)
        got = gpu.score_items(_cuda(score)).cpu()
    assert got.dtype == want.dtype == torch.float32
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), "the -inf columns (padding item) differ"
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,layer", contract_params())
def test_training_step_on_the_gpu(name, layer):
    """One loss + backward on the GPU: a finite loss near the CPU's scale and finite gradients everywhere."""
    model = Factory(MODELS.get(name), layer)().cuda().train()
    train, _ = batches()
    loss = model.training_loss(_cuda(train))
    loss.backward()
    assert loss.device.type == "cuda" and torch.isfinite(loss)
    for n, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), f"non-finite gradient in {n}"


@pytest.mark.parametrize("model,layer", [("sasrec", "bft"), ("bert4rec", "bft"), ("hstu", "bft"),
                                         ("sasrec", "standard")])
def test_gpu_run_rescores_the_same_on_the_cpu(tmp_path, model, layer):
    """A smoke run trained and scored on the GPU; its checkpoint rescored on the CPU gives the same test
    HR@10 / NDCG@10 (to one user's worth of a near-tie flip)."""
    m = run(smoke_cfg(tmp_path, f"model={model}", f"layer={layer}", "trainer.device=cuda",
                      "trainer.epochs=2"), tmp_path / "run")
    assert (tmp_path / "run" / "env.json").read_text().count('"device": "cuda') == 1
    re = rescore(tmp_path / "run", ["trainer.device=cpu"], tmp_path / "re")
    n_users = m["data"]["users"]
    for key in ("HR@10", "NDCG@10"):
        assert re["test"]["overall"][key] == pytest.approx(m["test"]["overall"][key], abs=1.0 / n_users + 1e-9)


def test_gpu_run_resumes_on_the_gpu(tmp_path):
    """trainer.resume on a CUDA run: the CPU RNG states in last.pt load back although map_location moved
    them to the GPU (the grid resumes a killed GPU cell this way)."""
    first = run(smoke_cfg(tmp_path, "trainer.device=cuda", "trainer.epochs=1"), tmp_path / "a")
    resumed = run(smoke_cfg(tmp_path, "trainer.device=cuda", "trainer.epochs=2",
                            f"trainer.resume={tmp_path / 'a'}"), tmp_path / "b")
    assert first["epochs_run"] == 1 and resumed["epochs_run"] == 2


@pytest.mark.parametrize("name", ["sasrec", "bert4rec", "hstu"])
def test_compiled_precision_matches_eager_on_the_gpu(name):
    """trainer.compile_precision on CUDA (Inductor's Triton kernels): loss and gradients of one training step
    equal the eager path's within float32 tolerance (the CPU test covers the same on Inductor's C++ kernels)."""
    base = Factory(MODELS.get(name), "bft")().cuda().train()
    train, _ = batches()
    out = {}
    for on in (False, True):
        model = copy.deepcopy(base)
        for m in model.modules():  # dropout off: the two paths then draw nothing
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        model.stack.compile_precision = on
        torch.manual_seed(0)  # the same sampled negatives, if the loss samples
        loss = model.training_loss(_cuda(train))
        loss.backward()
        out[on] = (loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-4, atol=1e-5)
    for n, g in out[False][1].items():
        torch.testing.assert_close(out[True][1][n], g, rtol=1e-3, atol=1e-5, msg=n)
