"""Entry point ``bftrec-eval``: re-score a saved run without retraining.

    bftrec-eval results/runs/sports/sasrec/bft/seed0_... eval.n_bins=10 eval.ks=[10,50]

Reads the run's ``config.yaml`` and ``checkpoint.pt``, applies ``key=value`` overrides (eval keys
such as new strata, other K, ``eval.repeat_target=mask``, ``eval.protocol=sampled100``; also
``data_root``, ``cache_dir``, ``trainer.device`` and ``trainer.num_threads``), scores the test split
once and writes ``metrics.json`` and ``ranks.csv.gz`` into a new folder ``<run_dir>/eval_<time>/`` (or
``--out``), never over the run's own files. For BFT runs the mechanism statistics (Kalman gain K and
λ⁰ by stratum) are recomputed from the checkpoint. A run written before ``layer.bft.units`` existed is
BFT v1 and re-scores as ``bft.units=h`` (``bftrec.config.upgrade_legacy_layer``); the new folder's
config.yaml says so.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bftrec.config import ConfigError, EvalConfig, load_run_config, unknown_key
from bftrec.data.datasets import data_identity, identity_of_stats, other_data
from bftrec.evaluation import check_candidates, check_n_bins
from bftrec.experiment import build, default_threads, evaluate_test, protocol_block, typed_groups, write_outputs
from bftrec.rundir import fresh_dir
from bftrec.train import one_line_errors
from bftrec.trainer import (
    inductor_compiler_missing,
    load_checkpoint,
    load_weights,
    mean_gain,
    resolve_device,
    seed_everything,
    train_window_set,
)

log = logging.getLogger("bftrec")
# besides eval.*: keys that change where data is read or where and on how many threads scoring runs,
# never what was trained
RESCORE_KEYS = ("data_root", "cache_dir", "trainer.device", "trainer.num_threads")
RECOVER = ("retrain it (bftrec-train with the settings in {run_dir}/config.yaml), or, if {run_dir}/last.pt is "
           "intact, continue it with bftrec-train trainer.resume={run_dir}")


@contextmanager
def quiet_init():
    """Silence the BFT stack's construction log (its λ⁰ is the untrained start, not the checkpoint's)."""
    logger = logging.getLogger("bftrec.layers.bft")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def recorded_data(run_dir: Path, ck: dict) -> dict | None:
    """The data identity a run recorded: its checkpoint's (``data``), else its metrics.json's data block."""
    if ck.get("data"):
        return ck["data"]
    m = run_dir / "metrics.json"
    return identity_of_stats(json.loads(m.read_text()).get("data")) if m.exists() else None


def rescore(run_dir: Path, overrides: list[str], out_dir: Path | None = None, allow_other_data: bool = False) -> dict:
    """Re-score ``run_dir`` with ``overrides``; returns the metrics dict (also written to disk).

    ``out_dir`` (default a new ``<run_dir>/eval_<time>``, ``_2``, ... when one of that second exists) must
    be a new or empty folder: nothing is ever overwritten.

    Raises:
        FileNotFoundError: no config.yaml / checkpoint.pt in ``run_dir``.
        ConfigError: an unknown override key; a torn, empty or foreign checkpoint.pt; an ``out_dir`` that is a
            file or a folder holding any file (one line each; before any scoring).
    """
    started = time.time()
    run_dir = Path(run_dir)
    for name in ("config.yaml", "checkpoint.pt"):
        if not (run_dir / name).exists():
            raise FileNotFoundError(f"{run_dir / name} not found; pass a run directory written by bftrec-train")
    if out_dir is not None and Path(out_dir).exists():  # checked before any scoring
        if not Path(out_dir).is_dir():
            raise ConfigError(f"--out {out_dir} is a file; give a new folder (or omit --out)")
        if any(Path(out_dir).iterdir()):
            raise ConfigError(f"--out {out_dir} already holds files (a run, its .hydra/ or an earlier re-score), "
                              "which bftrec-eval never overwrites; give a new or empty folder (or omit --out)")
    unfinished = not (run_dir / "metrics.json").exists()
    if unfinished:  # killed or failed: checkpoint.pt holds the best epoch so far, not the run's final choice
        why = (run_dir / "FAILED").read_text().strip() if (run_dir / "FAILED").exists() else "no metrics.json"
        log.warning("bftrec-eval: %s is an unfinished run (%s): scoring its best checkpoint so far; the output's "
                    "metrics.json says so (source_run_finished: false)", run_dir, why.splitlines()[0][:200])
    cfg = load_run_config(run_dir)  # a run written before bft.units existed loads as units=h (BFT v1)
    for key, value in asdict(EvalConfig()).items():  # a run older than an eval key was scored at its default
        if key not in cfg.eval:
            cfg.eval[key] = value
    OmegaConf.set_struct(cfg, True)
    for item in overrides:
        key = item.split("=", 1)[0]
        if not (key.startswith("eval.") or key in RESCORE_KEYS):
            raise ConfigError(f"bftrec-eval cannot override {key!r}: the checkpoint was trained on that setting; "
                              f"allowed: eval.*, {', '.join(RESCORE_KEYS)} (retrain with bftrec-train instead)")
        if key.startswith("eval.") and key.split(".")[1] not in EvalConfig.__dataclass_fields__:
            raise unknown_key(f"eval.{key.split('.')[1]}", EvalConfig.__dataclass_fields__)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    except Exception as e:  # omegaconf raises several types for unknown keys
        raise ConfigError(f"bad override {overrides}: {str(e).splitlines()[0]}") from None
    g = typed_groups(cfg)
    root, ds, ev, tc = g["root"], g["dataset"], g["eval"], g["trainer"]
    device = resolve_device(tc.device)
    if tc.num_threads < 0:  # a re-score may set it (RESCORE_KEYS): the same bound as bftrec-train
        raise ConfigError(f"trainer.num_threads={tc.num_threads} must be >= 0 (0 = default)")
    torch.set_num_threads(tc.num_threads or default_threads())  # as the run did (trainer.num_threads)
    ck = load_checkpoint(run_dir / "checkpoint.pt", device, fix=RECOVER.format(run_dir=run_dir))  # before the data
    with quiet_init():
        data, counts, model = build(g, device)
    load_weights(model, ck, run_dir / "checkpoint.pt", RECOVER.format(run_dir=run_dir))
    if tc.compile_precision and hasattr(getattr(model, "stack", None), "compile_precision"):
        missing = inductor_compiler_missing(device)  # scores as the run did; else eagerly (float rounding apart)
        model.stack.compile_precision = not missing
        if missing:
            log.warning("bftrec-eval: the run used trainer.compile_precision but %s: scoring eagerly", missing)
    check_n_bins(ev, counts)
    check_candidates(data.items, data.offsets, "test", data.n_items, g["model"].max_len, ev)
    differs = other_data(recorded_data(run_dir, ck), data_identity(data))
    if differs and not allow_other_data:  # issue 50: a re-score on other data is another experiment
        raise ConfigError(f"{run_dir}: the {differs} ({ds.name}); point BFTREC_DATA_ROOT (or data_root=) at the "
                          "data the run used, or pass --allow-other-data to re-score anyway (the output says so)")
    if differs:
        log.warning("bftrec-eval: re-scoring on other data (--allow-other-data): %s", differs)
    metrics = evaluate_test(model, data, counts, ev, device, g["model"].max_len, ck.get("tau_start"))  # λ⁰'s start
    metrics = {"dataset": ds.name, "model": g["model"].name, "layer": g["layer"].name, "seed": root.seed,
               "protocol": protocol_block(ev, metrics.pop("repeat_target_share"), tc.select_metric),
               "rescored_from": str(run_dir), "source_run_finished": not unfinished, "overrides": overrides,
               **({"other_data": {"allowed": True, "difference": differs}} if differs else {}),
               "best_epoch": ck.get("epoch"),
               "data": data.stats, **metrics}
    if out_dir is None:  # created exclusively: two re-scores started in one second get eval_<time>_2
        out_dir = fresh_dir(run_dir / f"eval_{datetime.now():%Y%m%d-%H%M%S}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out_dir / "config.yaml", resolve=True)
    write_outputs(out_dir, metrics, device, started)
    return metrics


def replay_gain(run_dir: Path) -> dict:
    """Initial and final mean K per layer on the first training batch, for a run made before the
    trainer recorded it: rebuilds the model with the run's seed exactly as ``run`` does (same RNG
    order), calibrates on the same batch, measures K, then loads the best checkpoint and measures again.
    """
    g = typed_groups(load_run_config(Path(run_dir)))
    device = torch.device("cpu")
    seed_everything(g["root"].seed, g["trainer"].deterministic)
    data, _, model = build(g, device)
    tc = g["trainer"]  # the run's own windows: with sliding/prefixes and fewer users than a batch, they differ
    tw = train_window_set(data, g["model"].max_len, device, tc.train_windows, tc.train_window_stride)
    first = tw.first(tc.batch_size)
    model.calibrate(first)
    initial = mean_gain(model, first)
    path = Path(run_dir) / "checkpoint.pt"
    load_weights(model, load_checkpoint(path, device, fix=RECOVER.format(run_dir=run_dir)), path)
    return {"initial_K_per_layer": initial, "final_K_per_layer": mean_gain(model, first)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bftrec-eval", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a run directory written by bftrec-train")
    ap.add_argument("overrides", nargs="*", help="key=value overrides, e.g. eval.n_bins=10")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default <run_dir>/eval_<time>)")
    ap.add_argument("--allow-other-data", action="store_true",
                    help="re-score even if the data differ from the run's (recorded in the output as other_data)")
    args = ap.parse_intermixed_args(argv)  # --out before or after the overrides
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    with one_line_errors("bftrec-eval"):
        rescore(args.run_dir, args.overrides, args.out, allow_other_data=args.allow_other_data)


if __name__ == "__main__":
    main(sys.argv[1:])
