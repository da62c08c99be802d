"""Paper grids (configs/experiment/paper): every cell composes with its tuned config; cells are
skipped when finished, resumed when killed, refused when another config wrote them; ledger lines."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bftrec.config import ConfigError
from bftrec.grid import append_ledger, check_tuned, config_diff, prepare_cell
from bftrec.train import CONFIG_DIR, run, typed_groups
from tests.test_train_e2e import smoke_cfg

GRIDS = {"main": 108, "cpu": 72}


def _sweep(grid: str) -> dict:
    params = OmegaConf.load(Path(CONFIG_DIR) / "experiment" / "paper" / f"{grid}.yaml").hydra.sweeper.params
    return {k: str(v).split(",") for k, v in params.items()}


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_every_cell_composes_with_its_tuned_config(grid):
    axes = _sweep(grid)
    assert len(axes["dataset"]) * len(axes["model"]) * len(axes["layer"]) * len(axes["seed"]) == GRIDS[grid]
    assert sorted(axes["layer"]) == ["bft", "standard"] and axes["seed"] == ["0", "1", "2"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for d in axes["dataset"]:
            for m in axes["model"]:
                per_layer = {}
                for layer in axes["layer"]:
                    cfg = compose("train", overrides=[f"experiment=paper/{grid}", f"dataset={d}", f"model={m}",
                                                      f"layer={layer}"])
                    g = typed_groups(cfg)  # every key known, every value well typed
                    check_tuned(g["root"].tuned_config, d, m, g["root"].require_tuned)
                    assert g["root"].skip_finished and g["root"].require_tuned
                    per_layer[layer] = OmegaConf.to_container(cfg, resolve=True)
                # standard and BFT differ only in the layer group: the comparison is like for like
                diff = config_diff(per_layer["standard"], per_layer["bft"])
                assert "layer.name" in diff and all(k.startswith("layer.") for k in diff), diff


def test_missing_tuned_config_is_refused():
    check_tuned("office_sasrec", "office", "sasrec", True)
    check_tuned("", "office", "sasrec", False)  # outside grids a tuned file is optional
    with pytest.raises(ConfigError, match="configs/tuned/office_hstu.yaml was not applied"):
        check_tuned("", "office", "hstu", True)


def test_finished_cell_is_skipped_and_killed_cell_resumed(tmp_path):
    cfg = smoke_cfg(tmp_path, "skip_finished=true", "trainer.epochs=2")
    cell = tmp_path / "cell"
    first = run(cfg, cell)
    report: dict = {}
    again = run(cfg, cell, report)
    assert report["status"] == "skipped" and again["test"] == first["test"]
    (cell / "metrics.json").unlink()  # as if killed after its last epoch was saved
    report = {}
    resumed = run(cfg, cell, report)
    assert report["status"] == "resumed"
    assert resumed["test"]["overall"] == first["test"]["overall"]  # last.pt holds the full training


def test_other_config_in_cell_is_refused_and_kept(tmp_path):
    cell = tmp_path / "cell"
    run(smoke_cfg(tmp_path, "skip_finished=true"), cell)
    before = (cell / "metrics.json").read_bytes()
    with pytest.raises(ConfigError, match="differs at trainer.lr"):
        run(smoke_cfg(tmp_path, "skip_finished=true", "trainer.lr=0.01"), cell)
    with pytest.raises(ConfigError, match="already holds a run"):
        run(smoke_cfg(tmp_path), cell)  # skip_finished=false never overwrites either
    assert (cell / "metrics.json").read_bytes() == before


def test_volatile_keys_do_not_count_as_another_config():
    a = {"trainer": {"num_threads": 1, "device": "cpu", "lr": 0.001}, "data_root": "/x", "seed": 0}
    b = {"trainer": {"num_threads": 8, "device": "cuda", "lr": 0.001}, "data_root": "/y", "seed": 0}
    assert config_diff(a, b) == []
    assert config_diff(a, {**b, "seed": 1}) == ["seed"]


def test_prepare_cell_on_empty_dir(tmp_path):
    assert prepare_cell(tmp_path / "new", {}, skip_finished=True) == ("ran", None)


def test_ledger_appends_one_json_line_per_cell(tmp_path):
    path = tmp_path / "sweep" / "ledger.jsonl"
    append_ledger(path, {"cell": "a/b/c/seed0", "status": "ran"})
    append_ledger(path, {"cell": "a/b/c/seed1", "status": "skipped"})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["status"] for x in lines] == ["ran", "skipped"] and all("host" in x for x in lines)


def test_unknown_grid_name_fails_before_any_run(tmp_path):
    """Hydra composes every cell of the sweep before launching: a bad name lists the valid ones."""
    out = subprocess.run(
        [sys.executable, "-m", "bftrec.train", f"--config-dir={CONFIG_DIR}", "-m", "experiment=paper/cpu",
         "dataset=office,nosuchdata", "model=sasrec", "layer=standard", "seed=0", f"out_root={tmp_path}",
         "hydra.launcher.n_jobs=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "Could not find 'dataset/nosuchdata'" in out.stderr and "ml-100k" in out.stderr
    assert not (tmp_path / "runs" / "office").exists()  # the valid cell never started


def test_grid_writes_ledger_through_hydra_multirun(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "bftrec.train", f"--config-dir={CONFIG_DIR}", "-m", "experiment=paper/cpu",
         "debug=smoke", "dataset=synthetic", "model=sasrec", "layer=standard", "seed=0",
         f"out_root={tmp_path}", f"cache_dir={tmp_path / 'cache'}", "hydra.launcher.n_jobs=1"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cell = tmp_path / "runs" / "synthetic" / "sasrec" / "standard" / "seed0"
    assert (cell / "metrics.json").exists()
    ledger = [json.loads(x) for x in (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()]
    assert [(x["cell"], x["status"]) for x in ledger] == [("synthetic/sasrec/standard/seed0", "ran")]
    assert "dataset=synthetic" in ledger[0]["overrides"] and ledger[0]["git_sha"] is not None
