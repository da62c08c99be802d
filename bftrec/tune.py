"""``bftrec-tune``: hyperparameter search with Optuna, over the same Hydra configs as ``bftrec-train``.

    bftrec-tune --space transformer --trials 30 --layers standard,bft -- dataset=office model=sasrec \
        trainer.device=cpu trainer.num_threads=1

- The search space is a config group, ``configs/tune/<name>.yaml`` (``space``, plus ``bft_space`` for BFT
  layers). Every trial composes ``train.yaml`` with the overrides after ``--`` and its sampled values, and is
  a normal run directory (``<out>/<study>/trial<k>``), scored by ``bftrec.experiment.run``.
- **Equal budgets:** ``--layers standard,bft`` runs one study per layer with the same number of trials, the
  same sampler seed and the same space (plus BFT's knobs for BFT). The objective is validation
  ``trainer.select_metric`` (NDCG@10); test is never looked at to choose.
- Storage is SQLite (``<out>/<study>.db``) unless ``--storage`` gives a database URL: a killed study resumes
  where it stopped, and several workers, on one machine or many (start the same command on each, e.g. with
  ``srun`` or submitit), share one study. A trial in flight when a worker dies is failed once its heartbeat is
  stale (``--grace`` seconds) and retried with the same values: a kill loses at most that trial.
- Pruning: median pruner on the per-epoch validation metric.
- Outputs per study: ``trials.csv``, ``best.yaml`` (a candidate ``configs/tuned/`` file), and the
  optimisation-history and parameter-importance figures.

Bad input fails before any trial, in one line: an unknown key, an empty or inverted range, a study resumed
with another space.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

from bftrec.config import CONFIG_DIR, ConfigError
from bftrec.rundir import override_key

log = logging.getLogger("bftrec.tune")
TYPES = ("float", "int", "categorical")
FIELDS = {"float": {"type", "low", "high", "log"}, "int": {"type", "low", "high", "log"},
          "categorical": {"type", "choices"}}
BFT_LAYERS = ("bft", "bft_h")
NOT_SEARCHED = ("dataset", "model", "layer", "seed", "experiment", "debug")  # what a study compares, not tunes
SEED_LIMIT = 2 ** 32  # numpy's and Optuna's sampler seeds lie in [0, 2**32)


def parse_space(node: dict, where: str) -> dict[str, dict]:
    """Check one space (``{key: {type, low, high, log} | {type: categorical, choices}}``) and return it.

    Raises:
        ConfigError: an unknown type or field (``Log:``), a grid axis (``layer``, ``dataset``, ``model``, ``seed``:
            the study compares them, with equal budgets, instead of searching them), a missing, infinite, empty or
            inverted range, a ``log`` that is not true or false, log with low <= 0, no choices; one line naming
            ``where`` and the key.
    """
    out = {}
    if node is not None and not isinstance(node, dict):
        raise ConfigError(f"{where}: a mapping of keys to {{type, low, high}} is needed, got {type(node).__name__}")
    for key, spec in (node or {}).items():
        if override_key(str(key)) in NOT_SEARCHED:
            raise ConfigError(f"{where}: {key} is not searched: a study compares layers with --layers and runs one "
                              "dataset, backbone and seed (set them after --); drop it from the space")
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            raise ConfigError(f"{where}: {key}: give type: one of {', '.join(TYPES)} (got {spec!r})")
        unknown = sorted(set(map(str, spec)) - FIELDS[spec["type"]])
        if unknown:
            raise ConfigError(f"{where}: {key}: unknown field(s) {', '.join(unknown)} for type {spec['type']}; "
                              f"a {spec['type']} parameter takes {', '.join(sorted(FIELDS[spec['type']]))}")
        if "log" in spec and not isinstance(spec["log"], bool):
            raise ConfigError(f"{where}: {key}: log={spec['log']!r}; give log: true or log: false (unquoted)")
        if spec["type"] == "categorical":
            if not isinstance(spec.get("choices"), list) or not spec["choices"]:
                raise ConfigError(f"{where}: {key}: a categorical parameter needs a non-empty choices list")
        else:
            if "low" not in spec or "high" not in spec:
                raise ConfigError(f"{where}: {key}: give low and high")
            for bound in ("low", "high"):  # PyYAML reads 1e-4 (no dot) as a string
                if isinstance(spec[bound], str):
                    try:
                        spec[bound] = float(spec[bound])
                    except ValueError:
                        raise ConfigError(f"{where}: {key}: {bound}={spec[bound]!r} is not a number") from None
            low, high = spec["low"], spec["high"]
            if not (isinstance(low, (int, float)) and isinstance(high, (int, float))) or not low < high:
                raise ConfigError(f"{where}: {key}: the range [{low}, {high}] is empty or inverted; give low < high")
            if not (math.isfinite(low) and math.isfinite(high)):
                raise ConfigError(f"{where}: {key}: the range [{low}, {high}] is not finite; give finite bounds")
            if spec.get("log") and low <= 0:
                raise ConfigError(f"{where}: {key}: log: true needs low > 0 (got {low})")
            if spec["type"] == "int" and not (float(low).is_integer() and float(high).is_integer()):
                raise ConfigError(f"{where}: {key}: an int parameter needs integer bounds (got {low}, {high})")
        out[key] = dict(spec)
    return out


def load_space(name: str, layer: str, config_dir: str = CONFIG_DIR) -> dict[str, dict]:
    """The space of ``configs/tune/<name>.yaml`` (or a yaml path) for ``layer``: ``space`` + ``bft_space`` for BFT.

    Raises:
        ConfigError: no such file, or a bad entry (``parse_space``).
    """
    path = Path(name) if name.endswith(".yaml") else Path(config_dir) / "tune" / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in (Path(config_dir) / "tune").glob("*.yaml"))
        raise ConfigError(f"--space {name}: no {path}; choose one of {', '.join(have)} or give a yaml path")
    try:
        node = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid yaml ({str(e).splitlines()[0]}); fix its syntax") from None
    if not isinstance(node, dict):
        raise ConfigError(f"{path}: give a mapping with space: (and bft_space:), not a {type(node).__name__}")
    space = parse_space(node.get("space"), f"{path} space")
    if layer in BFT_LAYERS:
        space.update(parse_space(node.get("bft_space"), f"{path} bft_space"))
    if not space:
        raise ConfigError(f"{path}: the space is empty; give at least one parameter under space:")
    return space


def suggest(trial, space: dict[str, dict]) -> list[str]:
    """One trial's sampled values as Hydra overrides (``trainer.lr=0.00031``), in the space's order."""
    out = []
    for key, s in space.items():
        if s["type"] == "categorical":
            v = trial.suggest_categorical(key, list(s["choices"]))
        elif s["type"] == "int":
            v = trial.suggest_int(key, int(s["low"]), int(s["high"]), log=bool(s.get("log")))
        else:
            v = trial.suggest_float(key, float(s["low"]), float(s["high"]), log=bool(s.get("log")))
        out.append(f"{key}={v}")
    return out


def compose(overrides: list[str]):
    """``train.yaml`` composed with ``overrides``, as bftrec-train composes it (no run directory is made).

    Raises:
        ConfigError: a key or group Hydra cannot compose (one line, ``bftrec.train.hydra_error_line``).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    from bftrec.train import hydra_error_line

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            return hydra_compose("train", overrides=overrides)
    except HydraException as e:
        raise ConfigError(hydra_error_line(e, overrides)) from None


