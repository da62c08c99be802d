"""Resumable experiment grids on top of Hydra multirun (no scheduler of our own).

A grid (``configs/experiment/paper/*.yaml``) gives every cell a fixed run directory
``<out_root>/runs/<dataset>/<model>/<layer>/seed<k>`` and sets ``skip_finished=true``. Launching the
grid, or any slice of it (``dataset=office model=sasrec``), then

- skips a cell whose directory holds ``metrics.json`` written with the same config;
- resumes a cell that holds only ``last.pt`` (a run killed mid-training) from its last epoch;
- refuses, in one line, a directory written with a different config: its results are never
  overwritten (Hydra still refreshes the cell's ``.hydra/`` record and appends to ``train.log``);
- refuses a cell that another live job holds (an OS lock, released when a job dies), so two sweep
  jobs mapped to one directory, or overlapping slices, cannot mix their files;
- appends one line per launched cell to ``<sweep dir>/ledger.jsonl``: status (ran, resumed, skipped,
  failed, interrupted), host, device, start, duration, commit and the job's overrides, i.e. which
  slice ran where. A failed cell does not stop the other cells; Hydra reports it at the end.

Hydra itself rejects an unknown dataset, model or layer name before any cell starts and lists the
valid names; ``require_tuned=true`` additionally refuses a cell without ``configs/tuned/<d>_<m>.yaml``.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Optional

import yaml

from bftrec.config import ConfigError, upgrade_legacy_layer

log = logging.getLogger("bftrec")

# Keys that do not change what a cell computes: where files live, logging, threads, progress bars,
# the device and the scoring chunk size (metrics do not depend on it).
# (trainer.device is volatile: a cell may be resumed on other hardware; env.json records each device.)
VOLATILE = {"data_root", "cache_dir", "out_root", "log_level", "skip_finished", "require_tuned",
            "trainer.num_threads", "trainer.progress", "trainer.device", "trainer.resume", "eval.batch_size",
            "print_config", "trainer.divergence_factor"}  # a finished cell did not diverge under any factor
AXES = ("dataset", "model", "layer", "seed")  # the axes of every paper grid


def sweep_axes(path: Path, required: tuple = AXES) -> dict[str, list[str]]:
    """The values each axis of a grid config sweeps (``hydra.sweeper.params``, Hydra's sweep syntax:
    ``a,b``, ``range(0,3)``, ``choice(a,b)``); ``required``: the axes it must sweep (a paper grid:
    dataset, model, layer, seed; a one-setting study may sweep fewer).

    Raises:
        SystemExit: the file is missing or unreadable, misses an axis (dataset, model, layer, seed) or
            holds a sweep Hydra cannot parse (one line, names the file).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    params = _sweep_params(Path(path))
    absent = [k for k in required if k not in params]
    if absent:
        raise SystemExit(f"{path} sweeps no {', '.join(absent)} in hydra.sweeper.params; "
                         "pass a grid config such as configs/experiment/paper/cpu.yaml")
    parser = OverridesParser.create()
    out = {}
    for key, value in params.items():
        try:
            o = parser.parse_overrides([f"{key}={value}"])[0]
        except HydraException as e:
            raise SystemExit(f"{path}: cannot parse the sweep {key}={value} ({str(e).splitlines()[0]})") from None
        out[key] = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
    return out


