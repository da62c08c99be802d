"""Runs written before ``layer.bft.units`` existed (BFT v1) load and re-score as ``bft.units=h``.

One function does it, ``bftrec.config.upgrade_legacy_layer`` (through ``load_run_config``), on every
loading path: ``bftrec.evaluate`` (re-score, gain replay), ``bftrec.grid.prepare_cell`` (skip/resume a
grid cell) and ``bftrec.train`` (``trainer.resume``). Checkpoints are never committed, so a committed
run of ``results/paper_cpu_v1`` is checked down to its model's state-dict keys, and a tiny synthetic v1
run, made legacy by removing ``units`` from its stored configs, is re-scored end to end.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from bftrec.config import ConfigError, load_run_config, merge_schema, upgrade_legacy_layer
from bftrec.evaluate import rescore
from bftrec.experiment import run
from bftrec.grid import prepare_cell
from bftrec.layers import LAYER_CONFIGS, StandardLayerConfig
from bftrec.layers.bft import BFTLayerConfig
from bftrec.models import MODELS
from tests.test_contract import data_info
from tests.test_train_e2e import smoke_cfg

PAPER = Path(__file__).resolve().parents[1] / "results" / "paper_cpu_v1" / "runs" / "instruments-2014"
EXTRAS = {"stack.tau.tau"} | {f"stack.blocks.{i}.{n}" for i in range(2) for n in ("theta_q", "s0sq", "s0sq_ready")}


def test_upgrade_applies_to_v1_only():
    v1 = {"name": "bft", "tau": {"scale": "embedding"}, "bft": {"precision": "learned"}}
    up = upgrade_legacy_layer(v1)
    assert up["bft"]["units"] == "h" and up["tau"]["scale"] == "embedding" and "units" not in v1["bft"]
    assert up["tau"]["lr_scale"] == 1.0  # a key added later gets what such a run did
    v2 = {"name": "bft", "tau": {"scale": "count", "lr_scale": 3.0}, "bft": {"units": "count"}}
    assert upgrade_legacy_layer(v2) == v2 and upgrade_legacy_layer({"name": "standard"}) == {"name": "standard"}
    early_v2 = {"name": "bft", "tau": {"scale": "count"}, "bft": {"units": "count"}}  # before tau.lr_scale
    assert upgrade_legacy_layer(early_v2) == {**early_v2, "tau": {"scale": "count", "lr_scale": 1.0}}
    assert upgrade_legacy_layer(OmegaConf.create(v1)) == up  # DictConfig in, plain dict out


@pytest.mark.parametrize("model", ["sasrec", "bert4rec", "hstu"])
def test_committed_v1_run_loads_as_units_h(model):
    """results/paper_cpu_v1 (committed, BFT v1): its config resolves to units=h and builds the v1 model's keys."""
    run_dir = PAPER / model / "bft" / "seed0"
    raw = OmegaConf.load(run_dir / "config.yaml")
    assert "units" not in raw.layer.bft and raw.layer.tau.scale == "embedding"
    with pytest.raises(ConfigError, match="layer.tau.scale=embedding belongs to layer.bft.units=h"):
        merge_schema(LAYER_CONFIGS["bft"], raw.layer, "layer")  # read as today's default, it is refused
    cfg = load_run_config(run_dir)
    layer = merge_schema(LAYER_CONFIGS[cfg.layer.name], cfg.layer, "layer")
    assert isinstance(layer, BFTLayerConfig) and layer.bft.units == "h" and layer.tau.scale == "embedding"
    stored = json.loads((run_dir / "metrics.json").read_text())["layer_config"]  # the third stored copy
    assert merge_schema(LAYER_CONFIGS["bft"], upgrade_legacy_layer(stored), "layer") == layer
    cls = MODELS.get(model)
    mcfg = merge_schema(cls.Config, cfg.model, "model")
    torch.manual_seed(0)
    info = data_info(n_items=300)  # more items than the run's sampled negatives
    bft_keys = set(cls(mcfg, layer, info).state_dict())
    std_keys = set(cls(mcfg, StandardLayerConfig(), info).state_dict())
    assert bft_keys - std_keys == EXTRAS and std_keys <= bft_keys


def _legacy(run_dir: Path) -> None:
    """Remove ``bft.units`` and ``tau.lr_scale`` from every stored copy of the layer config: the run now looks
    like BFT v1."""
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    del cfg["layer"]["bft"]["units"], cfg["layer"]["tau"]["lr_scale"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    ck = torch.load(run_dir / "checkpoint.pt", weights_only=False)
    del ck["config"]["layer"]["bft"]["units"], ck["config"]["layer"]["tau"]["lr_scale"]
    torch.save(ck, run_dir / "checkpoint.pt")
    m = json.loads((run_dir / "metrics.json").read_text())
    del m["layer_config"]["bft"]["units"], m["layer_config"]["tau"]["lr_scale"]
    (run_dir / "metrics.json").write_text(json.dumps(m))


def test_legacy_run_rescores_to_the_same_metrics(tmp_path):
    v1 = ("layer=bft", "layer.bft.units=h", "layer.tau.scale=embedding")
    first = run(smoke_cfg(tmp_path, *v1), tmp_path / "run")
    _legacy(tmp_path / "run")
    again = rescore(tmp_path / "run", [], tmp_path / "re")
    for key, value in first["test"]["overall"].items():
        assert again["test"]["overall"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert OmegaConf.load(tmp_path / "re" / "config.yaml").layer.bft.units == "h"
    # grid: the legacy cell is the same config as an explicit units=h run (skipped), not as today's default
    resolved = OmegaConf.to_container(smoke_cfg(tmp_path, *v1), resolve=True)
    assert prepare_cell(tmp_path / "run", resolved, True)[0] == "skipped"
    with pytest.raises(ConfigError, match="layer.bft.units"):
        prepare_cell(tmp_path / "run", OmegaConf.to_container(smoke_cfg(tmp_path, "layer=bft"), resolve=True), True)
    # trainer.resume from it with today's default layer (units=count) is refused in one line
    with pytest.raises(ConfigError, match="trainer.resume=.*(layer settings|differs at layer)") as err:
        run(smoke_cfg(tmp_path, "layer=bft", "trainer.epochs=2", f"trainer.resume={tmp_path / 'run'}"), tmp_path / "b")
    assert "\n" not in str(err.value)
