"""Run lifecycle and console (issue 9: items 2, 3, 5, 6, 7, 10, 13), end to end through ``run``."""
import json
import logging
import shutil

import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from bftrec import experiment as experiment_mod
from bftrec import rundir
from bftrec.config import CONFIG_DIR, ConfigError
from bftrec.evaluate import rescore
from bftrec.experiment import run
from bftrec.grid import cell_lock
from bftrec.models.sasrec import SASRec
from bftrec.summary import _fmt_frame
from tests.test_train_e2e import smoke_cfg


def cli_cfg(tmp_path, *overrides):
    """A config composed as the command line composes it: Hydra's record of the overrides included."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.cache_dir = str(tmp_path / "cache")
    return cfg


def messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


# --- 2. the result at a glance -------------------------------------------------------------------

def _md_rows(text: str) -> dict:
    return {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}


def _cell(rows: dict, row: str, column: str) -> float:
    """The number in a Markdown table row under ``column`` (of the header row ``rows``' first key)."""
    header = [c.strip() for c in next(iter(rows.values())).split("|")]
    return float(rows[row].split("|")[header.index(column)])


def test_bft_run_ends_with_a_strata_and_mechanism_table(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="bftrec"):
        m = run(smoke_cfg(tmp_path, "layer=bft"), tmp_path / "run")
    table = (tmp_path / "run" / "summary.md").read_text()
    by_target, _, by_token = table.partition("BFT mechanism by history token")
    rows, tok = _md_rows(by_target), _md_rows(by_token)
    assert {"overall", "Q0", "Q1", "Q2", "Q3", "Q4", "cold users", "warm users"} <= set(rows) and by_token
    # a target-stratum row carries the mechanism at the target only, never the by-token K (issue 46 item 4)
    assert "K at target" in rows["stratum"] and "λ⁰ at target" in rows["stratum"]
    q0, at, mech = m["test"]["by_item_freq"][0], m["mechanism"]["at_target"], m["mechanism"]
    assert f"{q0['lo']}–{q0['hi']}" in rows["Q0"]
    assert _cell(rows, "Q0", "K at target") == pytest.approx(at["by_target_freq"][0]["K"], abs=5e-5)
    assert at["by_target_freq"][0]["n_users"] == q0["n_users"]
    assert at["overall"]["n_users"] == m["test"]["overall"]["n_users"]
    assert _cell(tok, "Q0", "K") == pytest.approx(mech["by_item_freq"][0]["K"], abs=5e-5)
    assert f"{mech['by_item_freq'][0]['K']:.4f}" != f"{at['by_target_freq'][0]['K']:.4f}"  # two groupings
    assert set(mech["groupings"]) == {"by_item_freq", "at_target"}
    assert _cell(rows, "overall", "HR@10") == pytest.approx(m["test"]["overall"]["HR@10"], abs=5e-5)
    assert table.strip() in messages(caplog)  # the same table ends the console output


def test_summary_column_keeps_one_number_format():
    df = _fmt_frame(pd.DataFrame({"HR@10": [0.0009766, 0.0112, None], "users": [12, 3, 4501],
                                  "K": [0.5, float("nan"), 0.70351]}))
    # the column with a value under 1e-3 gives every row 3 significant digits of it, in fixed point
    assert list(df["HR@10"]) == ["0.000977", "0.011200", "–"]
    assert list(df["users"]) == ["12", "3", "4501"] and list(df["K"]) == ["0.5000", "–", "0.7035"]
    tiny = _fmt_frame(pd.DataFrame({"λ⁰": [1e-8, 0.83, float("inf")]}))["λ⁰"]  # a collapsed precision
    assert list(tiny) == ["1.00e-08", "8.30e-01", "inf"]


def test_standard_run_summary_has_no_mechanism_columns(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    table = (tmp_path / "run" / "summary.md").read_text()
    assert "cold users" in table and "λ⁰" not in table


# --- 3. resume takes the run's own config --------------------------------------------------------

def test_resume_reads_dataset_model_layer_and_seed_from_the_run(tmp_path):
    run(smoke_cfg(tmp_path, "model.d_model=32", "layer=bft", "seed=3"), tmp_path / "a")
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "trainer.epochs=2")  # no dataset=, model.*, layer=
    m = run(cfg, tmp_path / "b")
    assert (m["layer"], m["seed"], m["epochs_run"]) == ("bft", 3, 2)
    assert m["data"]["users"] == 200  # the smoke dataset of the run, not the default synthetic one


def test_resume_applies_min_epochs_as_an_unbroken_run_would(tmp_path):
    """A 3-epoch fixed budget (min_epochs = epochs, patience 1, validation never improving after epoch 1),
    resumed to 6 epochs: min_epochs 5 trains epochs 4 and 5, then stops; min_epochs 0 stops at once."""
    run(smoke_cfg(tmp_path, "trainer.epochs=3", "trainer.min_epochs=3", "trainer.patience=1", "trainer.lr=1e-12"),
        tmp_path / "a")
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["stopped_early"] is False
    held = run(cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "trainer.epochs=6", "trainer.min_epochs=5"),
               tmp_path / "b")
    assert (held["epochs_run"], held["stopped_early"], held["best_epoch"]) == (5, True, 1)
    at_once = run(cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "trainer.epochs=6", "trainer.min_epochs=0"),
                  tmp_path / "c")
    assert (at_once["epochs_run"], at_once["stopped_early"]) == (3, True)
    assert pd.read_csv(tmp_path / "c" / "history.csv")["epoch"].tolist() == [1, 2, 3]  # its folder is complete
    assert pd.read_csv(tmp_path / "b" / "history.csv")["epoch"].tolist() == [1, 2, 3, 4, 5]


