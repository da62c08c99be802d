"""Entry point ``bftrec-train``: a thin ``@hydra.main`` around ``bftrec.experiment.run(cfg, out_dir)``.

It composes the config (``pkg://bftrec.configs``, ``--config-dir`` adds a folder), runs one experiment or one
grid cell (``-m``: Hydra's launcher runs the cells, ``bftrec.grid`` keeps them resumable and appends the
ledger), and turns config mistakes into one line (``bftrec-train: error: ...``, exit 2; Ctrl-C exit 130).
"""
from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from bftrec.config import (
    CONFIG_PKG,
    ConfigError,
    unknown_key,
)
from bftrec.experiment import CODE_STATE, SEED_MAX, device_name, run
from bftrec.grid import append_ledger
from bftrec.rundir import RESUME_FIXED, Interrupted, fault_line, one_line, override_key
from bftrec.trainer import install_sigint_handler, resolve_device

log = logging.getLogger("bftrec")


@hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_PKG}", config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    logging.getLogger().setLevel(cfg.get("log_level", "INFO"))
    install_sigint_handler()  # a Ctrl-C that Python swallows still ends the run at its next step
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
        if report["status"] == "failed":  # a cell that finished before the interrupt keeps its status
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
