"""End to end through the real configs and the real entry point (run(), bftrec-train, bftrec-eval)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from bftrec.config import CONFIG_DIR, ConfigError
from bftrec.evaluate import rescore
from bftrec.experiment import run

REPO = Path(__file__).resolve().parent.parent


def smoke_cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["debug=smoke", *overrides])
    with open_dict(cfg):
        cfg.cache_dir = str(tmp_path / "cache")
    return cfg


def test_smoke_run_writes_all_outputs(tmp_path):
    m = run(smoke_cfg(tmp_path), tmp_path / "run")
    out = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for key in ("dataset", "model", "layer", "seed", "protocol", "best_epoch", "valid", "test"):
        assert key in out, key
    for key in ("split", "candidates", "exclude_history", "ties"):
        assert key in out["protocol"], key
    test = out["test"]
    assert {"HR@10", "NDCG@10"} <= set(test["overall"])
    assert len(test["by_item_freq"]) == 5
    for b in test["by_item_freq"]:
        assert {"bin", "lo", "hi", "n_items", "n_users", "HR@10", "NDCG@10"} <= set(b)
    assert {"cold_users", "warm_users"} <= set(test)
    for name in ("ranks.csv.gz", "history.csv", "checkpoint.pt", "env.json", "config.yaml"):
        assert (tmp_path / "run" / name).exists(), name
    assert m["test"]["overall"]["HR@10"] == out["test"]["overall"]["HR@10"]
    hist = pd.read_csv(tmp_path / "run" / "history.csv")  # wall and CPU seconds of each part of each epoch
    for col in ("train_seconds", "train_cpu_seconds", "eval_seconds", "eval_cpu_seconds"):
        assert (hist[col] > 0).all() and np.isfinite(hist[col]).all(), col


def test_same_seed_gives_identical_metrics(tmp_path):
    run(smoke_cfg(tmp_path, "trainer.deterministic=true"), tmp_path / "a")
    run(smoke_cfg(tmp_path, "trainer.deterministic=true"), tmp_path / "b")
    assert (tmp_path / "a" / "metrics.json").read_text() == (tmp_path / "b" / "metrics.json").read_text()


def test_sasrec_learns_the_synthetic_default(tmp_path):
    """The embedded dataset has a learnable transition structure: a short run beats popularity."""
    m = run(smoke_cfg(tmp_path, "trainer.epochs=15", "model.d_model=32", "dataset.synthetic.n_users=600"),
            tmp_path / "run")
    n_items = m["data"]["items"]
    assert m["test"]["overall"]["HR@10"] > 3 * 10 / n_items


def test_rescore_writes_new_folder_and_keeps_the_run(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    before = (tmp_path / "run" / "metrics.json").read_text()
    m = rescore(tmp_path / "run", ["eval.n_bins=3", "eval.ks=[1,10]"], tmp_path / "re")
    assert len(m["test"]["by_item_freq"]) == 3 and "HR@1" in m["test"]["overall"]
    assert (tmp_path / "run" / "metrics.json").read_text() == before
    first = json.loads(before)
    assert m["test"]["overall"]["HR@10"] == first["test"]["overall"]["HR@10"]
    assert m["source_run_finished"] is True


def test_rescoring_an_unfinished_run_says_so(tmp_path, caplog):
    """issue 47: a killed run (checkpoint.pt, no metrics.json) is re-scored with a warning, and the output says so."""
    import logging

    run(smoke_cfg(tmp_path), tmp_path / "run")
    (tmp_path / "run" / "metrics.json").unlink()  # as a run killed after its best epoch was saved
    with caplog.at_level(logging.WARNING, logger="bftrec"):
        m = rescore(tmp_path / "run", [], tmp_path / "re")
    assert "is an unfinished run" in caplog.text and m["source_run_finished"] is False
    assert json.loads((tmp_path / "re" / "metrics.json").read_text())["source_run_finished"] is False


@pytest.mark.parametrize("override, message", [
    ("trainer.epochz=3", "epochz"),
    ("model.max_len=0", "max_len"),
    ("seed=-1", r"seed=-1 must be an integer in \[0, 4294967295\]"),
    ("eval.n_bins=1000", r"eval.n_bins=1000 exceeds the \d+ distinct training counts .* use eval.n_bins<="),  # issue 50
    ("eval.ks=[10,75]", r"K=75, but \d+ valid users have fewer than 75 candidates .* use K<="),  # issue 50
    ("eval.ks=[10,5000]", "K=5000"),
    ("eval.repeat_target=drop", "repeat_target"),
    ("trainer.select_metric=NDCG@50", "select_metric"),
    ("model.n_heads=0", "n_heads"),
    ("trainer.device=gpu", "trainer.device"),
    ("eval.batch_size=0", "eval.batch_size"),
    ("trainer.max_steps_per_epoch=-1", "max_steps_per_epoch"),
    ("eval.cold_user_max_history=-1", "cold_user_max_history"),
    ("trainer.betas=[0.9,1.5]", r"trainer.betas=\[0.9, 1.5\] must be two numbers in \[0, 1\)"),
    ("trainer.betas=[0.9]", r"trainer.betas=\[0.9\] must be two numbers"),
    ("trainer.min_epochs=2", r"trainer.min_epochs=2 must be in \[0, trainer.epochs=1\]"),
    ("trainer.min_epochs=-1", r"trainer.min_epochs=-1 must be in"),
])
def test_bad_settings_fail_with_one_line(tmp_path, override, message):
    with pytest.raises((ConfigError, ValueError, Exception), match=message):
        run(smoke_cfg(tmp_path, override), tmp_path / "run")


@pytest.mark.parametrize("epochs, eval_every, min_epochs, last_epoch, stopped", [
    (6, 1, 0, 2, True),    # patience 1 stops right after the first evaluation without a better score
    (6, 1, 4, 4, True),    # held back until min_epochs
    (6, 1, 6, 6, False),   # min_epochs = epochs: a fixed budget, which is no early stop
    (8, 2, 5, 6, True),    # held back past epoch 4; epoch 5 is not evaluated, so the stop waits for 6
])
def test_min_epochs_holds_early_stopping_back(tmp_path, epochs, eval_every, min_epochs, last_epoch, stopped):
    """lr 1e-12 never improves validation after the first evaluation: patience 1 stops at the next
    evaluation, not before ``trainer.min_epochs``, only on an evaluated epoch, and never on the last one."""
    cfg = smoke_cfg(tmp_path, f"trainer.epochs={epochs}", f"trainer.eval_every={eval_every}", "trainer.patience=1",
                    "trainer.lr=1e-12", f"trainer.min_epochs={min_epochs}")
    m = run(cfg, tmp_path / "run")
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert history["epoch"].tolist() == list(range(1, last_epoch + 1))
    assert history["valid_NDCG@10"].notna().tolist()[-1]  # the last epoch run was evaluated
    out = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert out["best_epoch"] == eval_every == m["best_epoch"] and out["stopped_early"] is stopped


def test_yaml_typo_is_caught(tmp_path):
    cfg = smoke_cfg(tmp_path)
    with open_dict(cfg):
        cfg.model.n_layer = 3  # typo of n_layers
    with pytest.raises(ConfigError, match="n_layer"):
        run(cfg, tmp_path / "run")


def _cli(*args, tmp_path):
    env = {**os.environ, "BFTREC_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "bftrec.train", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["dataset=nosuch"], "nosuch"),
    (["debug=smoke", "model.max_len=0"], "max_len"),
])
def test_cli_errors_are_one_line(tmp_path, args, message):
    r = _cli(*args, tmp_path=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_smoke_run(tmp_path):
    r = _cli("debug=smoke", f"out_root={tmp_path}/runs", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    found = list((tmp_path / "runs").glob("synthetic/sasrec/standard/seed0_*/metrics.json"))
    assert len(found) == 1


@pytest.mark.parametrize("over", [(), ("trainer.train_windows=prefixes", "dataset.synthetic.n_users=40",
                                        "trainer.batch_size=64")])
def test_bft_run_records_gain_and_replay_matches(tmp_path, over):
    """BFT.md §0: initial and final mean K per layer are logged; the replay reproduces them exactly, also
    when the run's own windows (prefixes, fewer users than a batch) make a first batch unlike ``last``'s."""
    from bftrec.evaluate import replay_gain

    m = run(smoke_cfg(tmp_path, "layer=bft", *over), tmp_path / "run")
    recorded = m["mechanism"]["gain_first_batch"]
    assert len(recorded["initial_K_per_layer"]) == 1 and 0.0 < recorded["initial_K_per_layer"][0] <= 1.0
    replay = replay_gain(tmp_path / "run")
    assert replay["initial_K_per_layer"] == recorded["initial_K_per_layer"]
    assert replay["final_K_per_layer"] == recorded["final_K_per_layer"]
    assert {"per_layer", "by_item_freq", "cold_users", "warm_users"} <= set(m["mechanism"])


def test_rescore_takes_a_thread_count_and_gives_the_same_metrics(tmp_path):
    """trainer.num_threads changes how scoring runs, never what was trained: allowed, recorded, same test."""
    import torch

    m = run(smoke_cfg(tmp_path), tmp_path / "run")
    before = torch.get_num_threads()  # the suite runs on one thread (conftest): 2 shows the setting is applied
    try:
        re = rescore(tmp_path / "run", ["trainer.num_threads=2"], tmp_path / "re")
    finally:
        torch.set_num_threads(before)
    assert json.loads((tmp_path / "re" / "env.json").read_text())["threads"] == 2
    for key in ("HR@10", "NDCG@10"):
        assert re["test"]["overall"][key] == pytest.approx(m["test"]["overall"][key], abs=1e-9)


def test_rescore_refuses_a_negative_thread_count(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"trainer.num_threads=-1 must be >= 0"):
        rescore(tmp_path / "run", ["trainer.num_threads=-1"], tmp_path / "re")
    assert not (tmp_path / "re").exists()


def test_rescore_refuses_training_overrides(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    with pytest.raises(ConfigError, match="cannot override 'dataset.synthetic.seed'"):
        rescore(tmp_path / "run", ["dataset.synthetic.seed=3"], tmp_path / "re")


def test_resume_keeps_best_checkpoint_and_continues(tmp_path):
    first = run(smoke_cfg(tmp_path, "trainer.epochs=1"), tmp_path / "a")
    resumed = run(smoke_cfg(tmp_path, "trainer.epochs=2", f"trainer.resume={tmp_path / 'a'}"), tmp_path / "b")
    assert (tmp_path / "b" / "checkpoint.pt").exists()
    assert resumed["epochs_run"] == 2 and first["epochs_run"] == 1


def test_trainer_betas_reach_the_optimizer():
    """``trainer.betas`` (HSTU's reference uses (0.9, 0.98)) is what Adam/AdamW get; default torch's."""
    from torch import nn

    from bftrec.config import TrainerConfig
    from bftrec.trainer import _optimizer

    model = nn.Linear(3, 2)
    assert _optimizer(model, TrainerConfig()).defaults["betas"] == (0.9, 0.999)
    for opt in ("adam", "adamw"):
        got = _optimizer(model, TrainerConfig(optimizer=opt, betas=[0.9, 0.98])).defaults["betas"]
        assert got == (0.9, 0.98), opt
