"""bftrec-tune: spaces checked before any trial, equal budgets per layer, a study that survives SIGKILL, pruning."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from bftrec.config import ConfigError  # noqa: E402
from bftrec.tune import check_space, load_space, main, open_study, parse_space  # noqa: E402

SMOKE = ["debug=smoke", "trainer.epochs=2", "trainer.device=cpu", "trainer.num_threads=1"]


@pytest.mark.parametrize("spec, message", [
    ({"trainer.lr": {"type": "float", "low": 0.01, "high": 0.001}}, "trainer.lr: the range .* is empty or inverted"),
    ({"trainer.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}, "trainer.lr: log: true needs low > 0"),
    ({"model.dropout": {"type": "uniform", "low": 0, "high": 1}}, "model.dropout: give type: one of float"),
    ({"layer.tau.kind": {"type": "categorical", "choices": []}}, "layer.tau.kind: a categorical parameter needs"),
    ({"model.n_layers": {"type": "int", "low": 1.5, "high": 3}}, "model.n_layers: an int parameter needs integer"),
    ({"trainer.lr": {"type": "float", "low": 1e-4, "high": float("inf")}}, r"trainer.lr: the range .* is not finite"),
    ({"trainer.lr": {"type": "float", "low": 1e-5, "high": 0.1, "Log": True}}, r"trainer.lr: unknown field\(s\) Log"),
    ({"trainer.lr": {"type": "float", "low": 1e-5, "high": 0.1, "step": 0.5}}, r"unknown field\(s\) step for type"),
    ({"layer.tau.kind": {"type": "categorical", "choices": ["a"], "low": 1}}, r"tau.kind: unknown field\(s\) low"),
    ({"trainer.lr": {"type": "float", "low": 1e-5, "high": 0.1, "log": "false"}}, "log='false'; give log: true or"),
    ({"layer": {"type": "categorical", "choices": ["standard", "bft"]}}, "layer is not searched: a study compares"),
    ({"seed": {"type": "int", "low": 0, "high": 3}}, "seed is not searched"),
    ({"dataset": {"type": "categorical", "choices": ["office"]}}, "dataset is not searched"),
])
def test_a_bad_range_is_one_line_naming_the_key(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_space(spec, "space")


def test_bft_gets_the_shared_space_plus_its_own():
    std, bft = load_space("transformer", "standard"), load_space("transformer", "bft")
    assert set(std) < set(bft) and {k for k in bft if k.startswith("layer.")} == set(bft) - set(std)
    with pytest.raises(ConfigError, match="--space nope: no .*choose one of .*transformer"):
        load_space("nope", "standard")


def test_the_gru4rec_space_composes_on_gru4rec_and_searches_no_unused_or_bft_key():
    """``--space gru4rec`` passes the pre-trial check at every bound on ``model=gru4rec`` (no BFT knobs, no
    ``model.attn_dropout``, which GRU4Rec does not use); a BFT layer gets the same space and is refused by the model."""
    space = load_space("gru4rec", "standard")
    assert load_space("gru4rec", "bft") == space and "model.attn_dropout" not in space
    check_space([*SMOKE, "model=gru4rec"], space)
    with pytest.raises(ConfigError, match="gru4rec"):
        check_space([*SMOKE, "model=gru4rec", "layer=bft"], space)


def test_an_unknown_key_fails_before_any_trial(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("space:\n  trainer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n"
                   "  trainer.lrr: {type: float, low: 1.0e-4, high: 1.0e-2}\n")
    with pytest.raises(ConfigError, match="search space: trainer.lrr=0.0001: .*trainer.lrr"):
        check_space(SMOKE, load_space(str(bad), "standard"))
    with pytest.raises(SystemExit) as e:  # the console path: one line, exit 2, no trial run
        main(["--space", str(bad), "--trials", "1", "--out", str(tmp_path / "out"), "--", *SMOKE])
    assert e.value.code == 2 and not list((tmp_path / "out").rglob("trial*"))


def test_a_study_resumed_with_another_space_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = load_space("transformer", "standard")
    open_study("x", url, space, SMOKE, 0, 60)
    open_study("x", url, space, SMOKE, 0, 60)  # the same space resumes
    with pytest.raises(ConfigError, match="study x .*another space.*same --space and overrides, or start another"):
        open_study("x", url, {**space, "model.d_model": {"type": "int", "low": 8, "high": 16}}, SMOKE, 0, 60)


def test_equal_budgets_and_a_sigkill_loses_at_most_the_trial_in_flight(tmp_path):
    """Two layers, 3 trials each; the worker is SIGKILLed during the standard study, then resumed: every study
    ends with exactly 3 finished trials, the trials finished before the kill are kept, and the one in flight is
    failed and retried with the same values. Each trial is a normal run directory."""
    out = tmp_path / "tune"
    cmd = [sys.executable, "-m", "bftrec.tune", "--trials", "3", "--layers", "standard,bft", "--out", str(out),
           "--study", "t", "--grace", "2", "--", *SMOKE[:1], "trainer.epochs=5", *SMOKE[2:]]  # trials of seconds
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url, deadline = f"sqlite:///{out / 'studies.db'}", time.time() + 240
    try:
        while time.time() < deadline:  # kill once a trial has finished and the next one is running
            time.sleep(0.2)
            if not (out / "studies.db").exists():
                continue
            os.killpg(proc.pid, signal.SIGSTOP)  # frozen, the worker cannot finish a trial between look and kill
            try:
                trials = optuna.load_study(study_name="t_standard", storage=optuna.storages.RDBStorage(
                    url, engine_kwargs={"connect_args": {"timeout": 1}})).trials
            except Exception:  # the study is not created yet, or the frozen worker holds the database lock
                trials = []
            states = [t.state.name for t in trials]
            # a trial whose run directory holds its config has started its heartbeat thread: its death is seen
            if states.count("COMPLETE") >= 1 and states[-1] == "RUNNING" and \
                    (out / "t_standard" / f"trial{trials[-1].number:03d}" / "config.yaml").exists():
                break
            os.killpg(proc.pid, signal.SIGCONT)
    finally:  # also on an interrupt between SIGSTOP and SIGCONT: SIGKILL ends a stopped process too
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    before = optuna.load_study(study_name="t_standard", storage=url).trials
    kept = {t.number for t in before if t.state.name == "COMPLETE"}
    assert kept and before[-1].state.name == "RUNNING", [t.state.name for t in before]
    time.sleep(3)  # past the grace period: the dead worker's trial is stale
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)
    studies = {layer: optuna.load_study(study_name=f"t_{layer}", storage=url) for layer in ("standard", "bft")}
    for layer, study in studies.items():
        done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
        assert len(done) == 3, (layer, [t.state.name for t in study.trials])
        assert (out / f"t_{layer}" / "best.yaml").exists() and (out / f"t_{layer}" / "trials.csv").exists()
    std = studies["standard"].trials
    assert kept <= {t.number for t in std if t.state.name == "COMPLETE"}  # nothing finished was lost
    failed = [t for t in std if t.state.name == "FAIL"]
    assert len(failed) == 1 and any(t.params == failed[0].params and t.state.name == "COMPLETE" for t in std)
    assert set(studies["bft"].best_params) - set(studies["standard"].best_params) == set(load_space(
        "transformer", "bft")) - set(load_space("transformer", "standard"))
    assert (out / "t_standard" / f"trial{min(kept):03d}" / "metrics.json").exists()  # a normal run directory


def test_a_pruned_trial_stops_after_its_validation_and_says_why(tmp_path):
    from bftrec.experiment import run
    from tests.test_train_e2e import smoke_cfg

    seen = []

    def prune(epoch, score):
        seen.append((epoch, score))
        raise optuna.TrialPruned(f"pruned at epoch {epoch}")

    with pytest.raises(optuna.TrialPruned):
        run(smoke_cfg(tmp_path, "trainer.epochs=3"), tmp_path / "trial", on_validate=prune)
    assert len(seen) == 1 and seen[0][0] == 1 and 0 <= seen[0][1] <= 1  # epoch 1's validation NDCG@10
    assert "pruned at epoch 1" in (tmp_path / "trial" / "FAILED").read_text()
    assert not (tmp_path / "trial" / "metrics.json").exists() and (tmp_path / "trial" / "last.pt").exists()


def _space(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("space: [a, b]\n", "a mapping of keys to"),
    ("space:\n  trainer.lr: {type: float, low: 1.0e-4\n", "is not valid yaml"),
    ("space:\n  layer.tau.kind: {type: categorical, choices: 1}\n", "needs a non-empty choices list"),
    ("space:\n  trainer.batch_size: {type: int, low: 0, high: 256}\n", "trainer.batch_size=0: trainer.batch_size=0"),
    ("space:\n  model.block: {type: categorical, choices: [pre_ln, preln]}\n", "model.block=preln"),
    ("space:\n  trainer.lr: {type: float, low: 1e-4, high: 1e-2}\n"
     "bft_space:\n  layer.tau.lr_scale: {type: float, low: 10, high: 1}\n", "bft_space: layer.tau.lr_scale: the range"),
])
def test_bad_spaces_fail_before_any_trial_of_any_layer(tmp_path, capsys, text, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["--space", _space(tmp_path, text), "--trials", "1", "--layers", "standard,bft", "--out", str(out),
              "--", *SMOKE])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not list(out.rglob("trial*"))  # not one trial of the standard study ran


@pytest.mark.parametrize("args, message", [(["--grace", "0"], "--grace 0"), (["--layers", ","], "--layers"),
                                           (["--storage", "notaurl"], "--storage notaurl: cannot open it")])
def test_bad_options_are_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main([*args, "--trials", "1", "--out", str(tmp_path / "o"), "--", *SMOKE])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_resumed_study_draws_new_points_and_a_failed_trial_does_not_stop_it(tmp_path):
    space = _space(tmp_path, "space:\n  trainer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n")
    common = ["--space", space, "--out", str(tmp_path / "o"), "--study", "r"]
    main([*common, "--trials", "2", "--", *SMOKE])
    main([*common, "--trials", "4", "--", *SMOKE])
    trials = optuna.load_study(study_name="r_standard", storage=f"sqlite:///{tmp_path / 'o' / 'studies.db'}").trials
    lrs = [t.params["trainer.lr"] for t in trials]
    assert len(lrs) == 4 and len(set(lrs)) == 4  # the resume did not repeat trials 0 and 1
    boom = _space(tmp_path, "space:\n  trainer.lr: {type: float, low: 50.0, high: 100.0}\n")
    main(["--space", boom, "--out", str(tmp_path / "d"), "--study", "d", "--trials", "2", "--", *SMOKE])
    study = optuna.load_study(study_name="d_standard", storage=f"sqlite:///{tmp_path / 'd' / 'studies.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]  # diverged; both ran, no traceback
    assert not (tmp_path / "d" / "d_standard" / "best.yaml").exists()


def test_a_resume_with_another_bft_space_is_refused_before_any_trial_of_any_layer(tmp_path, capsys):
    """Every layer's study is opened and its stored space checked before the first trial: changing only
    ``bft_space`` must not let the standard study run on and break the equal budgets."""
    shared = "space:\n  trainer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n"
    common = ["--out", str(tmp_path / "o"), "--study", "e", "--layers", "standard,bft"]
    main(["--space", _space(tmp_path, shared + "bft_space:\n  layer.tau.lr_scale: {type: float, low: 1, high: 10}\n"),
          "--trials", "1", *common, "--", *SMOKE])
    changed = _space(tmp_path, shared + "bft_space:\n  layer.tau.lr_scale: {type: float, low: 1, high: 100}\n")
    with pytest.raises(SystemExit) as e:
        main(["--space", changed, "--trials", "2", *common, "--", *SMOKE])
    assert e.value.code == 2 and "study e_bft" in capsys.readouterr().err
    db = f"sqlite:///{tmp_path / 'o' / 'studies.db'}"
    assert [len(optuna.load_study(study_name=f"e_{la}", storage=db).trials) for la in ("standard", "bft")] == [1, 1]


def test_seeds_stay_in_the_samplers_range(tmp_path, capsys):
    from bftrec.tune import SEED_LIMIT

    url = f"sqlite:///{tmp_path / 's.db'}"
    open_study("x", url, load_space("transformer", "standard"), SMOKE, SEED_LIMIT - 1, 60, worker=3)  # wraps
    for args in (["--seed", "-1"], ["--worker", "-2"], ["--seed", str(SEED_LIMIT)]):
        with pytest.raises(SystemExit) as e:
            main([*args, "--trials", "1", "--out", str(tmp_path / "o"), "--", *SMOKE])
        assert e.value.code == 2 and f"{args[0]} {args[1]}: give an integer in [0, 2**32)" in capsys.readouterr().err


def test_a_key_both_fixed_and_searched_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--trials", "1", "--out", str(tmp_path / "o"), "--", *SMOKE, "trainer.lr=0.01"])
    assert e.value.code == 2 and "trainer.lr: both set after -- and searched" in capsys.readouterr().err


def test_workers_racing_to_create_a_new_database_try_again(tmp_path, monkeypatch):
    """Two workers started together on a new SQLite file race to create its tables; the loser's IntegrityError
    is retried, not reported as an unwritable path."""
    from optuna import storages

    import bftrec.tune as bt

    real, calls = storages.RDBStorage, []

    class IntegrityError(Exception):  # what sqlalchemy raises to the loser of the race
        pass

    class Flaky(real):
        def __init__(self, *a, **k):
            calls.append(1)
            if len(calls) == 1:
                raise IntegrityError("UNIQUE constraint failed: alembic_version.version_num")
            super().__init__(*a, **k)

    monkeypatch.setattr(storages, "RDBStorage", Flaky)
    monkeypatch.setattr(bt.time, "sleep", lambda s: None)
    open_study("x", f"sqlite:///{tmp_path / 's.db'}", load_space("transformer", "standard"), SMOKE, 0, 60)
    assert len(calls) == 2


def test_writing_one_study_keeps_optuna_logging_for_the_next(tmp_path):
    """--layers standard,bft: the second study's trial lines are logged as the first's (the figures used to set
    Optuna's verbosity to WARNING for good)."""
    from bftrec.tune import write_outputs

    space = {"trainer.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}
    optuna.logging.set_verbosity(optuna.logging.INFO)
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: -abs(t.suggest_float("trainer.lr", 1e-4, 1e-2, log=True) - 1e-3), n_trials=3)
    write_outputs(study, tmp_path, space, 3)
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    assert (tmp_path / "best.yaml").exists() and (tmp_path / "optimization_history.png").exists()


def test_an_unwritable_storage_fails_at_once(tmp_path, capsys, monkeypatch):
    """Only the schema race is retried: a path that cannot be opened is one line, without the retries' waits."""
    import bftrec.tune as bt

    waits = []
    monkeypatch.setattr(bt.time, "sleep", waits.append)
    with pytest.raises(SystemExit) as e:
        main(["--storage", f"sqlite:///{tmp_path}/no/such/dir/s.db", "--trials", "1", "--out", str(tmp_path / "o"),
              "--", *SMOKE])
    assert e.value.code == 2 and "cannot open it (OperationalError" in capsys.readouterr().err
    assert waits == []


def _lr_study(tmp_path, study: str) -> list[str]:
    """bftrec-tune's arguments for a 2-trial study of trainer.lr on the smoke data, in ``tmp_path / 'o'``."""
    space = _space(tmp_path, "space:\n  trainer.lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}\n")
    return ["--space", space, "--out", str(tmp_path / "o"), "--study", study, "--trials", "2", "--", *SMOKE]


def _ctrl_c_at_save(monkeypatch, n: int, swallowed: bool):
    """A Ctrl-C right after the ``n``-th epoch save: raised (``KeyboardInterrupt``), or ``swallowed`` as inside a
    ``__del__`` (the SIGINT handler records it; its exception goes nowhere). Returns the real save function."""
    from bftrec import trainer

    real_save, saves = trainer._save_progress, []

    def save(*a, **k):
        real_save(*a, **k)
        saves.append(1)
        if len(saves) == n:
            if not swallowed:
                raise KeyboardInterrupt
            try:
                trainer.on_sigint(2, None)
            except KeyboardInterrupt:
                pass

    monkeypatch.setattr(trainer, "_save_progress", save)
    return real_save


def test_ctrl_c_in_a_trial_is_one_line_and_the_study_goes_on_when_rerun(tmp_path, capsys, monkeypatch):
    """A Ctrl-C during trial 1 (after its first epoch was saved): one line, exit status 130, the SIGINT handler
    put back; the finished trial is kept, and the same command runs the rest."""
    from bftrec import trainer

    args = _lr_study(tmp_path, "c")
    real_save = _ctrl_c_at_save(monkeypatch, 3, swallowed=False)  # trial 0 saved epochs 1 and 2; trial 1 epoch 1
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 130 and "bftrec-tune: interrupted; the studies keep their finished trials: rerun the " \
        "same command" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before
    storage = f"sqlite:///{tmp_path / 'o' / 'studies.db'}"
    states = [t.state.name for t in optuna.load_study(study_name="c_standard", storage=storage).trials]
    assert states == ["COMPLETE", "FAIL"]
    monkeypatch.setattr(trainer, "_save_progress", real_save)
    main(args)
    states = [t.state.name for t in optuna.load_study(study_name="c_standard", storage=storage).trials]
    assert states.count("COMPLETE") == 2


def test_a_ctrl_c_after_a_trials_last_step_keeps_that_trial_and_stops(tmp_path, capsys, monkeypatch):
    """A Ctrl-C swallowed after trial 0's last training step (its test scoring): the trial finished, so it is
    COMPLETE with its value, no other trial starts, trials.csv is written, and the command ends as an interrupt."""
    from bftrec import trainer

    args = _lr_study(tmp_path, "late")
    _ctrl_c_at_save(monkeypatch, 2, swallowed=True)  # trial 0's last epoch saved: the Ctrl-C goes nowhere
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 130 and "bftrec-tune: interrupted" in capsys.readouterr().err
    storage = f"sqlite:///{tmp_path / 'o' / 'studies.db'}"
    (t,) = optuna.load_study(study_name="late_standard", storage=storage).trials
    assert t.state.name == "COMPLETE" and t.value is not None and t.user_attrs["run_dir"].endswith("trial000")
    assert (tmp_path / "o" / "late_standard" / "trials.csv").exists()
    assert not trainer._INTERRUPT["pending"]
