"""Resumable experiment grids on top of Hydra multirun (no scheduler of our own).

A grid (``configs/experiment/paper/*.yaml``) gives every cell a fixed run directory
``<out_root>/<dataset>/<model>/<layer>/seed<k>`` and sets ``skip_finished=true``. Launching the grid,
or any slice of it (``dataset=office model=sasrec``), then

- skips a cell whose directory holds ``metrics.json`` written with the same config;
- resumes a cell that holds only ``last.pt`` (a run killed mid-training) from its last epoch;
- refuses, in one line, a directory written with a different config (nothing is overwritten);
- appends one line per cell to ``<sweep dir>/ledger.jsonl``: status (ran, resumed, skipped, failed),
  host, device, start and end time, commit and the job's overrides, i.e. which slice ran where.

Hydra itself rejects an unknown dataset, model or layer name before any cell starts and lists the
valid names; ``require_tuned=true`` additionally refuses a cell without ``configs/tuned/<d>_<m>.yaml``.
"""
from __future__ import annotations

import json
import logging
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Optional

import yaml

from bftrec.config import ConfigError

log = logging.getLogger("bftrec")

# Keys that do not change what a cell computes: where files live, logging, threads, progress bars,
# the device and the scoring chunk size (metrics do not depend on it).
VOLATILE = {"data_root", "cache_dir", "out_root", "log_level", "skip_finished", "trainer.num_threads",
            "trainer.progress", "trainer.device", "trainer.resume", "eval.batch_size"}


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": value}."""
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two resolved configs, volatile keys excluded."""
    a, b = _flat(saved), _flat(current)
    return sorted(k for k in set(a) | set(b) if k not in VOLATILE and a.get(k, "<absent>") != b.get(k, "<absent>"))


def prepare_cell(out_dir: Path, resolved: dict, skip_finished: bool) -> tuple[str, Optional[dict]]:
    """Decide what to do with a run directory before anything is written to it.

    Args:
        out_dir: the cell's run directory.
        resolved: the resolved run config (``OmegaConf.to_container(cfg, resolve=True)``).
        skip_finished: the root key ``skip_finished``.
    Returns:
        ``("skipped", metrics)`` for a finished cell of the same config; ``("resumed", None)`` for an
        unfinished one (the caller sets ``trainer.resume`` to ``out_dir``); ``("ran", None)`` otherwise.
    Raises:
        ConfigError: the directory holds a run of another config, or a finished run while
            ``skip_finished`` is false (one line; nothing is overwritten).
    """
    metrics, last, saved = out_dir / "metrics.json", out_dir / "last.pt", out_dir / "config.yaml"
    if not (metrics.exists() or last.exists()):
        return "ran", None
    if not skip_finished:
        raise ConfigError(f"{out_dir} already holds a run; pass skip_finished=true to skip or resume it, "
                          "or choose another out_root")
    if saved.exists():
        diff = config_diff(yaml.safe_load(saved.read_text()) or {}, resolved)
        if diff:
            raise ConfigError(f"{out_dir} holds a run of another config (differs at {', '.join(diff[:5])}); "
                              "choose another out_root or move that run away")
    if metrics.exists():
        log.info("finished cell, skipped: %s", out_dir)
        return "skipped", json.loads(metrics.read_text())
    log.info("unfinished cell, resuming from %s", last)
    return "resumed", None


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
