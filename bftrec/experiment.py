"""One experiment, as a plain function: ``run(cfg, out_dir)`` validates the config, loads the data, builds the
backbone with its layer, trains to early stopping (``bftrec.trainer.fit``), scores the test split once at the
best checkpoint and writes ``metrics.json``, ``ranks.csv.gz``, ``history.csv``, ``checkpoint.pt``, ``env.json``,
``summary.md`` and ``config.yaml`` into ``out_dir``. ``bftrec-train`` (``bftrec.train``) is the Hydra entry
point around it; tests and notebooks call ``run`` directly.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import subprocess
import sys
import time
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

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
    validate_root,
)
from bftrec.data.config import DatasetConfig
from bftrec.data.datasets import identity_of_stats, load_dataset, other_data, raw_sha256
from bftrec.evaluation import check_candidates, check_eval_config, check_n_bins, gather_topk, rank_users
from bftrec.grid import atomic, check_tuned, prepare_cell
from bftrec.layers import LAYER_CONFIGS
from bftrec.mechanism import aggregate_mechanism
from bftrec.metrics import cold_threshold, stratify
from bftrec.models import MODELS, DataInfo
from bftrec.rundir import (
    FAILED,
    FinishedInterrupted,
    Interrupted,
    NotThisRun,
    fault_line,
    fresh_dir,
    mark_failed,
    override_key,
    resume_config,
    resume_hint,
    run_lock,
    stamp,
    task_overrides,
    without_hydra,
)
from bftrec.summary import summary_markdown
from bftrec.trainer import (
    check_trainer_config,
    check_windows_model,
    clear_interrupt,
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


def code_stamp() -> dict:
    """``git_sha`` (10 hex digits, "" outside git) and ``git_dirty`` of ``CODE_STATE``: the code a bench measured."""
    return {"git_sha": CODE_STATE["git_sha"][:10], "git_dirty": CODE_STATE["git_dirty"]}


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


def run(cfg: DictConfig, out_dir: Optional[Path] = None, report: Optional[dict] = None,
        on_validate=None) -> dict:
    """Train and evaluate one configuration; return the metrics dict (also written to metrics.json).

    Args:
        cfg: the composed config (``configs/train.yaml``). With ``trainer.resume=<run_dir>`` the
            dataset, model, layer and seed (and every other key the command line does not override)
            come from ``<run_dir>/config.yaml`` (``resume_config``).
        out_dir: run directory; default a fresh ``<out_root>/<dataset>/<model>/<layer>/seed<k>_<time>``
            (created exclusively: ``_2``, ``_3``, ... on a collision).
        report: if given, receives ``status`` (ran, resumed or skipped; see ``bftrec.grid``) once the
            run has finished.
        on_validate: ``(epoch, score)`` called after each validation (``bftrec-tune``'s pruning; it may raise
            to stop the run, which then ends as a failed run with that reason).
    Raises:
        ConfigError: an unknown key or impossible setting (checked before any data is read or any
            file written); a directory held by another live job; with ``skip_finished``, a directory
            of another config (one line). A failed run leaves ``FAILED`` (its one-line reason) in its
            directory and no ``metrics.json``.
        Interrupted: Ctrl-C (the resume command; a grid cell: rerun the grid); ``FinishedInterrupted`` (carrying
            the metrics) after a finished run, for a Ctrl-C swallowed where no training step followed it (test
            scoring): ``metrics.json`` is written, and the caller stops (a sweep; bftrec-tune keeps the trial).
    """
    started = time.time()
    overrides = task_overrides(cfg)
    choices = _hydra_choices()
    cfg = without_hydra(cfg)
    try:
        if cfg.trainer.get("resume"):
            cfg = resume_config(cfg, overrides)
        else:
            check_dataset_name(cfg, choices, overrides)
        g = check_config(cfg)
        root, ds, mc, lc, tc = g["root"], g["dataset"], g["model"], g["layer"], g["trainer"]
    except BaseException as e:
        if out_dir is not None:  # the CLI's run dir exists already (Hydra's .hydra/ and train.log)
            mark_failed(Path(out_dir), e)
        raise
    if out_dir is None:
        out_dir = fresh_dir(Path(root.out_root) / ds.name / mc.name / lc.name / f"seed{root.seed}_{stamp()}")
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
                metrics = train_and_test(g, out_dir, device, resolved, started, on_validate)
    except KeyboardInterrupt as e:  # issue 50: one line with the resume command, not a traceback
        hint = resume_hint(out_dir, grid=bool(root.skip_finished))
        mark_failed(out_dir, e, hint)
        raise Interrupted(hint) from None
    except BaseException as e:
        fault = fault_line(e)
        if fault:  # a full disk, an unwritable folder, out of memory: one line, FAILED holds it
            mark_failed(out_dir, ConfigError(fault))
            raise ConfigError(fault) from None
        mark_failed(out_dir, e)
        raise
    finally:  # a Ctrl-C recorded where no training step followed (test scoring) ends with its run, not the next
        late = clear_interrupt()
    if report is not None:
        report["status"] = status  # only once the cell is done: a crash stays "failed"
    if late:  # finished, but the user asked to stop: a sweep stops after this cell instead of going on
        raise FinishedInterrupted(f"interrupted after {out_dir} finished (the Ctrl-C came after its last training "
                                  "step; its metrics.json is written); in a grid, rerun the same command to go on "
                                  "(finished cells are skipped)", metrics)
    return metrics


def check_config(cfg: DictConfig) -> dict:
    """Every check that needs no data: the typed groups (``typed_groups``), the seed, the trainer, the training
    windows against the backbone, the model and layer, the tuned file; returns the typed groups.

    Raises:
        ConfigError: the first problem, in one line.
    """
    g = typed_groups(cfg)
    root, ds, mc, lc, tc, ev = g["root"], g["dataset"], g["model"], g["layer"], g["trainer"], g["eval"]
    if not 0 <= root.seed <= SEED_MAX:  # numpy would fail later, after the run directory exists
        raise ConfigError(f"seed={root.seed} must be an integer in [0, {SEED_MAX}]; e.g. seed=0")
    check_trainer_config(tc, ev, mc.max_len)  # before any data is read, any file written or any epoch spent
    check_windows_model(tc.train_windows, MODELS.get(mc.name))
    check_model_config(mc, lc)
    check_tuned(root.tuned_config, ds.name, mc.name, root.require_tuned)
    return g


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


def check_model_config(mc, lc) -> None:
    """The backbone's shared checks and the BFT layer's, before any data is read: one-line ConfigError.
    (Checks that need the data, such as ``n_negatives`` < the number of items, run when it is built.)"""
    from bftrec.layers.bft import BFTLayerConfig, check_bft_config
    from bftrec.models.base import check_common, check_standard_layer_only

    check_common(mc, sys.maxsize)
    if getattr(MODELS.get(mc.name), "standard_layer_only", False):  # pop, markov, gru4rec: no Transformer layers
        check_standard_layer_only(mc.name, lc)
    if isinstance(lc, BFTLayerConfig):
        check_bft_config(lc)


def train_and_test(g: dict, out_dir: Path, device: torch.device, resolved: dict, started: float,
                   on_validate=None) -> dict:
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
                 extra_state={"config": resolved}, on_validate=on_validate)
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
               "fast_paths": {"fused_optimizer": tc.fused_optimizer, "dropout": tc.dropout,
                              "last_position_only": tc.last_position_only,
                              "compile_precision": tc.compile_precision},
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


def device_name(device: torch.device) -> str:
    """Human name of a device: the GPU's model, or the CPU's model and core count."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


SEED_MAX = 2**32 - 1  # numpy's and torch's seeding accept 0 .. 2**32 - 1