def test_resume_takes_the_runs_recipe_even_on_the_default_dataset_model_layer_and_seed(tmp_path):
    """A run of the defaults (synthetic, sasrec, standard, seed 0: what ``make run`` trains) with its own recipe:
    ``trainer.resume`` alone continues with that recipe, not the defaults; an override on top still counts, and one
    that restates the run's own value (``seed=0``) is harmless."""
    from bftrec.rundir import resume_config, task_overrides, without_hydra

    saved = cli_cfg(tmp_path, "trainer.lr=0.01", "trainer.epochs=2", f"out_root={tmp_path / 'first'}")
    (tmp_path / "a").mkdir()
    OmegaConf.save(without_hydra(saved), tmp_path / "a" / "config.yaml", resolve=True)  # as a run saves it
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "trainer.epochs=5", "seed=0")
    got = resume_config(without_hydra(cfg), task_overrides(cfg))  # as run() calls it
    assert (got.trainer.lr, got.trainer.epochs, got.dataset.name, got.trainer.resume) == \
        (0.01, 5, "synthetic", str(tmp_path / "a"))
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "seed=1")
    with pytest.raises(ConfigError, match="drop the override 'seed=1'"):
        resume_config(without_hydra(cfg), task_overrides(cfg))
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "+tau_variant=lr10")  # a group: not applicable
    with pytest.raises(ConfigError, match="group override '\\+tau_variant=lr10' cannot be applied.*; start a new"):
        resume_config(without_hydra(cfg), task_overrides(cfg))
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "~trainer.patience")  # would read None
    with pytest.raises(ConfigError, match="the deletion '~trainer.patience' cannot be applied.*trainer.patience="):
        resume_config(without_hydra(cfg), task_overrides(cfg))
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "trainer=default")  # would reset lr 0.01
    with pytest.raises(ConfigError, match="group override 'trainer=default' cannot be.*set the trainer.\\* keys"):
        resume_config(without_hydra(cfg), task_overrides(cfg))


def test_resume_refuses_an_override_that_changes_the_run(tmp_path):
    run(smoke_cfg(tmp_path, "model.d_model=32"), tmp_path / "a")
    cfg = cli_cfg(tmp_path, f"trainer.resume={tmp_path / 'a'}", "model.d_model=16")
    with pytest.raises(ConfigError, match="drop the override 'model.d_model=16'"):
        run(cfg, tmp_path / "b")
    assert not (tmp_path / "b" / "config.yaml").exists()


