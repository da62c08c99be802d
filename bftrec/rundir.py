"""The run directory's life: where a run writes, who may write there, and what is left when it stops.

``fresh_dir`` makes a unique directory per run (the ``hydra.run.dir`` resolver), ``run_lock`` holds an OS lock
on it while a run writes, ``mark_failed`` leaves ``FAILED`` with a one-line reason, ``fault_line`` turns a full
disk, an unwritable folder or out-of-memory into that line, ``resume_hint`` gives the resume command after
Ctrl-C, and ``resume_config`` rebuilds a resumed run's config from its ``config.yaml`` (docs/DESIGN.md, runs).
"""
from __future__ import annotations

import atexit
import errno
import logging
import os
import re
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Optional

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from bftrec.config import (
    ConfigError,
    load_run_config,
)
from bftrec.grid import cell_lock
from bftrec.trainer import (
    is_main,
)

log = logging.getLogger("bftrec")


class NotThisRun(ConfigError):
    """The run directory belongs to another run (a live job, a finished run, another config): it is
    left exactly as it is, never marked ``FAILED``."""


def mark_failed(out_dir: Path, e: BaseException, reason: Optional[str] = None) -> None:
    """Write ``out_dir/FAILED`` with the one-line reason (``reason``, else the error's; an interrupt's: the
    resume command), so that a half-written directory is never taken for a run (readers look for
    ``metrics.json``; ``FAILED`` says why there is none)."""
    if isinstance(e, NotThisRun) or not is_main() or not out_dir.is_dir() or (out_dir / "metrics.json").exists():
        return
    if reason is None:
        reason = resume_hint(out_dir) if isinstance(e, KeyboardInterrupt) else (" ".join(one_line(e).split())
                                                                                 or type(e).__name__)
    try:
        (out_dir / FAILED).write_text(f"{type(e).__name__}: {reason}\n")
    except OSError:
        pass  # never hide the run's own error behind a second one


FAILED = "FAILED"


def fault_line(e: BaseException) -> Optional[str]:
    """One line for a machine fault anywhere in ``e``'s chain (issue 50 item 2), None for anything else:

    - no space left (ENOSPC, EDQUOT): the path and "free space or set out_root=";
    - an output folder that cannot be written (EACCES, EPERM, EROFS, ENOTDIR): the path and the fix;
    - out of memory (torch's allocator, ``MemoryError``): the size asked for where torch says it, and what to
      lower.
    """
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return (f"no space left on the device holding {cur.filename or 'the run directory'}; free space or "
                    "set out_root= to another disk (the last good last.pt and checkpoint.pt are kept)")
        if isinstance(cur, OSError) and cur.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
            return (f"cannot write {cur.filename or 'the output folder'} ({os.strerror(cur.errno)}); set out_root= "
                    "to a folder you can write")
        text = str(cur)
        if isinstance(cur, MemoryError) or "out of memory" in text.lower() or "can't allocate memory" in text:
            size = re.search(r"allocate (\d+) bytes", text) or re.search(r"allocate ([\d.]+ [KMGT]iB)", text)
            what = (f"{int(size.group(1)) / 2**30:.1f} GiB" if size and size.group(1).isdigit()
                    else size.group(1) if size else "more memory than is free")
            return (f"out of memory: a step asked for {what}; lower trainer.batch_size, eval.batch_size, "
                    "model.max_len or model.d_model, or use a machine with more memory")
        cur = cur.__cause__ or cur.__context__
    return None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: its message is the one line the console prints (``resume_hint``). A
    ``KeyboardInterrupt``, so that nothing catching ``Exception`` (Hydra's job runner, which would go on to the
    next cell of a sweep; Optuna) takes it for a failed run."""


class FinishedInterrupted(Interrupted):
    """A Ctrl-C recorded after a run's last training step (swallowed during test scoring): the run finished and
    wrote ``metrics.json`` (``.metrics``), and then stops its caller (a sweep stops; ``bftrec-tune`` keeps the
    trial and stops the study)."""

    def __init__(self, message: str, metrics: dict):
        super().__init__(message)
        self.metrics = metrics


def resume_hint(out_dir: Path, grid: bool = False) -> str:
    """What to do after an interrupt: the exact resume command when an epoch was saved (``last.pt``); for a grid
    cell (``skip_finished``), rerunning the grid's command, which resumes the cell in place."""
    if (Path(out_dir) / "last.pt").exists():
        if grid:
            return (f"interrupted; rerun the same command to continue {out_dir} in place (a grid resumes its "
                    "unfinished cells from last.pt and skips its finished ones)")
        return f"interrupted; continue it with: bftrec-train trainer.resume={out_dir}"
    return f"interrupted before the first epoch was saved ({out_dir}); rerun the same command to start again"


