"""Entry point ``bftrec-train``: a thin ``@hydra.main`` around the plain function ``run(cfg, out_dir)``.

``run`` validates every config group against its dataclass, loads the dataset, builds the backbone
(with ``layer=standard`` or ``layer=bft``), trains to early stopping, scores the test split once at the
best checkpoint and writes ``metrics.json``, ``ranks.csv.gz``, ``history.csv``, ``checkpoint.pt``,
``env.json`` and ``config.yaml`` into ``out_dir``.
"""
from __future__ import annotations

import atexit
import dataclasses
import errno
import json
import logging
import os
import platform
import re
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Optional

import hydra
import numpy as np
import torch
import yaml
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from bftrec.beyond import beyond_accuracy
from bftrec.config import (
    ConfigError,
    EvalConfig,
    RunConfig,
    TrainerConfig,
    check_ks,
    load_run_config,
    merge_schema,
    schema_defaults,
    unknown_key,
    validate_root,
)
from bftrec.data.config import DatasetConfig
from bftrec.data.datasets import identity_of_stats, load_dataset, other_data, raw_sha256
from bftrec.evaluation import check_candidates, check_eval_config, check_n_bins, gather_topk, rank_users
from bftrec.grid import append_ledger, atomic, cell_lock, check_tuned, prepare_cell
from bftrec.layers import LAYER_CONFIGS
from bftrec.mechanism import aggregate_mechanism
from bftrec.metrics import cold_threshold, stratify
from bftrec.models import MODELS, DataInfo
from bftrec.summary import summary_markdown
from bftrec.trainer import (
    check_trainer_config,
    check_windows_model,
    fit,
    is_main,
    load_checkpoint,
    load_weights,
    mean_gain,
    resolve_device,
    seed_everything,
    train_windows_block,
    world_size,
)

log = logging.getLogger("bftrec")
# The Hydra config tree: package data ``bftrec/configs`` (in the checkout a link to the top-level configs/),
# found as ``pkg://bftrec.configs`` in an editable install, a wheel and a PYTHONPATH checkout alike.
CONFIG_PKG = "bftrec.configs"
CONFIG_DIR = str(Path(__file__).resolve().parent / "configs")


def typed_groups(cfg: DictConfig) -> dict:
    """Merge every group into its dataclass; raises ConfigError naming any unknown key."""
    root = validate_root(cfg)
    model_name = cfg.model.get("name")
    layer_name = cfg.layer.get("name")
    model_cls = MODELS.get(model_name) if model_name in MODELS else None
    if model_cls is None:
        raise ConfigError(f"unknown model {model_name!r}; choose one of {', '.join(MODELS.names())}")
    if layer_name not in LAYER_CONFIGS:
        raise ConfigError(f"unknown layer {layer_name!r}; choose one of {', '.join(sorted(LAYER_CONFIGS))}")
    ev = merge_schema(EvalConfig, cfg.eval, "eval")
    check_ks(ev.ks)  # before trainer.select_metric is matched against them
    return {
        "root": root,
        "dataset": merge_schema(DatasetConfig, cfg.dataset, "dataset"),
        "model": merge_schema(model_cls.Config, cfg.model, "model"),
        "model_cls": model_cls,
        "layer": merge_schema(LAYER_CONFIGS[layer_name], cfg.layer, "layer"),
        "trainer": merge_schema(TrainerConfig, cfg.trainer, "trainer"),
        "eval": ev,
    }


def run_schema_defaults(model_schema: type, layer_schema: type) -> dict:
    """{dotted key: schema default} of a run's typed groups (``bftrec.config.schema_defaults``): the
    value a key had in a run stored before the key existed (``bftrec.grid.config_diff``,
    ``bftrec-report tables``)."""
    return schema_defaults({"": RunConfig, "dataset": DatasetConfig, "model": model_schema, "layer": layer_schema,
                            "trainer": TrainerConfig, "eval": EvalConfig})