# --- 5. a failed run is marked; model checks come before the data --------------------------------

@pytest.mark.parametrize("override, message", [("model.n_heads=3", "divisible"), ("model.max_len=0", "max_len")])
def test_model_config_is_checked_before_data_and_files(tmp_path, monkeypatch, override, message):
    def no_data(*a, **k):
        raise AssertionError("the dataset was loaded before the model config was checked")

    monkeypatch.setattr(experiment_mod, "load_dataset", no_data)
    (tmp_path / "run").mkdir()  # as Hydra leaves it
    with pytest.raises(ConfigError, match=message):
        run(smoke_cfg(tmp_path, override), tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists()
    assert message in (tmp_path / "run" / "FAILED").read_text()


def test_refused_directory_of_a_finished_run_is_not_marked_failed(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "run")
    with pytest.raises(ConfigError, match="already holds a run"):
        run(smoke_cfg(tmp_path), tmp_path / "run")
    assert not (tmp_path / "run" / "FAILED").exists() and (tmp_path / "run" / "metrics.json").exists()


# --- 6. run directories are unique and locked ----------------------------------------------------

def test_default_run_dirs_of_one_second_differ(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "stamp", lambda: "20250101-000000")
    dirs = []
    for _ in range(2):  # Hydra resolves hydra.run.dir once per process
        cfg = cli_cfg(tmp_path, f"out_root={tmp_path}/runs")
        dirs.append(cfg.hydra.run.dir)
    assert dirs[0] != dirs[1] and dirs[1].endswith("seed0_20250101-000000_2")
    assert not any((tmp_path / "runs").rglob("*.json"))
    a = run(smoke_cfg(tmp_path, f"out_root={tmp_path}/runs2"))
    b = run(smoke_cfg(tmp_path, f"out_root={tmp_path}/runs2"))
    assert a["test"] == b["test"] and len(list((tmp_path / "runs2").rglob("metrics.json"))) == 2


def test_composing_a_grid_leaves_no_empty_run_folders(tmp_path):
    """OmegaConf resolves the default hydra.run.dir (which reserves a folder) while merging a grid
    config that overrides it; the unused reservation and the parents made for it go at exit, a
    folder holding a file stays."""
    import subprocess
    import sys

    code = (f"from bftrec import rundir as t\n"
            f"from hydra import compose, initialize_config_dir\n"
            f"with initialize_config_dir(config_dir={CONFIG_DIR!r}, version_base='1.3'):\n"
            f"    compose('train', overrides=['experiment=paper/cpu', 'dataset=office'])\n"
            f"    compose('train', overrides=['experiment=paper/cpu', 'dataset=lastfm'])\n"
            f"kept = t.fresh_dir(t.Path('own') / 'seed0_x')\n"
            f"(kept / 'train.log').write_text('a run wrote here')\n"
            f"assert t.Path('results').is_dir()  # reserved (under the default out_root) while the process lives\n")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    assert not (tmp_path / "results").exists()
    assert (tmp_path / "own" / "seed0_x" / "train.log").exists()


def test_a_directory_held_by_a_live_run_is_refused(tmp_path):
    with cell_lock(tmp_path / "run"):
        with pytest.raises(ConfigError, match="being written by another live run"):
            run(smoke_cfg(tmp_path), tmp_path / "run")
    assert not (tmp_path / "run" / "FAILED").exists() and not (tmp_path / "run" / "config.yaml").exists()


# --- 7. divergence -------------------------------------------------------------------------------

def test_diverged_run_stops_and_is_marked_failed(tmp_path):
    with pytest.raises(ValueError, match=r"diverged at epoch 1, step \d+.*trainer.lr"):
        run(smoke_cfg(tmp_path, "trainer.lr=1e3", "trainer.epochs=3"), tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert "diverged" in (tmp_path / "run" / "FAILED").read_text()


def test_divergence_later_keeps_the_last_good_epoch(tmp_path, monkeypatch):
    calls = {"n": 0}
    original = SASRec.training_loss

    def blows_up_in_epoch_2(self, batch):
        calls["n"] += 1
        loss = original(self, batch)
        return loss * 1e4 if calls["n"] > 4 else loss  # 200 users / 64 per batch = 4 steps per epoch

    monkeypatch.setattr(SASRec, "training_loss", blows_up_in_epoch_2)
    with pytest.raises(ValueError, match=r"diverged at epoch 2, step 0.*last.pt \(epoch 1\)"):
        run(smoke_cfg(tmp_path, "trainer.epochs=3"), tmp_path / "run")
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=False)["state"]["epoch"] == 1
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["epoch"] == 1


def test_non_finite_gradient_norm_stops_with_epoch_and_step(tmp_path, monkeypatch):
    original = SASRec.training_loss

    def infinite_grad(self, batch):  # finite loss, NaN gradient: d sqrt(x)/dx at x = 0
        return original(self, batch) + (self.item_emb.weight[0, 0] * 0).abs().sqrt()

    monkeypatch.setattr(SASRec, "training_loss", infinite_grad)
    with pytest.raises(ValueError, match="non-finite gradient norm at epoch 1, step 0"):
        run(smoke_cfg(tmp_path), tmp_path / "run")


def test_non_finite_validation_score_names_the_epoch(tmp_path, monkeypatch):
    monkeypatch.setattr(SASRec, "score_items", lambda self, batch: torch.full(
        (batch["item_seq"].shape[0], 81), float("nan")))
    with pytest.raises(ValueError, match="validation after epoch 1: non-finite score"):
        run(smoke_cfg(tmp_path), tmp_path / "run")


# --- 10. corrupt checkpoints ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    run(smoke_cfg(tmp), tmp / "run")
    return tmp / "run"


@pytest.mark.parametrize("content", [b"", b"garbage\x00\x01", "truncated", "foreign"])
def test_corrupt_checkpoint_is_one_line(tmp_path, finished_run, content):
    shutil.copytree(finished_run, tmp_path / "run")
    ck = tmp_path / "run" / "checkpoint.pt"
    if content == "truncated":
        ck.write_bytes(ck.read_bytes()[:200])
    elif content == "foreign":
        torch.save({"weights": 1}, ck)
    else:
        ck.write_bytes(content)
    with pytest.raises(ConfigError, match=f"{ck}.*(retrain|resume)") as e:
        rescore(tmp_path / "run", [], tmp_path / "re")
    assert "\n" not in str(e.value)


def test_corrupt_last_pt_on_resume_is_one_line(tmp_path):
    run(smoke_cfg(tmp_path), tmp_path / "a")
    torch.save({"model": {}}, tmp_path / "a" / "last.pt")  # readable, but no resume state
    with pytest.raises(ConfigError, match="last.pt is not a bftrec checkpoint.*delete it"):
        run(smoke_cfg(tmp_path, "trainer.epochs=2", f"trainer.resume={tmp_path / 'a'}"), tmp_path / "b")


# --- 13. a calmer console ------------------------------------------------------------------------

def test_config_dump_only_on_request(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="bftrec"):
        run(smoke_cfg(tmp_path), tmp_path / "a")
    assert "config:\n" not in messages(caplog) and (tmp_path / "a" / "config.yaml").exists()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bftrec"):
        run(smoke_cfg(tmp_path, "print_config=true"), tmp_path / "b")
    assert "config:\n" in messages(caplog)


def test_no_progress_bar_when_not_a_terminal(tmp_path, capsys):
    run(smoke_cfg(tmp_path, "trainer.progress=true"), tmp_path / "run")
    assert "epoch 1" not in capsys.readouterr().err


def test_eval_does_not_log_the_untrained_lambda0(tmp_path, caplog):
    run(smoke_cfg(tmp_path, "layer=bft"), tmp_path / "run")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        m = rescore(tmp_path / "run", [], tmp_path / "re")
    assert "mean lambda0" not in messages(caplog)
    assert json.loads((tmp_path / "re" / "metrics.json").read_text())["test"] == m["test"]
    assert (tmp_path / "re" / "summary.md").exists()


# --- bftrec-eval never writes over a run or an earlier re-score --------------------------------

@pytest.mark.parametrize("target", ["run", "earlier_eval", "hydra_record"])
def test_rescore_refuses_an_out_folder_that_holds_results(tmp_path, finished_run, target):
    """Any file in --out (a run, an earlier re-score, another run's .hydra/config.yaml) stops bftrec-eval before it
    scores; the file stays as it was."""
    shutil.copytree(finished_run, tmp_path / "run")
    out, name = tmp_path / "run", "metrics.json"
    if target == "earlier_eval":
        out = tmp_path / "run" / "eval_old"
        out.mkdir()
        (out / "metrics.json").write_text("{}")
    if target == "hydra_record":
        out, name = tmp_path / "other" / ".hydra", "config.yaml"
        out.mkdir(parents=True)
        (out / name).write_text("seed: 7\n")
    before = (out / name).read_bytes()
    with pytest.raises(ConfigError, match=f"--out {out} already holds files .*give a new or empty folder") as e:
        rescore(tmp_path / "run", ["eval.repeat_target=mask"], out)
    assert "\n" not in str(e.value)
    assert (out / name).read_bytes() == before
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="--out .*a_file is a file; give a new folder"):
        rescore(tmp_path / "run", [], tmp_path / "a_file")


