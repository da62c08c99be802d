"""Paper grids (configs/experiment/paper): every cell composes with its tuned config; cells are
skipped when finished, resumed when killed, refused when another config wrote them; ledger lines."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bftrec.config import CONFIG_DIR, ConfigError
from bftrec.experiment import run, typed_groups
from bftrec.grid import append_ledger, cell_lock, check_tuned, config_diff, prepare_cell, sweep_axes
from tests.test_train_e2e import smoke_cfg

GRIDS = {"main": 108, "cpu": 108, "main_units": 9}
# bft_h: the v1-units ablation (main_units: Sports only, inheriting main's settings)
LAYERS = {"main": ["bft", "standard"], "cpu": ["bft", "bft_h", "standard"], "main_units": ["bft_h"]}


def _grid_cli(tmp_path, *overrides: str, multirun: bool = True) -> subprocess.CompletedProcess:
    """``bftrec-train -m experiment=paper/cpu <overrides>`` into tmp_path, one job at a time (``multirun=False``:
    without -m, one cell)."""
    mode, jobs = (["-m"], ["hydra.launcher.n_jobs=1"]) if multirun else ([], [])
    return subprocess.run(
        [sys.executable, "-m", "bftrec.train", f"--config-dir={CONFIG_DIR}", *mode, "experiment=paper/cpu",
         *overrides, f"out_root={tmp_path}", f"cache_dir={tmp_path / 'cache'}", *jobs],
        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_every_cell_composes_with_its_tuned_config(grid):
    axes = sweep_axes(Path(CONFIG_DIR) / "experiment" / "paper" / f"{grid}.yaml")
    assert len(axes["dataset"]) * len(axes["model"]) * len(axes["layer"]) * len(axes["seed"]) == GRIDS[grid]
    assert sorted(axes["layer"]) == LAYERS[grid] and axes["seed"] == ["0", "1", "2"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for d in axes["dataset"]:
            for m in axes["model"]:
                per_layer = {}
                for layer in dict.fromkeys(["standard", *axes["layer"]]):  # standard: the comparison's base
                    cfg = compose("train", overrides=[f"experiment=paper/{grid}", f"dataset={d}", f"model={m}",
                                                      f"layer={layer}"])
                    g = typed_groups(cfg)  # every key known, every value well typed
                    check_tuned(g["root"].tuned_config, d, m, g["root"].require_tuned)
                    assert g["root"].skip_finished and g["root"].require_tuned
                    per_layer[layer] = OmegaConf.to_container(cfg, resolve=True)
                # standard and BFT differ only in the layer group: the comparison is like for like
                for layer in per_layer.keys() - {"standard"}:
                    diff = config_diff(per_layer["standard"], per_layer[layer])
                    assert "layer.name" in diff and all(k.startswith("layer.") for k in diff), diff


def test_ml_1m_ts_hstu_recipe_is_ml_1m_s_with_the_time_bias():
    """configs/tuned/ml-1m-ts_hstu.yaml repeats ml-1m_hstu.yaml (scripts read tuned files as plain yaml) but for
    time_bias; experiment=hstu_time_bias_ml1m composes with it at the reference's fixed 101 epochs."""
    import yaml

    tuned = Path(CONFIG_DIR) / "tuned"
    base, ts = (yaml.safe_load((tuned / f"{n}_hstu.yaml").read_text()) for n in ("ml-1m", "ml-1m-ts"))
    assert base["model"].pop("time_bias") is False and ts["model"].pop("time_bias") is True
    assert (base.pop("tuned_config"), ts.pop("tuned_config")) == ("ml-1m_hstu", "ml-1m-ts_hstu")
    assert base == ts
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=hstu_time_bias_ml1m", "dataset=ml-1m-ts",
                                          "model.time_bias=false"])
    g = typed_groups(cfg)
    check_tuned(g["root"].tuned_config, "ml-1m-ts", "hstu", g["root"].require_tuned)
    assert g["trainer"].min_epochs == g["trainer"].epochs == 101 and g["model"].time_bias is False