def _sweep_params(path: Path) -> dict:
    """``hydra.sweeper.params`` of a grid config, over those of an experiment it inherits
    (``defaults: [/experiment/paper/main]``: a grid that changes a few axes of another)."""
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"{path} is not a readable grid config ({str(e).splitlines()[0]}); "
                         "pass one such as configs/experiment/paper/cpu.yaml") from None
    params: dict = {}
    for entry in cfg.get("defaults") or []:
        if isinstance(entry, str) and entry.startswith("/experiment/"):
            root = next((p for p in path.parents if p.name == "experiment"), None)
            if root is None:
                raise SystemExit(f"{path} inherits {entry} but lies outside a configs/experiment/ folder; "
                                 "keep grid configs under configs/experiment/")
            root = root.parent  # the config dir
            params.update(_sweep_params(root / f"{entry.lstrip('/')}.yaml"))
    params.update(((cfg.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
    return params


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": value}."""
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(saved: dict, current: dict, defaults: Optional[dict] = None) -> list[str]:
    """Dotted keys whose values differ between two resolved configs, volatile keys excluded.

    ``defaults`` ({dotted key: schema default}, ``bftrec.config.schema_defaults``): a key that
    ``saved`` lacks (the run predates the key) counts as equal when ``current`` holds its default,
    since a new key's default is the behaviour from before it existed.
    """
    a, b = _flat(saved), _flat(current)
    defaults = defaults or {}

    def same(k: str) -> bool:
        if k not in a and k in b and k in defaults:
            return b[k] == defaults[k]
        return a.get(k, "<absent>") == b.get(k, "<absent>")

    return sorted(k for k in set(a) | set(b) if k not in VOLATILE and not same(k))


def prepare_cell(out_dir: Path, resolved: dict, skip_finished: bool,
                 defaults: Optional[dict] = None) -> tuple[str, Optional[dict]]:
    """Decide what to do with a run directory before any result is written to it.

    Args:
        out_dir: the cell's run directory (Hydra has already written its ``.hydra/`` record there).
        resolved: the resolved run config (``OmegaConf.to_container(cfg, resolve=True)``).
        skip_finished: the root key ``skip_finished``.
        defaults: schema defaults of the config's keys (``config_diff``): keys added since the
            stored run was written do not make it "another config" while they hold their default.
    Returns:
        ``("skipped", metrics)`` for a finished cell of the same config; ``("resumed", None)`` for an
        unfinished one (the caller sets ``trainer.resume`` to ``out_dir``); ``("ran", None)`` otherwise.
    Raises:
        ConfigError: the directory holds a run of another config, a finished run while
            ``skip_finished`` is false, or an unreadable config.yaml or metrics.json (one line; no
            result is overwritten).
    """
    metrics, last, saved = out_dir / "metrics.json", out_dir / "last.pt", out_dir / "config.yaml"
    if not (metrics.exists() or last.exists()):
        return "ran", None
    if not skip_finished:
        raise ConfigError(f"{out_dir} already holds a run; pass skip_finished=true to skip or resume it, "
                          "or choose another out_root")
    if saved.exists():
        stored = _read(saved, yaml.safe_load) or {}
        if isinstance(stored.get("layer"), dict):  # a run written before bft.units existed is BFT v1 (units=h)
            stored["layer"] = upgrade_legacy_layer(stored["layer"])
        diff = config_diff(stored, resolved, defaults)
        if diff:
            raise ConfigError(f"{out_dir} holds a run of another config (differs at {', '.join(diff[:5])}); "
                              "choose another out_root or move that run away")
    if metrics.exists():
        log.info("finished cell, skipped: %s", out_dir)
        return "skipped", _read(metrics, json.loads)
    log.info("unfinished cell, resuming from %s", last)
    return "resumed", None


@contextmanager
def atomic(path: Path):
    """Yield a temporary sibling of ``path``; on success it replaces ``path`` in one step, so a job
    killed mid-write never leaves a torn file (``os.replace`` is atomic on POSIX)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _read(path: Path, parse):
    try:
        return parse(path.read_text())
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{path} is unreadable (a torn write?: {str(e).splitlines()[0]}); "
                          "delete it to rerun the cell") from None


@contextmanager
def cell_lock(out_dir: Path):
    """Hold an exclusive OS lock on ``out_dir/.lock`` while a cell runs (released if the job dies).

    Raises:
        ConfigError: another live job holds the cell (two sweep jobs map to one directory: sweep only
            over the grid axes, or give each variant its own out_root).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out_dir} is being run by another job right now; two jobs of one sweep map to "
                              "this cell (sweep only over the grid axes dataset, model, layer, seed) or "
                              "overlapping slices run at once") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_tuned(tuned_config: str, dataset: str, model: str, require: bool) -> None:
    """With ``require_tuned=true``, refuse a cell whose tuned file was not applied (one line)."""
    want = f"{dataset}_{model}"
    if require and tuned_config != want:
        raise ConfigError(f"require_tuned=true but configs/tuned/{want}.yaml was not applied "
                          f"(tuned_config={tuned_config!r}); add that file or drop the cell from the grid")


def append_ledger(path: Path, record: dict) -> None:
    """Append one JSON line (one cell of a grid) to ``path``; safe for parallel jobs (O_APPEND)."""
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "written": datetime.now().isoformat(timespec="seconds"), **record}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def training_segments(log: Path) -> list[tuple[int, str]]:
    """(first epoch, device type) of each process that trained a run, in order, read from its
    ``train.log``: ``bftrec.experiment.run`` logs ``... items, device <type>`` before training, and
    ``bftrec.trainer.fit`` logs ``resumed from ... at epoch N`` when it resumes (first epoch N + 1).
    [] without a log. A run resumed on another machine has several segments."""
    segments: list[tuple[int, str]] = []
    text = log.read_text() if log.exists() else ""
    for line in text.splitlines():
        if m := re.search(r" items, device (\w+)", line):
            segments.append((1, m.group(1)))
        elif (m := re.search(r"resumed from .* at epoch (\d+)", line)) and segments:
            segments[-1] = (int(m.group(1)) + 1, segments[-1][1])
    return segments


def epoch_devices(log: Path, n_epochs: int) -> list[str]:
    """Device type ("cpu", "cuda", ...) each of a run's ``n_epochs`` epochs ran on (``training_segments``);
    "?" for an epoch no segment covers (no log)."""
    segments = training_segments(log)
    out = []
    for e in range(1, n_epochs + 1):
        on = [dev for first, dev in segments if first <= e]
        out.append(on[-1] if on else "?")
    return out