def test_rescores_started_in_one_second_get_their_own_folders(tmp_path, finished_run, monkeypatch):
    from datetime import datetime

    import bftrec.evaluate as ev_mod

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 1, 12, 0, 0)

    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.setattr(ev_mod, "datetime", Frozen)
    rescore(tmp_path / "run", ["eval.n_bins=2"])
    rescore(tmp_path / "run", ["eval.n_bins=3"])
    bins = {p.parent.name: len(json.loads(p.read_text())["test"]["by_item_freq"])
            for p in (tmp_path / "run").glob("eval_*/metrics.json")}
    assert bins == {"eval_20260101-120000": 2, "eval_20260101-120000_2": 3}


def test_rescore_unknown_eval_key_names_the_closest(tmp_path, finished_run):
    with pytest.raises(ConfigError, match=r"unknown key 'eval.n_binz'; did you mean eval.n_bins\?"):
        rescore(finished_run, ["eval.n_binz=3"], tmp_path / "re")
    assert not (tmp_path / "re").exists()


def test_eval_cli_takes_out_before_the_overrides(tmp_path, finished_run):
    from bftrec.evaluate import main

    main([str(finished_run), "--out", str(tmp_path / "re"), "eval.n_bins=2"])
    assert json.loads((tmp_path / "re" / "metrics.json").read_text())["overrides"] == ["eval.n_bins=2"]