def protocol_block(ev: EvalConfig, repeat_share: float, select_metric: str) -> dict:
    """The protocol every metrics.json states (DESIGN.md "Data protocol", "Evaluation protocol")."""
    return {
        "split": "leave-one-out: last item test, second-to-last validation, rest training",
        "candidates": "all items (full ranking)" if ev.protocol == "full"
        else f"target + {ev.n_negatives} sampled negatives ({ev.sampled_kind}, seed {ev.sample_seed})",
        "exclude_history": ev.exclude_history,
        "exclude_scope": ev.exclude_scope if ev.exclude_history else None,
        "repeat_target": ev.repeat_target,
        "repeat_target_share": repeat_share,
        "ties": "pessimistic: rank = 1 + #{other candidates with score >= target score}",
        "epoch_selection": f"best validation {select_metric}; test scored once at that checkpoint",
        "item_frequency": "training interactions only",
    }


def git(*args: str) -> str:
    """Output of a git command run in the package's checkout ('' when git or the checkout is absent)."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# The checkout as this process imported it (not as it is when a long run ends): commit, and whether
# tracked files differed from it. Untracked files and results/ (a grid's own ledger.jsonl is tracked
# and grows while the grid runs) do not count: dirty means the code or configs differed.
CODE_STATE = {"git_sha": git("rev-parse", "HEAD"),
              "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                    ":(top,exclude)results"))}


def env_info(device: torch.device, started: float) -> dict:
    return {
        **CODE_STATE,
        "python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
        "platform": platform.platform(), "device": str(device),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(), "started": datetime.fromtimestamp(started).isoformat(),
        "wall_seconds": round(time.time() - started, 2), "argv": sys.argv,
    }


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        return f"{names[0]} x{len(names)}" if names else platform.processor()
    except OSError:
        return platform.processor()


def build(g: dict, device: torch.device) -> tuple:
    """Load the dataset and build the backbone from typed groups; returns (data, train_counts, model)."""
    root, ds = g["root"], g["dataset"]
    if ds.inject_rate and ds.inject_seed is None:  # injected data: seed s of every layer sees the same draw
        ds = dataclasses.replace(ds, inject_seed=root.seed)
    data = load_dataset(ds, data_root=root.data_root, cache_dir=root.cache_dir)
    counts = data.train_counts()
    info = DataInfo(n_items=data.n_items, train_counts=counts, has_timestamps=data.timestamps is not None)
    return data, counts, g["model_cls"](g["model"], g["layer"], info).to(device)


def run(cfg: DictConfig, out_dir: Optional[Path] = None, report: Optional[dict] = None) -> dict:
    """Train and evaluate one configuration; return the metrics dict (also written to metrics.json).

    Args:
        cfg: the composed config (``configs/train.yaml``). With ``trainer.resume=<run_dir>`` the
            dataset, model, layer and seed (and every other key the command line does not override)
            come from ``<run_dir>/config.yaml`` (``resume_config``).
        out_dir: run directory; default a fresh ``<out_root>/<dataset>/<model>/<layer>/seed<k>_<time>``
            (created exclusively: ``_2``, ``_3``, ... on a collision).
        report: if given, receives ``status`` (ran, resumed or skipped; see ``bftrec.grid``) once the
            run has finished.
    Raises:
        ConfigError: an unknown key or impossible setting (checked before any data is read or any
            file written); a directory held by another live job; with ``skip_finished``, a directory
            of another config (one line). A failed run leaves ``FAILED`` (its one-line reason) in its
            directory and no ``metrics.json``.
    """
    started = time.time()
    overrides = task_overrides(cfg)
    choices = _hydra_choices()
    cfg = _without_hydra(cfg)
    try:
        if cfg.trainer.get("resume"):
            cfg = resume_config(cfg, overrides)
        else:
            check_dataset_name(cfg, choices, overrides)
        g = typed_groups(cfg)
        root, ds, mc, lc, tc, ev = g["root"], g["dataset"], g["model"], g["layer"], g["trainer"], g["eval"]
        if not 0 <= root.seed <= SEED_MAX:  # numpy would fail later, after the run directory exists
            raise ConfigError(f"seed={root.seed} must be an integer in [0, {SEED_MAX}]; e.g. seed=0")
        check_trainer_config(tc, ev, mc.max_len)  # before any data is read, any file written or any epoch spent
        check_windows_model(tc.train_windows, MODELS.get(mc.name))
        check_model_config(mc, lc)
        check_tuned(root.tuned_config, ds.name, mc.name, root.require_tuned)
    except BaseException as e:
        if out_dir is not None:  # the CLI's run dir exists already (Hydra's .hydra/ and train.log)
            mark_failed(Path(out_dir), e)
        raise
    if out_dir is None:
        out_dir = fresh_dir(Path(root.out_root) / ds.name / mc.name / lc.name / f"seed{root.seed}_{_stamp()}")
    out_dir = Path(out_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    try:
        device = resolve_device(tc.device)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # launched by torchrun: one process per device
            device, out_dir = init_distributed(device, Path(out_dir))
        with run_lock(out_dir, root.skip_finished) if is_main() else nullcontext():
            try:
                status, stored = prepare_cell(out_dir, resolved, root.skip_finished,
                                              defaults=run_schema_defaults(g["model_cls"].Config, type(lc)))
            except ConfigError as e:
                raise NotThisRun(str(e)) from None
            if status == "skipped":  # issue 50: a finished cell of the same config, but was it on this data?
                recorded = {"sha256": identity_of_stats(stored.get("data"))["sha256"]}  # the raw file: cheap to hash
                differs = other_data(recorded, {"sha256": raw_sha256(ds, root.data_root)})
                if differs:
                    raise NotThisRun(f"{out_dir} holds a finished run on other data ({differs}); point "
                                     "BFTREC_DATA_ROOT at the data it used, or move that run away to rerun it")
                metrics = stored
            else:
                if status == "resumed" and not tc.resume:
                    tc.resume = str(out_dir)
                check_resumed_layer(tc.resume, g["layer"])
                if is_main():
                    out_dir.mkdir(parents=True, exist_ok=True)
                    OmegaConf.save(cfg, out_dir / "config.yaml", resolve=True)
                    if root.print_config:
                        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=True))
                    log.info("run directory %s (composed config in config.yaml)", out_dir)
                metrics = train_and_test(g, out_dir, device, resolved, started)
    except KeyboardInterrupt as e:  # issue 50: one line with the resume command, not a traceback
        mark_failed(out_dir, e)
        raise Interrupted(resume_hint(out_dir)) from None
    except BaseException as e:
        fault = fault_line(e)
        if fault:  # a full disk, an unwritable folder, out of memory: one line, FAILED holds it
            mark_failed(out_dir, ConfigError(fault))
            raise ConfigError(fault) from None
        mark_failed(out_dir, e)
        raise
    if report is not None:
        report["status"] = status  # only once the cell is done: a crash stays "failed"
    return metrics


def _hydra_choices() -> dict:
    """Hydra's group choices of this job (``dataset`` -> ``sports``, ...); empty outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig

    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}