@contextmanager
def run_lock(out_dir: Path, grid: bool):
    """An exclusive OS lock on the run directory while it runs (``bftrec.grid.cell_lock``), for every
    run, not only grid cells: two processes given one directory can never mix their files."""
    entered = False
    try:
        with cell_lock(out_dir):
            entered = True
            yield
    except ConfigError as e:
        if entered:  # the run's own error, not the lock's
            raise
        if grid:
            raise NotThisRun(str(e)) from None
        raise NotThisRun(f"{out_dir} is being written by another live run; give this run another directory "
                         "(the default run directory is unique; or choose another out_root)") from None


def stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


_RESERVED: list[list[Path]] = []  # per fresh_dir call: the directories it created, deepest first


def fresh_dir(base: Path) -> Path:
    """Create ``base`` exclusively, or ``base_2``, ``base_3``, ... if another run took it (two runs
    started in the same second); returns the directory made. Never reuses an existing directory.

    The directory is reserved when ``hydra.run.dir`` is resolved, and OmegaConf also resolves it
    while merging a config that overrides it (a grid's ``hydra.run.dir``, a composed experiment), so
    a reservation no run used would stay behind as empty folders: they are removed at exit if still
    empty (``_release_unused``; never a folder holding any file).
    """
    base = base.absolute()  # the exit hook must find it after a chdir
    created = [p for p in [base.parent, *base.parent.parents] if not p.exists()]
    for i in range(1, 10_000):
        path = base if i == 1 else base.with_name(f"{base.name}_{i}")
        try:
            base.parent.mkdir(parents=True, exist_ok=True)  # again on each try: another process's exit
            path.mkdir()                                    # hook may just have removed an empty parent
            _RESERVED.append([path, *created])
            return path
        except FileExistsError:
            continue
        except FileNotFoundError:  # the parent went between the two mkdirs: try again (next name)
            continue
    raise ConfigError(f"{base}: 10,000 run directories of that name exist; choose another out_root")


@atexit.register
def _release_unused() -> None:
    """Remove the run directories this process reserved but no run wrote to, and the parents it
    created for them, while they are empty (``os.rmdir`` refuses a non-empty folder)."""
    for dirs in reversed(_RESERVED):  # the latest first: it may sit inside folders an earlier one created
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                break  # not empty (a run's files, or another reservation): keep it and its parents
    _RESERVED.clear()


def _run_dir_resolver(out_root, dataset, model, layer, seed, resume) -> str:
    """``hydra.run.dir`` of ``configs/train.yaml``: a fresh directory (``fresh_dir``) named after the
    run; with ``trainer.resume`` after the resumed run's dataset, model, layer and seed."""
    if resume:
        try:
            saved = yaml.safe_load((Path(str(resume)) / "config.yaml").read_text()) or {}
            dataset, model, layer = (saved[k]["name"] for k in ("dataset", "model", "layer"))
            seed = saved.get("seed", seed)
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            pass  # run() names the problem in one line
    return str(fresh_dir(Path(str(out_root)) / str(dataset) / str(model) / str(layer) / f"seed{seed}_{stamp()}"))


OmegaConf.register_new_resolver("bftrec_run_dir", _run_dir_resolver, use_cache=True, replace=True)


def task_overrides(cfg: DictConfig) -> Optional[list[str]]:
    """The command-line overrides of this job (Hydra's ``overrides.task``), or None when ``cfg`` was
    composed without Hydra's record of them."""
    from hydra.core.hydra_config import HydraConfig

    if "hydra" in cfg:
        return list(OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or [])
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    return None


def without_hydra(cfg: DictConfig) -> DictConfig:
    if "hydra" not in cfg:
        return cfg
    cfg = cfg.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


RESUME_FIXED = ("dataset", "model", "layer", "seed")  # what a resumed run takes from its run directory


def override_key(item: str) -> str:
    """The key of a command-line override: ``+trainer.epochs=5`` -> ``trainer.epochs``, ``~tag`` -> ``tag``."""
    return item.lstrip("+~").split("=", 1)[0]