def test_run_written_before_an_eval_key_rescores_with_it(tmp_path, finished_run):
    """A config.yaml without eval.exclude_scope (runs older than the key) rescores with the key overridden, and
    without the override at its default, the way it was scored."""
    import yaml

    shutil.copytree(finished_run, tmp_path / "run")
    path = tmp_path / "run" / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    del cfg["eval"]["exclude_scope"]
    path.write_text(yaml.safe_dump(cfg))
    same = rescore(tmp_path / "run", [], tmp_path / "same")
    window = rescore(tmp_path / "run", ["eval.exclude_scope=window"], tmp_path / "window")
    assert same["protocol"]["exclude_scope"] == "all" and window["protocol"]["exclude_scope"] == "window"
    assert same["test"] == json.loads((finished_run / "metrics.json").read_text())["test"]
    assert "exclude_scope: window" in (tmp_path / "window" / "config.yaml").read_text()


def _interrupt_after_first_save(tmp_path, overrides: list, last_pt: str) -> tuple:
    """Start ``bftrec-train`` with ``overrides``, send SIGINT once ``last_pt`` (a glob under ``tmp_path``) exists;
    returns (exit status, stderr, the run directory holding that ``last.pt``)."""
    import signal
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "bftrec.train", *overrides, f"out_root={tmp_path}", f"cache_dir={tmp_path / 'cache'}"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(last_pt)):
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    return p.returncode, err, next(tmp_path.glob(last_pt)).parent