def check_dataset_name(cfg: DictConfig, choices: dict, overrides: Optional[list[str]]) -> None:
    """``dataset.name`` equals the stem of the dataset file Hydra chose (``dataset=mysports`` must say
    ``name: mysports``): the name picks ``configs/tuned/<name>_<model>.yaml``'s check, the run folders and
    the table rows, so a copied file that kept its original's name would pass as the original. (Model and
    layer names are registry keys: a copy keeps the built-in name on purpose.) Raises a one-line
    ConfigError naming the file, or the command-line override, and the fix."""
    choice, name = choices.get("dataset"), OmegaConf.select(cfg, "dataset.name")
    stem = str(choice).rsplit("/", 1)[-1] if choice else None
    if stem is None or name is None or str(name) == stem:
        return
    given = [o for o in overrides or [] if override_key(o) == "dataset.name"]
    if given:
        raise ConfigError(f"{given[-1]} renames dataset={choice}; drop it, or add dataset/{name}.yaml "
                          f"(with name: {name}) and select dataset={name}")
    raise ConfigError(f"dataset={choice}: its file says name: {name}; set name: {stem} in dataset/{choice}.yaml "
                      "(the name selects the tuned config, the run folders and the table rows)")


def check_resumed_layer(resume: Optional[str], layer_cfg) -> None:
    """With ``trainer.resume``: the run resumed from was trained with the same layer config (a run written
    before ``bft.units`` existed counts as ``units=h``, ``upgrade_legacy_layer``), else a one-line ConfigError."""
    if not resume or not (Path(resume) / "config.yaml").exists():
        return
    stored = load_run_config(Path(resume)).get("layer")
    if stored is None or stored.get("name") not in LAYER_CONFIGS:
        return
    saved = OmegaConf.to_container(OmegaConf.structured(merge_schema(LAYER_CONFIGS[stored.get("name")], stored,
                                                                         "layer")))
    now = OmegaConf.to_container(OmegaConf.structured(layer_cfg))
    saved.pop("name"), now.pop("name")  # bft with units=h and bft_h compute the same layer
    if saved != now:
        raise ConfigError(f"trainer.resume={resume} was trained with layer settings {saved}, not {now}; resume "
                          "with the same settings (a v1 run: layer=bft_h) or start a new run")