def check_space(base: list[str], space: dict[str, dict]) -> None:
    """Before any trial: every key of the space composes and passes every check a run makes before reading data
    (``bftrec.experiment.check_config``) on top of ``base``, one key at a time, at both bounds (an int one as an
    int) and at every choice, so that the error names the key and the value.

    Raises:
        ConfigError: ``search space: <key>=<value>: <why>``.
    """
    check_buildable(compose(base))
    for key, s in space.items():
        if s["type"] == "categorical":
            values = list(s["choices"])
        elif s["type"] == "int":
            values = [int(s["low"]), int(s["high"])]
        else:
            values = [float(s["low"]), float(s["high"])]
        for value in values:
            try:
                check_buildable(compose([*base, f"{key}={value}"]))
            except ConfigError as e:
                raise ConfigError(f"search space: {key}={value}: {e}") from None


def check_buildable(cfg) -> None:
    """``bftrec.experiment.check_config``, then the model built on a tiny stand-in for the data (a backbone checks
    its own choices, e.g. ``model.block``, only when it is built).

    Raises:
        ConfigError: the first problem, in one line.
    """
    import numpy as np

    from bftrec.experiment import check_config
    from bftrec.models import MODELS, DataInfo

    g = check_config(cfg)
    n_items = max(100, int(getattr(g["model"], "n_negatives", 0)) + 2)
    info = DataInfo(n_items=n_items, train_counts=np.ones(n_items + 1, dtype=np.int64), has_timestamps=True)
    MODELS.get(g["model"].name)(g["model"], g["layer"], info)