def test_ctrl_c_ends_in_one_line_with_the_resume_command(tmp_path):
    """issue 50 item 3: SIGINT after an epoch was saved: one line with the exact resume command, FAILED says the
    same, exit status 130 (an interrupt), no traceback."""
    code, err, run_dir = _interrupt_after_first_save(
        tmp_path, ["debug=smoke", "trainer.epochs=400", "trainer.min_epochs=400"], "synthetic/*/*/*/last.pt")
    line = f"bftrec-train: interrupted; continue it with: bftrec-train trainer.resume={run_dir}"
    assert code == 130 and err.strip().splitlines()[-1] == line, err[-2000:]
    assert "Traceback" not in err and "Error executing job" not in err
    assert f"trainer.resume={run_dir}" in (run_dir / "FAILED").read_text()


def test_ctrl_c_in_a_sweep_stops_the_sweep_and_the_ledger_says_interrupted(tmp_path):
    """-m: a Ctrl-C in the first cell ends the sweep there (the second cell never starts), with the resume line,
    exit status 130, and the ledger line ``interrupted``, not ``failed``."""
    code, err, run_dir = _interrupt_after_first_save(
        tmp_path, ["-m", "debug=smoke", "seed=0,1", "trainer.epochs=400", "trainer.min_epochs=400"],
        "**/seed0*/last.pt")
    assert code == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == f"bftrec-train: interrupted; continue it with: bftrec-train " \
                                           f"trainer.resume={run_dir}", err[-2000:]
    (ledger,) = tmp_path.glob("**/ledger.jsonl")
    lines = [json.loads(ln) for ln in ledger.read_text().splitlines()]
    assert [(ln["cell"].split("/")[-1], ln["status"]) for ln in lines] == [("seed0_job0", "interrupted")]
    assert not list(tmp_path.glob("**/seed1*/*.pt"))


def test_a_swallowed_ctrl_c_still_ends_the_run_at_the_next_step(tmp_path, monkeypatch):
    """A SIGINT that Python swallowed (raised inside a __del__ during garbage collection) is recorded by
    bftrec-train's handler; the next training step raises it again: the run ends after epoch 1 with the resume
    line, instead of going on to its last epoch."""
    from bftrec import trainer
    from bftrec.rundir import Interrupted

    real_save = trainer._save_progress

    def save_then_swallow(*a, **k):
        real_save(*a, **k)
        try:
            trainer.on_sigint(2, None)  # as the handler runs inside a __del__: its exception goes nowhere
        except KeyboardInterrupt:
            pass

    monkeypatch.setattr(trainer, "_save_progress", save_then_swallow)
    with pytest.raises(Interrupted, match="continue it with: bftrec-train trainer.resume="):
        run(smoke_cfg(tmp_path, "trainer.epochs=3", "trainer.min_epochs=3"), tmp_path / "run")
    assert pd.read_csv(tmp_path / "run" / "history.csv")["epoch"].tolist() == [1]
    assert "trainer.resume=" in (tmp_path / "run" / "FAILED").read_text()
    assert not trainer._INTERRUPT["pending"]  # handled: a later run in this process is not interrupted
    # swallowed after the last epoch's save, where no step follows: the run finishes (test scored, metrics.json
    # written), then stops with a line saying so, so that a sweep stops after this cell instead of going on
    with pytest.raises(Interrupted, match=r"interrupted after .*last finished .*finished cells are skipped"):
        run(smoke_cfg(tmp_path, "trainer.epochs=1"), tmp_path / "last")
    assert json.loads((tmp_path / "last" / "metrics.json").read_text())["epochs_run"] == 1
    assert not (tmp_path / "last" / "FAILED").exists() and not trainer._INTERRUPT["pending"]
    monkeypatch.setattr(trainer, "_save_progress", real_save)
    assert run(smoke_cfg(tmp_path, "trainer.epochs=2"), tmp_path / "again")["epochs_run"] == 2