def resume_config(cfg: DictConfig, overrides: Optional[list[str]]) -> DictConfig:
    """The config of ``trainer.resume=<run_dir>``: ``<run_dir>/config.yaml`` with the command line's
    overrides on top (e.g. ``trainer.epochs=50``, ``data_root``), whatever the defaults are: a run trained with
    ``trainer.lr=0.01`` on the default dataset, model, layer and seed resumes with lr 0.01, not the default.

    Args:
        cfg: the composed config; overrides: ``task_overrides(cfg)`` (None: ``cfg`` is taken as it
            is, and must then agree with the run on dataset, model, layer and seed).
    Raises:
        ConfigError: no readable config.yaml in ``run_dir``; an override (or ``cfg``) that would change
            the run's dataset, model, layer or seed, a group choice (``trainer=default``, ``+tau_variant=lr10``)
            that would replace part of its recipe, or a deletion (``~trainer.patience``) (one line naming it).
    """
    run_dir = Path(cfg.trainer.resume)
    path = run_dir / "config.yaml"
    if not path.exists():
        raise ConfigError(f"trainer.resume={run_dir}: no config.yaml there; point it at a run directory "
                          "written by bftrec-train")
    try:
        saved = load_run_config(run_dir)  # a v1 layer config reads as units=h
        assert all(isinstance(saved.get(k), DictConfig) for k in ("dataset", "model", "layer"))
    except Exception as e:  # yaml and omegaconf raise several types on a torn or foreign file
        raise ConfigError(f"{path} is not a readable run config ({str(e).splitlines()[0] if str(e) else 'no groups'}); "
                          "resume from another run directory or start a new run") from None
    mine, theirs = OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(saved, resolve=True)
    differs = [k for k in RESUME_FIXED if mine.get(k) != theirs.get(k)]
    what = ", ".join(f"{k}={saved[k].name if k != 'seed' else saved[k]}" for k in RESUME_FIXED)
    if overrides is None:  # a config composed by the caller: taken as it is, if it is the run's
        if differs:
            raise ConfigError(f"trainer.resume={run_dir} continues a run of {what}, but the config differs at "
                              f"{', '.join(differs)}; compose it with the run's dataset, model, layer and seed")
        return cfg
    for item in overrides:  # the command line: the run's recipe, with only what the command line changes
        key = override_key(item)
        if item.startswith("~"):  # a deletion has nothing to put in the saved config (it would read None)
            raise ConfigError(f"trainer.resume={run_dir}: the deletion {item!r} cannot be applied to a run's saved "
                              f"config; set {key}=<value> instead, or start a new run without trainer.resume")
        head = key.split(".")[0].split("@")[0]
        same = head in RESUME_FIXED and OmegaConf.select(cfg, key) == OmegaConf.select(saved, key)
        if (head in RESUME_FIXED and not same) or head in ("debug", "experiment", "tuned"):
            raise ConfigError(f"trainer.resume={run_dir} continues a run of {what} with the settings in its "
                              f"config.yaml; drop the override {item!r} (or start a new run without trainer.resume)")
        if "." not in key and (key not in cfg or key in ("trainer", "eval")):  # +tau_variant=lr10, trainer=default
            fix = (f"set the {key}.* keys you mean to change (e.g. trainer.lr=...)" if key in ("trainer", "eval")
                   else "start a new run without trainer.resume")
            raise ConfigError(f"trainer.resume={run_dir}: the group override {item!r} cannot be applied to a run's "
                              f"saved config (a whole group would replace part of the run's recipe); {fix}")
    out = saved.copy()
    with open_dict(out):
        for key in ("data_root", "cache_dir", "out_root", "log_level", "print_config", "trainer.resume"):
            if OmegaConf.select(cfg, key) is not None or key in ("trainer.resume",):
                OmegaConf.update(out, key, OmegaConf.select(cfg, key), force_add=True)
        for item in overrides:
            key = override_key(item)
            if "." in key or key in cfg:
                OmegaConf.update(out, key, OmegaConf.select(cfg, key), force_add=True)
    log.info("resuming %s: dataset, model, layer, seed and the recipe from its config.yaml", run_dir)
    return out


def one_line(e: BaseException) -> str:
    return e.args[0] if isinstance(e, KeyError) and e.args else str(e)