def open_study(name: str, storage_url: str, space: dict, base: list[str], seed: int, grace: int, worker: int = 0):
    """Create or resume study ``name``; refuse one created with another space or other base overrides.

    The sampler's seed is ``seed`` for a new study and worker 0; a resumed study, or another worker
    (``worker``), draws from another seed, so that its random start-up trials are not the same points again.

    Raises:
        ConfigError: the stored space or base overrides differ, or the storage cannot be opened (one line).
    """
    import warnings

    import optuna
    from optuna import storages

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats: stable in use
    retry = getattr(storages, "RetryHeartbeatStaleTrialCallback", None) or storages.RetryFailedTrialCallback  # < 4.9
    for attempt in range(5):  # workers started together race to create a new database's tables: try again
        try:
            storage = storages.RDBStorage(storage_url, heartbeat_interval=max(1, grace // 3), grace_period=grace,
                                          heartbeat_stale_trial_callback=retry(max_retry=2))
            before = optuna.load_study(study_name=name, storage=storage) if name in \
                optuna.get_all_study_names(storage) else None
            break
        except Exception as e:  # sqlalchemy and optuna raise many types for a bad URL or an unreadable database
            racing = type(e).__name__ == "IntegrityError" or (  # another worker created the tables first
                type(e).__name__ == "OperationalError" and any(w in str(e) for w in ("already exists", "locked")))
            if attempt < 4 and racing:
                time.sleep(0.5 + attempt)
                continue
            raise ConfigError(f"--storage {storage_url}: cannot open it ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); give a writable sqlite:/// path or a "
                              "database URL") from None
    n_before = len(before.trials) if before is not None else 0
    sampler_seed = (seed + 7919 * worker + 104729 * n_before) % SEED_LIMIT  # resume, other worker: new points
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=sampler_seed),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=3))
    want = {"space": json.dumps(space, sort_keys=True), "base": json.dumps(base)}
    for key, value in want.items():
        stored = study.user_attrs.get(key)
        if stored is None:
            study.set_user_attr(key, value)
        elif stored != value:
            raise ConfigError(f"study {name} ({storage_url}) was created with another {key} ({stored}); "
                              f"resume it with the same --space and overrides, or start another --study")
    return study


def finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def budget_trials(study, n: int) -> list:
    """The first ``n`` finished trials by number: the budget the comparison uses, even when parallel workers
    finished a few more (each worker ends the trial in flight when the study reaches ``n``)."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return sorted(done, key=lambda t: t.number)[:n]


def objective(study_dir: Path, base: list[str], space: dict, stop: Optional[dict] = None):
    """The trial function: compose, run to early stopping with pruning, return validation select_metric. A
    Ctrl-C seen only after the trial's run finished (``FinishedInterrupted``) keeps the trial's value, stops the
    study and sets ``stop["interrupted"]`` (``tune`` then ends as an interrupt)."""
    import optuna

    from bftrec.experiment import run
    from bftrec.rundir import FinishedInterrupted

    def fn(trial) -> float:
        cfg = compose([*base, *suggest(trial, space)])
        metric = cfg.trainer.select_metric

        def on_validate(epoch: int, score: float) -> None:
            trial.report(score, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at epoch {epoch}: valid {metric} {score:.4f} below the median")

        try:
            metrics = run(cfg, study_dir / f"trial{trial.number:03d}", on_validate=on_validate)
        except FinishedInterrupted as e:  # finished before the Ctrl-C was seen: a complete trial, then stop
            metrics = e.metrics
            trial.study.stop()
            if stop is not None:
                stop["interrupted"] = True
        trial.set_user_attr("run_dir", str(study_dir / f"trial{trial.number:03d}"))
        return float(metrics["valid"][metric])

    return fn


def write_outputs(study, study_dir: Path, space: dict, n: int) -> None:
    """``trials.csv`` (every trial, ``in_budget`` marking the first ``n`` finished ones), ``best.yaml`` (a candidate
    configs/tuned/ file: the best completed trial within the budget) and the two figures of one study."""
    import optuna

    budget = budget_trials(study, n)
    table = study.trials_dataframe()
    if len(table):
        table["in_budget"] = table["number"].isin({t.number for t in budget})
    table.to_csv(study_dir / "trials.csv", index=False)
    complete = [t for t in budget if t.state.name == "COMPLETE"]
    if not complete:
        log.warning("%s: no completed trial within the budget yet: no best.yaml or figures", study.study_name)
        return
    best = max(complete, key=lambda t: t.value)
    nested: dict = {}
    for key, value in best.params.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (study_dir / "best.yaml").write_text(
        f"# @package _global_\n# Candidate for configs/tuned/ from bftrec-tune study {study.study_name}: best of "
        f"the first {len(budget)} finished trials, trial {best.number}, validation value {best.value:.4f}.\n"
        f"# Rerun it with several seeds before trusting it (the tuning saw one seed). Tuned on top of: "
        f"{' '.join(json.loads(study.user_attrs.get('base', '[]')))}\n"
        + yaml.safe_dump(nested, sort_keys=False)
        + f"tuned_config: {study.study_name}   # rename to <dataset>_<model> when it goes to configs/tuned/\n")
    import warnings

    from optuna.visualization.matplotlib import plot_optimization_history, plot_param_importances

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    level = optuna.logging.get_verbosity()  # the plots are quiet; the next study's trial lines are not

    ax = plot_optimization_history(study)
    ax.figure.savefig(study_dir / "optimization_history.png", dpi=100, bbox_inches="tight")
    if len(space) > 1 and len(complete) >= 2:
        try:
            ax = plot_param_importances(study)
            ax.figure.savefig(study_dir / "param_importances.png", dpi=100, bbox_inches="tight")
        except (RuntimeError, ValueError) as e:  # e.g. every trial with the same value
            log.warning("%s: no importance figure (%s)", study.study_name, e)
    import matplotlib.pyplot as plt

    plt.close("all")
    optuna.logging.set_verbosity(level)


def tune(args: argparse.Namespace, base: list[str]) -> list[Path]:
    """Run (or resume) one study per layer of ``args.layers``; returns their folders."""
    plans = []
    for layer in args.layers:  # every layer's space is checked before the first trial of any study
        space = load_space(args.space, layer)
        fixed = sorted({override_key(o) for o in base} & set(space))
        if fixed:
            raise ConfigError(f"{', '.join(fixed)}: both set after -- and searched by --space {args.space}; drop "
                              "the override or the key from the space")
        check_space([*base, f"layer={layer}"], space)
        plans.append((layer, space))
    url = args.storage or f"sqlite:///{(args.out / 'studies.db').resolve()}"
    if not args.storage:
        args.out.mkdir(parents=True, exist_ok=True)
    studies = [(layer, space, open_study(f"{args.study}_{layer}", url, space, [*base, f"layer={layer}"], args.seed,
                                         args.grace, args.worker))
               for layer, space in plans]  # every study opened and checked (a resume's space) before any trial
    dirs = []
    for layer, space, study in studies:
        layer_base = [*base, f"layer={layer}"]
        name = f"{args.study}_{layer}"
        study_dir = args.out / name
        study_dir.mkdir(parents=True, exist_ok=True)
        left = args.trials - finished(study)
        log.info("study %s: %d of %d trials finished; %d to run", name, args.trials - max(left, 0), args.trials,
                 max(left, 0))
        if left > 0:
            from optuna.study import MaxTrialsCallback
            from optuna.trial import TrialState

            # a trial that diverges or fails on bad data is recorded as FAIL and the study goes on
            stop: dict = {}
            study.optimize(objective(study_dir, layer_base, space, stop), n_trials=left,
                           catch=(ValueError, RuntimeError, FileNotFoundError),
                           callbacks=[MaxTrialsCallback(args.trials, states=(TrialState.COMPLETE, TrialState.PRUNED))])
            if stop.get("interrupted"):  # its last trial finished and counts; the Ctrl-C ends the tuning
                write_outputs(study, study_dir, space, args.trials)
                raise KeyboardInterrupt
        if finished(study) < args.trials:
            log.warning("study %s: %d of %d trials finished (the others failed: trials.csv); rerun to top it up",
                        name, finished(study), args.trials)
        write_outputs(study, study_dir, space, args.trials)
        dirs.append(study_dir)
    return dirs


def main(argv: list[str] | None = None) -> None:
    """Console script ``bftrec-tune``; everything after ``--`` are bftrec-train overrides."""
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, base = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="bftrec-tune", description=__doc__.splitlines()[0],
                                 usage="bftrec-tune [options] -- <bftrec-train overrides, e.g. dataset=office>",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--space", default="transformer", help="configs/tune/<name>.yaml or a yaml path")
    ap.add_argument("--trials", type=int, default=30, help="finished trials per layer (a resumed study tops up)")
    ap.add_argument("--layers", type=lambda s: [x for x in s.split(",") if x], default=["standard"],
                    help="comma-separated layers, one study each, equal budgets (e.g. standard,bft)")
    ap.add_argument("--study", help="study name prefix (default <dataset>_<model>)")
    ap.add_argument("--out", type=Path, default=Path("results/tune"), help="folder of the studies and their runs")
    ap.add_argument("--storage", help="database URL shared by workers (default sqlite:///<out>/studies.db)")
    ap.add_argument("--seed", type=int, default=0, help="sampler seed (the same for every layer)")
    ap.add_argument("--worker", type=int, default=0,
                    help="this worker's number when several share a study: each draws other start-up points")
    ap.add_argument("--grace", type=int, default=120,
                    help="seconds without a heartbeat before a dead worker's trial is failed and retried")
    ap.add_argument("--verbose", action="store_true",
                    help="log every trial's epochs and run summary (default: the study's progress only)")
    args = ap.parse_args(ours)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    quiet, level = logging.getLogger("bftrec"), logging.getLogger("bftrec").level
    if not args.verbose:  # a trial's run summary shows test numbers: tuning must not be steered by them
        quiet.setLevel(logging.WARNING)
        log.setLevel(logging.INFO)
    if args.trials < 1:
        ap.error(f"--trials {args.trials}: give at least 1")
    if not args.layers:
        ap.error("--layers: give at least one layer, e.g. standard,bft")
    if args.grace < 1:
        ap.error(f"--grace {args.grace}: give at least 1 second")
    for flag, value in (("--seed", args.seed), ("--worker", args.worker)):
        if not 0 <= value < SEED_LIMIT:
            ap.error(f"{flag} {value}: give an integer in [0, 2**32)")
    if any(o.split("=")[0].lstrip("+") in ("layer", "hydra.sweeper.params") for o in base):
        ap.error("set the layers with --layers, not layer= after --")
    try:
        import optuna  # noqa: F401
    except ImportError:
        ap.error("bftrec-tune needs optuna: pip install optuna (or pip install -e .)")
    from bftrec.trainer import install_sigint_handler

    previous = install_sigint_handler()  # a Ctrl-C that Python swallows still ends the trial at its next step
    try:
        if not args.study:
            cfg = compose(base)
            args.study = f"{cfg.dataset.name}_{cfg.model.name}"
        for d in tune(args, base):
            log.info("study folder %s (trials.csv, best.yaml, figures)", d)
    except ConfigError as e:
        print(f"bftrec-tune: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # also a trial's Interrupted: Optuna records that trial as failed and re-raises
        print("bftrec-tune: interrupted; the studies keep their finished trials: rerun the same command to go on "
              "(the trial in flight starts over)", file=sys.stderr)
        sys.exit(130)
    finally:
        quiet.setLevel(level)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    main()