class NotThisRun(ConfigError):
    """The run directory belongs to another run (a live job, a finished run, another config): it is
    left exactly as it is, never marked ``FAILED``."""


def mark_failed(out_dir: Path, e: BaseException) -> None:
    """Write ``out_dir/FAILED`` with the one-line reason, so that a half-written directory is never
    taken for a run (readers look for ``metrics.json``; ``FAILED`` says why there is none)."""
    if isinstance(e, NotThisRun) or not is_main() or not out_dir.is_dir() or (out_dir / "metrics.json").exists():
        return
    if isinstance(e, KeyboardInterrupt):
        reason = resume_hint(out_dir)
    else:
        reason = " ".join(one_line(e).split()) or type(e).__name__
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


class Interrupted(Exception):
    """Ctrl-C during a run: its message is the one line the console prints (``resume_hint``)."""


def resume_hint(out_dir: Path) -> str:
    """What to do after an interrupt: the exact resume command when an epoch was saved (``last.pt``)."""
    if (Path(out_dir) / "last.pt").exists():
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


def _stamp() -> str:
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
    return str(fresh_dir(Path(str(out_root)) / str(dataset) / str(model) / str(layer) / f"seed{seed}_{_stamp()}"))


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


def _without_hydra(cfg: DictConfig) -> DictConfig:
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
    overrides on top (e.g. ``trainer.epochs=50``, ``data_root``).

    Args:
        cfg: the composed config; overrides: ``task_overrides(cfg)`` (None: ``cfg`` is taken as it
            is, and must then agree with the run on dataset, model, layer and seed).
    Raises:
        ConfigError: no readable config.yaml in ``run_dir``; an override (or ``cfg``) that would change
            the run's dataset, model, layer or seed (one line naming it).
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
    if not differs:
        return cfg
    what = ", ".join(f"{k}={saved[k].name if k != 'seed' else saved[k]}" for k in RESUME_FIXED)
    for item in overrides or []:
        head = override_key(item).split(".")[0].split("@")[0]
        if head in RESUME_FIXED or head in ("debug", "experiment", "tuned"):
            raise ConfigError(f"trainer.resume={run_dir} continues a run of {what}; drop the override {item!r} "
                              "(or start a new run without trainer.resume)")
    if overrides is None:
        raise ConfigError(f"trainer.resume={run_dir} continues a run of {what}, but the config differs at "
                          f"{', '.join(differs)}; compose it with the run's dataset, model, layer and seed")
    out = saved.copy()
    with open_dict(out):
        for key in ("data_root", "cache_dir", "out_root", "log_level", "print_config", "trainer.resume"):
            if OmegaConf.select(cfg, key) is not None or key in ("trainer.resume",):
                OmegaConf.update(out, key, OmegaConf.select(cfg, key), force_add=True)
        for item in overrides:
            key = override_key(item)
            if key in ("trainer", "eval"):  # a group choice: that whole group
                out[key] = cfg[key]
            elif "." in key or key in cfg:
                OmegaConf.update(out, key, OmegaConf.select(cfg, key), force_add=True)
    log.info("resuming %s: dataset, model, layer, seed and the recipe from its config.yaml", run_dir)
    return out