def test_hstu_positions_experiment_is_the_fixed_budget_recipe_with_from_start():
    """experiment=hstu_positions_ml1m changes only model.positions (and its tag) against the committed fixed-budget
    ML-1M runs' recipe: the tuned ml-1m_hstu config at the reference's 101 epochs."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=hstu_positions_ml1m", "dataset=ml-1m",
                                          "model.positions=from_start"])
        base = compose("train", overrides=["dataset=ml-1m", "model=hstu", "layer=standard", "trainer.min_epochs=101"])
    g = typed_groups(cfg)
    check_tuned(g["root"].tuned_config, "ml-1m", "hstu", g["root"].require_tuned)
    assert g["trainer"].min_epochs == g["trainer"].epochs == 101 and g["model"].positions == "from_start"
    assert g["root"].tag == "positions=from_start"
    diff = config_diff(OmegaConf.to_container(base["model"], resolve=True),
                       OmegaConf.to_container(cfg["model"], resolve=True))
    assert list(diff) == ["positions"], diff


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
    out = _grid_cli(tmp_path, "dataset=office,nosuchdata", "model=sasrec", "layer=standard", "seed=0")
    assert out.returncode != 0
    assert "dataset=nosuchdata: no such config; choose one of" in out.stderr and "ml-100k" in out.stderr
    assert not (tmp_path / "runs" / "office").exists()  # the valid cell never started


def test_grid_writes_ledger_through_hydra_multirun(tmp_path):
    out = _grid_cli(tmp_path, "debug=smoke", "dataset=synthetic", "model=sasrec", "layer=standard", "seed=0")
    assert out.returncode == 0, out.stderr[-2000:]
    cell = tmp_path / "runs" / "synthetic" / "sasrec" / "standard" / "seed0"
    assert json.loads((cell / "metrics.json").read_text())["tuned_config"] == "synthetic_sasrec"
    ledger = [json.loads(x) for x in (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()]
    assert [(x["cell"], x["status"]) for x in ledger] == [("synthetic/sasrec/standard/seed0", "ran")]
    assert "dataset=synthetic" in ledger[0]["overrides"] and ledger[0]["git_sha"] is not None


def test_a_grid_cell_run_without_multirun_writes_its_ledger_line(tmp_path):
    """``bftrec-train experiment=paper/cpu <one cell>`` (no -m) runs into the grid layout and appends the
    same ledger line a sweep would, so scripts/collect_cells.py can take the cell; a bad cell fails in one
    line and is logged as failed."""
    def one_cell(*extra: str) -> subprocess.CompletedProcess:
        return _grid_cli(tmp_path, "debug=smoke", "dataset=synthetic", "layer=standard", "seed=0", *extra,
                         multirun=False)

    out = one_cell("model=sasrec")
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "runs" / "synthetic" / "sasrec" / "standard" / "seed0" / "metrics.json").exists()
    bad = one_cell("model=bert4rec")  # no tuned file for synthetic bert4rec
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "was not applied" in bad.stderr, bad.stderr
    ledger = [json.loads(x) for x in (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines()]
    assert [(x["cell"], x["status"]) for x in ledger] == [("synthetic/sasrec/standard/seed0", "ran"),
                                                          ("synthetic/bert4rec/standard/seed0", "failed")]
    assert "dataset=synthetic" in ledger[0]["overrides"] and "was not applied" in ledger[1]["error"]


def test_failed_cell_does_not_stop_the_grid(tmp_path):
    """bert4rec has no tuned file for synthetic: that cell fails (ledger says why), sasrec still runs."""
    out = _grid_cli(tmp_path, "debug=smoke", "dataset=synthetic", "model=bert4rec,sasrec", "layer=standard",
                    "seed=0")
    assert out.returncode != 0  # the failure is reported at the end
    assert (tmp_path / "runs" / "synthetic" / "sasrec" / "standard" / "seed0" / "metrics.json").exists()
    ledger = {x["cell"]: x for x in map(json.loads, (tmp_path / "runs" / "ledger.jsonl").read_text().splitlines())}
    assert ledger["synthetic/sasrec/standard/seed0"]["status"] == "ran"
    failed = ledger["synthetic/bert4rec/standard/seed0"]
    assert failed["status"] == "failed" and "synthetic_bert4rec.yaml was not applied" in failed["error"]


def test_a_cell_held_by_a_live_job_is_refused(tmp_path):
    with cell_lock(tmp_path / "cell"):
        with pytest.raises(ConfigError, match="being run by another job"):
            with cell_lock(tmp_path / "cell"):
                pass
    with cell_lock(tmp_path / "cell"):  # released after the first job ends
        pass


def test_resumed_run_that_stopped_early_stays_stopped(tmp_path):
    cfg = smoke_cfg(tmp_path, "skip_finished=true", "trainer.epochs=40", "trainer.patience=1")
    cell = tmp_path / "cell"
    first = run(cfg, cell)
    assert first["stopped_early"]
    for name in ("metrics.json", "ranks.csv.gz", "env.json"):  # killed during the test pass
        (cell / name).unlink()
    again = run(cfg, cell)
    assert again["epochs_run"] == first["epochs_run"] and again["test"] == first["test"]


def test_torn_files_name_the_file_and_the_fix(tmp_path):
    cfg = smoke_cfg(tmp_path, "skip_finished=true")
    cell = tmp_path / "cell"
    run(cfg, cell)
    (cell / "metrics.json").write_text('{"dataset": ')
    with pytest.raises(ConfigError, match=r"metrics.json is unreadable .*delete it to rerun the cell"):
        run(cfg, cell)
    (cell / "metrics.json").unlink()
    (cell / "last.pt").write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(ConfigError, match=r"last.pt is unreadable .*delete it to restart"):
        run(cfg, cell)


def test_bad_grid_config_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="is not a readable grid config"):
        sweep_axes(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hydra:\n  sweeper:\n    params:\n      dataset: a\n      model: choice(a,\n"
                   "      layer: x\n      seed: 0\n")
    with pytest.raises(SystemExit, match=r"cannot parse the sweep model=choice\(a,"):
        sweep_axes(bad)
    assert sweep_axes(Path(CONFIG_DIR) / "experiment" / "paper" / "cpu.yaml")["seed"] == ["0", "1", "2"]


def test_key_added_since_a_run_counts_as_its_default():
    """A stored run that predates a key is the same config while the key holds its schema default."""
    from bftrec.config import TrainerConfig, schema_defaults
    from bftrec.grid import config_diff

    defaults = schema_defaults({"trainer": TrainerConfig})
    saved = {"trainer": {"lr": 0.001}}
    assert "trainer.train_windows" in defaults  # a key that old runs lack
    same = {"trainer": {"lr": 0.001, "train_windows": defaults["trainer.train_windows"]}}
    other = {"trainer": {"lr": 0.001, "train_windows": "sliding"}}
    assert config_diff(saved, same, defaults) == []
    assert config_diff(saved, other, defaults) == ["trainer.train_windows"]
    assert config_diff(saved, same) == ["trainer.train_windows"]  # without defaults: absent differs