def test_ctrl_c_in_a_grid_cell_says_to_rerun_the_grid(tmp_path, monkeypatch):
    """A grid cell (``skip_finished``) resumes in place when its grid's command is rerun; ``trainer.resume`` would
    train it into a new folder the grid never reads. So its interrupt line (and FAILED) say to rerun, and the
    rerun finishes the cell in its own folder."""
    from bftrec import trainer
    from bftrec.rundir import Interrupted

    real_save = trainer._save_progress

    def save_then_interrupt(*a, **k):
        real_save(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_save_progress", save_then_interrupt)
    cell = tmp_path / "runs" / "cell"
    with pytest.raises(Interrupted, match=f"rerun the same command to continue {cell} in place"):
        run(smoke_cfg(tmp_path, "skip_finished=true", "trainer.epochs=2"), cell)
    assert "rerun the same command" in (cell / "FAILED").read_text()
    monkeypatch.setattr(trainer, "_save_progress", real_save)
    m = run(smoke_cfg(tmp_path, "skip_finished=true", "trainer.epochs=2"), cell)
    assert m["epochs_run"] == 2 and not (cell / "FAILED").exists()


def test_a_cell_that_finished_before_a_late_ctrl_c_is_ledgered_as_ran(tmp_path, monkeypatch):
    """In a sweep, the cell whose test scoring swallowed a Ctrl-C is complete: its ledger line says ``ran``, and
    the interrupt stops the sweep (it propagates as ``Interrupted``, which Hydra's job runner does not catch)."""
    from types import SimpleNamespace

    from bftrec import train, trainer
    from bftrec.rundir import Interrupted

    real_save = trainer._save_progress

    def save_then_swallow(*a, **k):
        real_save(*a, **k)
        try:
            trainer.on_sigint(2, None)
        except KeyboardInterrupt:
            pass

    monkeypatch.setattr(trainer, "_save_progress", save_then_swallow)
    hc = SimpleNamespace(sweep=SimpleNamespace(dir=str(tmp_path)), overrides=SimpleNamespace(task=["seed=0"]))
    with pytest.raises(Interrupted, match="finished"):
        train._grid_cell(smoke_cfg(tmp_path, "trainer.epochs=1"), tmp_path / "cell", hc)
    (line,) = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert line["status"] == "ran" and (tmp_path / "cell" / "metrics.json").exists()


# --- issue 50 item 2: faults are named in one line, FAILED holds it, the last good checkpoint survives --------

def test_a_full_disk_is_named_and_the_last_good_checkpoint_survives(tmp_path, monkeypatch):
    import errno

    from bftrec import trainer

    real_save, calls = torch.save, {"n": 0}

    def save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] > 2:  # epoch 1 saved checkpoint.pt and last.pt; then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(trainer.torch, "save", save)
    with pytest.raises(ConfigError, match="no space left on the device holding .*free space or set out_root=") as e:
        run(smoke_cfg(tmp_path, "trainer.epochs=3", "trainer.min_epochs=3"), tmp_path / "run")
    assert "\n" not in str(e.value)
    assert "no space left" in (tmp_path / "run" / "FAILED").read_text()
    monkeypatch.undo()
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=False)["state"]["epoch"] == 1  # intact
    assert not list((tmp_path / "run").glob(".*.tmp*"))  # no torn temporary left behind


def test_out_of_memory_is_named_with_the_size_and_what_to_lower(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 85899345920 bytes.")

    monkeypatch.setattr(SASRec, "training_loss", boom)
    with pytest.raises(ConfigError, match=r"out of memory: a step asked for 80.0 GiB; lower trainer.batch_size"):
        run(smoke_cfg(tmp_path), tmp_path / "run")
    assert "out of memory" in (tmp_path / "run" / "FAILED").read_text()


def test_an_unwritable_out_root_is_one_line_through_the_console(tmp_path):
    import subprocess
    import sys

    (tmp_path / "a_file").write_text("not a folder")
    r = subprocess.run([sys.executable, "-m", "bftrec.train", "debug=smoke", f"out_root={tmp_path / 'a_file' / 'x'}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert r.stderr.startswith("bftrec-train: error: cannot write ") and "set out_root=" in r.stderr