def check_model_config(mc, lc) -> None:
    """The backbone's shared checks and the BFT layer's, before any data is read: one-line ConfigError.
    (Checks that need the data, such as ``n_negatives`` < the number of items, run when it is built.)"""
    from bftrec.layers.bft import BFTLayerConfig, check_bft_config
    from bftrec.models.base import check_common

    check_common(mc, sys.maxsize)
    if isinstance(lc, BFTLayerConfig):
        check_bft_config(lc)


def train_and_test(g: dict, out_dir: Path, device: torch.device, resolved: dict, started: float) -> dict:
    """The body of ``run``: build, fit to early stopping, score the test split at the best checkpoint."""
    root, ds, mc, lc, tc, ev = g["root"], g["dataset"], g["model"], g["layer"], g["trainer"], g["eval"]
    torch.set_num_threads(tc.num_threads or default_threads())
    seed_everything(root.seed, tc.deterministic)

    data, counts, model = build(g, device)
    check_eval_config(ev, data.n_items)
    check_n_bins(ev, counts)  # before any epoch: a stratum or a K that cannot mean what it says
    for which in ("valid", "test"):
        check_candidates(data.items, data.offsets, which, data.n_items, mc.max_len, ev)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("%s/%s on %s: %d parameters, %d users, %d items, device %s", mc.name, lc.name, ds.name,
             n_params, data.n_users, data.n_items, device)

    result = fit(model, data, tc, ev, out_dir, device, mc.max_len, root.seed,
                 extra_state={"config": resolved})
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # rank 0 has written the best checkpoint
    best = load_checkpoint(out_dir / "checkpoint.pt", device, ("model", "epoch"),
                           "delete the run directory to rerun it")
    if best.get("epoch") != result.best_epoch:
        raise ConfigError(f"{out_dir / 'checkpoint.pt'} holds epoch {best.get('epoch')}, not the best epoch "
                          f"{result.best_epoch} (a job killed between two saves?); delete the run directory "
                          "to rerun it")
    load_weights(model, best, out_dir / "checkpoint.pt", "delete the run directory to rerun it")
    metrics = evaluate_test(model, data, counts, ev, device, mc.max_len, result.tau_start)
    if "mechanism" in metrics and result.initial_gain is not None:
        metrics["mechanism"]["gain_first_batch"] = {
            "tokens": "real tokens of the first trainer.batch_size users' training windows",
            "initial_K_per_layer": result.initial_gain,  # after calibration, before the first step
            "final_K_per_layer": mean_gain(model, result.first_batch)}  # at the best checkpoint
    metrics = {"dataset": ds.name, "model": mc.name, "layer": lc.name, "seed": root.seed, "tag": root.tag,
               "tuned_config": root.tuned_config,
               "protocol": protocol_block(ev, metrics.pop("repeat_target_share"), tc.select_metric),
               "train_windows": train_windows_block(tc, mc.max_len, world_size()),
               "layer_config": OmegaConf.to_container(OmegaConf.structured(lc)), "data": data.stats,
               "n_parameters": n_params,
               "best_epoch": result.best_epoch, "epochs_run": len(result.history),
               "stopped_early": result.stopped_early, "valid": result.best_valid, **metrics}
    if is_main():
        write_outputs(out_dir, metrics, device, started)
    return metrics


def init_distributed(device: torch.device, out_dir: Path) -> tuple[torch.device, Path]:
    """Join the torchrun process group (NCCL on CUDA, else Gloo); every rank uses rank 0's run dir."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    shared = [str(out_dir)]
    torch.distributed.broadcast_object_list(shared, src=0)
    return device, Path(shared[0])


def default_threads() -> int:
    """``trainer.num_threads=0``: 1 thread on a machine with at most 2 usable CPUs (where a second
    thread made ``make run`` 3.7x slower under load: 180 s against 49 s), else min(4, torch's default,
    which is the number of physical cores). More threads than that buy little for these small
    models and oversubscribe a laptop or a shared machine."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if usable <= 2 else max(1, min(4, TORCH_THREADS, usable))


TORCH_THREADS = torch.get_num_threads()  # torch's own default, before any run sets it


def evaluate_test(model, data, counts: np.ndarray, ev: EvalConfig, device: torch.device, max_len: int,
                  tau_start: Optional[torch.Tensor] = None) -> dict:
    """Score the test split once; return test metrics, strata, mechanism and the rank table.

    ``tau_start`` ((n_tokens,) float32, BFT's τ after calibration) adds each stratum's starting λ⁰."""
    sink: Optional[list] = [] if ev.mechanism else None
    tops: Optional[list] = [] if ev.protocol == "full" else None  # the recommended lists: beyond-accuracy
    table = rank_users(model, data.items, data.offsets, data.timestamps, "test", data.n_items, max_len,
                       counts, ev, device, mech_sink=sink, topk_sink=tops, topk=max(ev.ks))
    thr = ev.cold_user_max_history
    if thr is None:
        thr = cold_threshold(table["history_len"].to_numpy(), ev.cold_share)
    test = stratify(table, counts, n_bins=ev.n_bins, bin_mode=ev.bin_mode, cold_max_history=thr,
                    ks=tuple(ev.ks))
    out = {"test": test, "ranks": table, "repeat_target_share": _repeat_share(data, table)}
    if tops is not None:
        users, lists = gather_topk(tops)
        k = 10 if 10 in ev.ks else min(ev.ks)
        out["beyond_accuracy"] = beyond_accuracy(users, lists, table, test, counts, data.n_items, k)
    if sink is not None:  # every process takes part: the statistics are gathered over all of them
        hist = np.zeros(data.n_users, dtype=np.int64)
        hist[table["user"].to_numpy()] = table["history_len"].to_numpy()
        tgt = np.zeros(data.n_users, dtype=np.int64)  # (U,) training count of each user's test target
        tgt[table["user"].to_numpy()] = table["target_count"].to_numpy()
        mech = aggregate_mechanism(sink, counts, test["by_item_freq"], hist, thr, tau_start, target_count=tgt)
        if mech is not None:
            out["mechanism"] = mech
    return out


def _repeat_share(data, table) -> float:
    """Share of test users whose target already occurs in their history."""
    from bftrec.data.batches import history_pairs, loo_split

    split = loo_split(data.items, data.offsets, "test")
    rows, cols = history_pairs(data.items, split.start, split.end)
    return float(len(np.unique(rows[cols == split.targets[rows]])) / max(len(table), 1))


def write_outputs(out_dir: Path, metrics: dict, device: torch.device, started: float) -> None:
    """Write ranks.csv.gz, env.json, summary.md and, last, metrics.json; log the summary table."""
    table = metrics.pop("ranks")
    with atomic(out_dir / "ranks.csv.gz") as tmp:
        table.to_csv(tmp, index=False, compression="gzip")
    with atomic(out_dir / "env.json") as tmp:
        tmp.write_text(json.dumps(env_info(device, started), indent=2))
    summary = summary_markdown(metrics)
    with atomic(out_dir / "summary.md") as tmp:
        tmp.write_text(summary)
    (out_dir / FAILED).unlink(missing_ok=True)  # a retried cell that succeeds is no longer failed
    with atomic(out_dir / "metrics.json") as tmp:  # last: its presence marks a finished run
        tmp.write_text(json.dumps(metrics, indent=2, sort_keys=False))
    log.info("%s\n-> %s", summary.rstrip(), out_dir)


@hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_PKG}", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    logging.getLogger().setLevel(cfg.get("log_level", "INFO"))
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    if hc.mode != RunMode.MULTIRUN:
        # One grid cell run without -m (a grid config's run dir is its sweep layout): the same ledger line.
        in_grid = cfg.get("skip_finished") and out_dir.resolve().is_relative_to(Path(hc.sweep.dir).resolve())
        with one_line_errors("bftrec-train"):
            if in_grid:
                _grid_cell(cfg, out_dir, hc, single=True)
            else:
                run(cfg, out_dir)
        return
    _grid_cell(cfg, out_dir, hc)


def _grid_cell(cfg: DictConfig, out_dir: Path, hc, single: bool = False) -> None:
    """Run one grid cell and append its ledger line to ``<sweep dir>/ledger.jsonl`` (bftrec.grid), whatever
    the outcome. In a sweep a user error raises ``CellFailed``, so the launcher finishes the other cells and
    Hydra reports it at the end; run alone (``single``) it is re-raised for a one-line error."""
    report: dict = {"status": "failed"}
    started = datetime.now()
    try:
        run(cfg, out_dir, report)
    except USER_ERRORS as e:
        report["error"] = one_line(e)
        if single:
            raise
        log.error("cell failed: %s", report["error"] if str(out_dir) in report["error"]
                  else f"{out_dir}: {report['error']}")
        raise CellFailed(f"{out_dir}: {report['error']}") from None
    except KeyboardInterrupt:
        report["status"] = "interrupted"
        raise
    finally:
        sweep = Path(hc.sweep.dir).resolve()
        cell = out_dir.resolve()
        append_ledger(sweep / "ledger.jsonl", {
            "cell": str(cell.relative_to(sweep)) if cell.is_relative_to(sweep) else str(cell),
            "status": report["status"], "started": started.isoformat(timespec="seconds"),
            "wall_s": round((datetime.now() - started).total_seconds(), 1),
            "device": _ledger_device(cfg.trainer.get("device", "auto")),
            "git_sha": CODE_STATE["git_sha"][:10], "git_dirty": CODE_STATE["git_dirty"],
            "overrides": list(hc.overrides.task), **({"error": report["error"]} if "error" in report else {})})


def device_name(device: torch.device) -> str:
    """Human name of a device: the GPU's model, or the CPU's model and core count."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def _ledger_device(device: str) -> str:
    """``device_name`` of ``trainer.device`` for the grid ledger (the raw value if it does not resolve)."""
    try:
        return device_name(resolve_device(device))
    except (ConfigError, RuntimeError, ValueError):
        return str(device)


@contextmanager
def one_line_errors(prog: str):
    """Turn user-facing errors (bad config, missing file, bad data) into one line on stderr, exit 2."""
    try:
        yield
    except Interrupted as e:  # Ctrl-C: the resume command, and the exit status of an interrupt
        print(f"{prog}: {e}", file=sys.stderr)
        sys.exit(130)
    except USER_ERRORS as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)


USER_ERRORS = (ConfigError, KeyError, FileNotFoundError, ValueError)


class CellFailed(RuntimeError):
    """A grid cell stopped on a user-facing error (its one-line message); the other cells go on."""


def one_line(e: BaseException) -> str:
    return e.args[0] if isinstance(e, KeyError) and e.args else str(e)


def hydra_error_line(e: Exception, argv: Optional[list[str]] = None) -> str:
    """One line for a config mistake Hydra finds while composing, instead of its multi-line report.

    An override of a key the group lacks (``trainer.epoch=3``) names the closest known key; a missing group
    option (``dataset=sportz``) lists the valid names; anything else keeps Hydra's lines joined. With
    ``trainer.resume=`` in ``argv``, an override of a dataset, model or layer key (``layer.bft.q_init_ratio=0.2``)
    fails because the command line composes the default groups, not the run's: the line says that a resumed
    run keeps those settings, instead of a misleading "unknown key".
    """
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = e.__cause__  # an override of a key not in the group: OmegaConf's error, with the group's node
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key and cause.parent_node is not None:
        key = cause.full_key
        resume = [a.lstrip("+") for a in argv or [] if override_key(a) == "trainer.resume" and "=" in a
                  and not a.startswith("~")]
        if resume and resume[-1].split("=", 1)[1] not in ("", "null", "None") and key.split(".")[0] in RESUME_FIXED:
            item = next((a for a in argv if override_key(a) == key or override_key(a).startswith(key + ".")), key)
            return (f"{resume[-1]} keeps the run's dataset, model, layer and seed settings; drop the override "
                    f"{item!r} (or start a new run without trainer.resume)")
        if key in ("layer.bft", "layer.tau") and cause.parent_node.get("name") == "standard":
            return (f"unknown key '{key}': layer=standard has no BFT settings; select layer=bft "
                    "(or layer=bft_h) on the command line to set them")
        return str(unknown_key(key, cause.parent_node.keys()))
    if isinstance(e, MissingConfigException) and e.options is not None and e.missing_cfg_file:
        group, _, name = e.missing_cfg_file.rpartition("/")
        return (f"{group}={name}: no such config; choose one of {', '.join(e.options)} "
                f"(or add {e.missing_cfg_file}.yaml)")
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.startswith("See https://")]
    if isinstance(e, OverrideParseException):
        lines.insert(0, f"cannot parse the override {e.override!r}")
    return ": ".join(lines)


SEED_MAX = 2**32 - 1  # numpy's and torch's seeding accept 0 .. 2**32 - 1


def check_seed_override(argv: list[str]) -> Optional[str]:
    """The one-line error for a ``seed=`` override that is not a plain integer in [0, 2**32): checked before
    Hydra composes anything or creates a run directory, since the directory is named after the seed
    (``seed="07"`` would name it ``seed07`` while the run used 7). A sweep (``seed=0,1,2``) checks each value;
    ``range(...)`` and other sweep functions are left to Hydra. None when every seed is fine."""
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        if key != "seed" or not eq or "(" in value:
            continue
        for v in value.split(","):
            v = v.strip()
            if v.isdigit() and (v == "0" or not v.startswith("0")) and int(v) <= SEED_MAX:
                continue
            plain = v.strip("'\"")
            fix = f"write seed={int(plain)}" if plain.isdigit() and int(plain) <= SEED_MAX else "e.g. seed=0"
            return f"seed={v} is not a plain integer in [0, {SEED_MAX}]; {fix}"
    return None


def main() -> None:
    """Console script ``bftrec-train`` (Hydra over ``pkg://bftrec.configs``; ``--config-dir`` adds a folder).

    Config mistakes end in one line ``bftrec-train: error: ...`` and exit 2, whether ``run`` finds them
    (``one_line_errors``) or Hydra does while composing (``hydra_error_line``). A grid (``-m``) with a failed
    cell exits 2 once the other cells have run: the cell's line is logged when it fails and the ledger
    records it, so Hydra's traceback of the re-raised ``CellFailed`` is left out.
    """
    from hydra.errors import CompactHydraException

    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises instead of printing its report and exiting 1
    bad_seed = check_seed_override(sys.argv[1:])
    if bad_seed:
        print(f"bftrec-train: error: {bad_seed}", file=sys.stderr)
        sys.exit(2)
    try:
        _hydra_main()
    except Interrupted as e:
        print(f"bftrec-train: {e}", file=sys.stderr)
        sys.exit(130)  # the exit status of an interrupt (128 + SIGINT)
    except KeyboardInterrupt:
        print("bftrec-train: interrupted before a run directory held anything to resume", file=sys.stderr)
        sys.exit(130)
    except CellFailed:
        sys.exit(2)
    except CompactHydraException as e:
        print(f"bftrec-train: error: {hydra_error_line(e, sys.argv[1:])}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # a fault while Hydra makes the run directory (a read-only or misspelled out_root)
        fault = fault_line(e)
        if not fault:
            raise
        print(f"bftrec-train: error: {fault}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
