"""fit(): epochs, early stopping on validation NDCG@10, best checkpoint, resume.

One training example is a window of ``max_len + 1`` training items (``s[:-2]``): each user's most
recent one (``trainer.train_windows=last``), or every window of ``sliding``, so that every training
target is predicted (``bftrec.data.batches.train_window_bounds``); the backbone's ``training_loss``
decides which positions it predicts. ``prefixes`` makes one window per target and scores its last
column only (``batch["last_target_only"]``; next-item backbones), as RecBole trains sequential models.
After every ``eval_every`` epochs the whole validation split is ranked (full ranking) and the selection
metric decides the best checkpoint; training stops after ``patience`` evaluations without improvement, never before
``min_epochs`` (0 = off; ``min_epochs = epochs`` trains a fixed budget). Under torch.distributed
(torchrun) each process takes a disjoint slice of every epoch's windows and gradients are averaged by
DDP; only rank 0 writes files.
"""
from __future__ import annotations

import logging
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from bftrec.config import ConfigError, EvalConfig, TrainerConfig, check_choice
from bftrec.data.batches import check_train_windows, loo_split, train_window_bounds, trim_left, windows
from bftrec.data.datasets import data_identity, other_data
from bftrec.evaluation import rank_users
from bftrec.grid import atomic
from bftrec.layers import Stack, optimizer_param_groups
from bftrec.metrics import summarize
from bftrec.tensorboard import Curves, check_available

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU. Raises ConfigError for CUDA without a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name} but no CUDA device is available; use trainer.device=cpu or auto")
    return torch.device(name)


def check_trainer_config(cfg: TrainerConfig, eval_cfg: EvalConfig, max_len: Optional[int] = None) -> None:
    """One-line ConfigError for impossible trainer settings, checked before any data is read.

    ``max_len`` (``model.max_len``) bounds ``train_window_stride``; None skips that bound.
    """
    for key in ("epochs", "batch_size", "patience", "eval_every"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"trainer.{key}={getattr(cfg, key)} must be >= 1")
    for key in ("weight_decay", "grad_clip", "max_steps_per_epoch", "num_threads"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"trainer.{key}={getattr(cfg, key)} must be >= 0 (0 = off/default)")
    if not 0 <= cfg.min_epochs <= cfg.epochs:
        raise ConfigError(f"trainer.min_epochs={cfg.min_epochs} must be in [0, trainer.epochs={cfg.epochs}]; "
                          f"0 turns it off, trainer.epochs trains a fixed budget")
    if not cfg.lr > 0:
        raise ConfigError(f"trainer.lr={cfg.lr} must be > 0")
    if not (cfg.divergence_factor == 0 or cfg.divergence_factor > 1):
        raise ConfigError(f"trainer.divergence_factor={cfg.divergence_factor} must be > 1 (or 0 = off)")
    check_choice(cfg.optimizer, ("adam", "adamw"), "trainer.optimizer")
    betas = list(cfg.betas) if isinstance(cfg.betas, Sequence) and not isinstance(cfg.betas, str) else []
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise ConfigError(f"trainer.betas={cfg.betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
    metrics = [f"{m}@{k}" for k in eval_cfg.ks for m in ("HR", "NDCG")] + ["MRR"]
    if cfg.select_metric not in metrics:
        raise ConfigError(f"trainer.select_metric={cfg.select_metric!r} is not computed; choose one of "
                          f"{', '.join(metrics)} (K from eval.ks)")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        raise ConfigError(f"trainer.device={cfg.device!r} is not valid; use auto, cpu, cuda or cuda:N")
    check_train_windows(cfg.train_windows, cfg.train_window_stride, max_len)
    check_choice(cfg.dropout, ("torch", "mask"), "trainer.dropout")
    if cfg.last_position_only and cfg.train_windows != "prefixes":
        raise ConfigError(f"trainer.last_position_only=true needs trainer.train_windows=prefixes (now "
                          f"{cfg.train_windows}): only there does the loss read the last position alone")


def check_fast_paths(cfg: TrainerConfig, model: nn.Module, device: torch.device) -> None:
    """Refuse a fast path that this device or model cannot honour, in one line (never a silent fallback).

    Raises:
        ConfigError: ``trainer.fused_optimizer`` where torch has no fused Adam/AdamW for ``device``;
            ``trainer.last_position_only`` on a model whose stack computes every position (BFT layers, GRU4Rec);
            ``trainer.compile_precision`` on a model without a BFT stack, or on a CPU without a C++ compiler.
    """
    if cfg.fused_optimizer:
        try:
            _optimizer_class(cfg)([torch.zeros(1, device=device, requires_grad=True)], fused=True)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ConfigError(f"trainer.fused_optimizer=true: torch {torch.__version__} has no fused "
                              f"{cfg.optimizer} on {device.type} ({str(e).splitlines()[0]}); drop the flag") from None
    if cfg.last_position_only and not getattr(getattr(model, "stack", None), "last_only_training", False):
        raise ConfigError(f"trainer.last_position_only=true: {type(model).__name__} with this layer computes every "
                          "position in training (only the standard Transformer stack has a last-position path); "
                          "drop the flag")
    if cfg.compile_precision:
        if not hasattr(getattr(model, "stack", None), "compile_precision"):
            raise ConfigError(f"trainer.compile_precision=true: {type(model).__name__} with "
                              f"{type(getattr(model, 'stack', model)).__name__} has no precision chain to compile "
                              "(only layer=bft and layer=bft_h do); drop the flag")
        missing = inductor_compiler_missing(device)
        if missing:
            raise ConfigError(f"trainer.compile_precision=true: {missing}; install it or set $CXX, or drop the flag")


def inductor_compiler_missing(device: torch.device) -> str:
    """'' when torch.compile's Inductor backend has the compiler it will call on ``device``'s type, else what is
    missing: on CPU the C++ compiler it runs (``$CXX`` if set, else ``g++``; ``clang++`` on macOS)."""
    if device.type != "cpu":
        return ""
    cxx = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    return "" if shutil.which(cxx) else f"the C++ compiler {cxx} (torch.compile's Inductor backend on CPU) is not found"


class MaskDropout(nn.Dropout):
    """``trainer.dropout=mask``: keep an element where U(0, 1) >= p and scale by 1 / (1 − p), one float32 draw
    per element (in bfloat16 the draws are too coarse and the rate drifts): the same keep rate 1 − p and
    expectation as ``nn.Dropout``, with other random draws."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, device=x.device, dtype=torch.float32) >= self.p  # float32: bf16 draws bias the rate
        return x * keep * (1.0 / (1.0 - self.p))


def use_mask_dropout(model: nn.Module) -> int:
    """Switch every ``nn.Dropout`` of ``model`` to ``MaskDropout`` in place; returns how many (no parameters or
    state change: a checkpoint loads either way)."""
    n = 0
    for m in model.modules():
        if type(m) is nn.Dropout:
            m.__class__ = MaskDropout
            n += 1
    return n


def check_windows_model(mode: str, model) -> None:
    """One-line ConfigError when ``trainer.train_windows=prefixes`` meets a backbone (class or instance)
    whose ``training_loss`` cannot score a window's last column alone (``prefix_training``: BERT4Rec's
    cloze has no next-item target)."""
    if mode == "prefixes" and not getattr(model, "prefix_training", False):
        name = model.__name__ if isinstance(model, type) else type(model).__name__
        raise ConfigError(f"trainer.train_windows=prefixes needs a next-item backbone (sasrec, hstu), not {name}; "
                          "use trainer.train_windows=last or sliding")


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def is_main() -> bool:
    return not _distributed() or torch.distributed.get_rank() == 0


def world_size() -> int:
    """torch.distributed processes (1 without torchrun)."""
    return torch.distributed.get_world_size() if _distributed() else 1


class _LossModule(nn.Module):
    """Routes DDP's forward to the backbone's ``training_loss``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model.training_loss(batch)


def epoch_batches(lengths: torch.Tensor, batch_size: int, gen: torch.Generator, rank: int = 0,
                  world: int = 1, bucket: bool = True) -> list[torch.Tensor]:
    """One epoch's batches of row indices, each process taking a disjoint slice of the users.

    With ``bucket``: users are shuffled, cut into pools of 50 batches, sorted by length inside each
    pool, cut into batches, and the batch order is shuffled ("sortish" sampling, as fairseq does).
    Batches then hold similar lengths, so trimming their common left padding saves most of the
    work on short-sequence data (Amazon: mean length ~8 against max_len 50).
    """
    perm = torch.randperm(len(lengths), generator=gen)
    perm = perm[: len(perm) - len(perm) % world][rank::world]  # equal shares: every rank takes as many steps
    if not bucket:
        return list(perm.split(batch_size))
    batches: list[torch.Tensor] = []
    for pool in perm.split(batch_size * 50):
        pool = pool[torch.argsort(lengths[pool], stable=True)]
        batches.extend(pool.split(batch_size))
    order = torch.randperm(len(batches), generator=gen)
    return [batches[i] for i in order]


@dataclass
class FitResult:
    best_epoch: int
    best_valid: dict
    history: list = field(default_factory=list)
    stopped_early: bool = False
    initial_gain: Optional[list] = None   # BFT: mean K per layer on the first batch after calibration
    first_batch: Optional[dict] = None    # that batch (the first batch_size users), to measure K again
    tau_start: Optional[torch.Tensor] = None  # BFT: (n_tokens,) float32 τ per token id after calibration


@dataclass
class TrainWindows:
    """An epoch's training windows, cut batch by batch from per-window bounds.

    Holds (W,) int64 bounds instead of the (W, L + 1) table, so memory is O(W), not O(W * L): with
    ``prefixes`` on ML-1M at L = 200 the table would be ~1.6 GB of items (and as much of times).

    Attributes:
        items: (nnz,) int64 item ids of every sequence (CSR, ids >= 1); ``timestamps`` (nnz,) unix
            seconds or None.
        start, end: (W,) int64: window ``w`` is the last ``length`` items of ``items[start[w]:end[w]]``
            (``train_window_bounds``), left-padded; every window holds at least one item.
        length: ``max_len + 1``; ``device``: where ``batch`` puts its tensors.
    """
    items: np.ndarray
    timestamps: Optional[np.ndarray]
    start: np.ndarray
    end: np.ndarray
    length: int
    device: torch.device

    def __len__(self) -> int:
        return len(self.start)

    def lengths(self) -> torch.Tensor:
        """(W,) int64 real items per window (its non-padding columns)."""
        return torch.from_numpy(np.minimum(self.end - self.start, self.length))

    def batch(self, idx: torch.Tensor | np.ndarray) -> dict:
        """``{"seq": (B, L + 1) int64[, "time": (B, L + 1) int64]}`` on ``device`` for window rows ``idx``: (B,)
        integer indices or a (W,) bool mask (torch or numpy, any device)."""
        idx = np.asarray(idx.cpu() if isinstance(idx, torch.Tensor) else idx)
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64)  # a mask selects its rows
        start, end = self.start[idx], self.end[idx]  # (B,)
        out = {"seq": torch.from_numpy(windows(self.items, start, end, self.length)).to(self.device)}
        if self.timestamps is not None:
            out["time"] = torch.from_numpy(windows(self.timestamps, start, end, self.length)).to(self.device)
        return out

    def first(self, batch_size: int) -> dict:
        """The first ``batch_size`` windows (the ``last`` windows of the first users): the BFT calibration batch
        (BFT.md §1 s₀²) and the K probe."""
        return self.batch(np.arange(min(batch_size, len(self))))


def train_window_set(data, max_len: int, device: torch.device, mode: str = "last",
                     stride: Optional[int] = None) -> TrainWindows:
    """The training windows of ``trainer.train_windows=mode`` (``train_window_bounds``), without the empty ones.

    With ``last`` the rows are the users with >= 1 training item, in user order.
    """
    _, start, end = train_window_bounds(data.offsets, max_len + 1, mode, stride)  # (W,) each
    keep = end > start  # windows with at least one training item
    return TrainWindows(data.items, data.timestamps, start[keep], end[keep], max_len + 1, device)


def training_tensors(data, max_len: int, device: torch.device, mode: str = "last",
                     stride: Optional[int] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(W, L + 1) int64 training windows (and unix-second times, or None), left-padded, non-empty:
    ``train_window_set`` materialised, for scripts and tests (the trainer cuts them per batch).
    """
    tw = train_window_set(data, max_len, device, mode, stride)
    out = tw.batch(np.arange(len(tw)))
    return out["seq"], out.get("time")


def train_windows_block(cfg: TrainerConfig, max_len: int, world: int = 1) -> dict:
    """How training windows were cut, for metrics.json (``train_window_bounds`` states the coverage).

    ``world``: torch.distributed processes; with more than one, ``epoch_batches`` skips up to ``world - 1``
    windows per epoch (a fresh random choice every epoch) so that every process takes as many steps.
    """
    sliding = cfg.train_windows == "sliding"
    targets = {"sliding": "every training target at least once per epoch",
               "prefixes": "every training target once per epoch, each the last column of its own window "
                           "(the loss there only)",
               "last": "the most recent max_len training targets of each user"}
    text = targets[cfg.train_windows]
    if world > 1:
        text += (f"; under DDP ({world} processes) up to {world - 1} window{'s' if world > 2 else ''} per epoch, "
                 "drawn anew each epoch, skipped so that every process takes as many steps")
    return {"mode": cfg.train_windows, "window_items": max_len + 1,
            "stride": (cfg.train_window_stride or max_len) if sliding else None, "targets": text}


def mean_gain(model: nn.Module, batch: dict) -> Optional[list]:
    """Mean Kalman gain K per layer over the real tokens of a training ``batch`` (eval mode, no grad).

    BFT.md §0 asks to log the initial and final mean K per layer; the trainer measures it on the
    first training batch right after calibration, and again at the best checkpoint. Returns None
    for standard layers (no mechanism).
    """
    inputs = {"item_seq": batch["seq"][:, 1:]}  # (B, L) the most recent L training items
    if "time" in batch:
        inputs["time"] = batch["time"][:, 1:]
    was_training = model.training
    model.eval()
    mech = model.mechanism(inputs)
    model.train(was_training)
    if not mech:
        return None
    valid = inputs["item_seq"].ne(0)
    return [float(layer["K"][valid].mean()) for layer in mech["layers"]]


def load_checkpoint(path: Path, device: torch.device, keys: tuple = ("model",), fix: str = "") -> dict:
    """``torch.load`` a checkpoint written by ``fit``; a torn, empty or foreign file is one line.

    Raises:
        ConfigError: the file cannot be unpickled, or lacks ``keys``; names the file and ``fix``.
    """
    try:
        ck = torch.load(path, map_location=device, weights_only=False)
    except FileNotFoundError:
        raise
    except Exception as e:  # unpickling garbage raises many types (EOFError, RuntimeError, UnpicklingError, ...)
        why = (str(e).splitlines() or [type(e).__name__])[0].split(". ")[0]
        raise ConfigError(f"{path} is unreadable (a torn or foreign file: {why}); {fix}") from None
    missing = [k for k in keys if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise ConfigError(f"{path} is not a bftrec checkpoint (no {', '.join(missing)}); {fix}")
    return ck


def load_weights(model: nn.Module, ck: dict, path: Path, fix: str = "") -> None:
    """``model.load_state_dict(ck["model"])``; weights of another config are one line (ConfigError)."""
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError(f"{path} does not fit this model ({' '.join(lines[1:2] or lines[:1])[:200]}); "
                          f"{fix}") from None


def _last_good(out_dir: Path, state: dict) -> str:
    if state["epoch"] == 0:
        return "no epoch had finished, nothing was saved"
    return (f"the last good state is kept: {out_dir / 'last.pt'} (epoch {state['epoch']}) and "
            f"{out_dir / 'checkpoint.pt'} (best epoch {state['best_epoch']})")


def _optimizer_class(cfg: TrainerConfig) -> type:
    """``torch.optim.Adam`` or ``AdamW`` for ``trainer.optimizer`` (ConfigError for anything else)."""
    check_choice(cfg.optimizer, ("adam", "adamw"), "trainer.optimizer")
    return torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam


def _optimizer(model: nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    cls = _optimizer_class(cfg)
    fused = {"fused": True} if cfg.fused_optimizer else {}  # checked by check_fast_paths
    return cls(optimizer_param_groups(model, cfg.lr), lr=cfg.lr, weight_decay=cfg.weight_decay,  # τ: layer.tau.lr_scale
               betas=tuple(cfg.betas), **fused)


# A Ctrl-C that Python swallowed (raised while an object's __del__ or a garbage-collection callback ran, where
# exceptions are only printed) would let a run go on to its last epoch; bftrec-train's handler also records it
# here, and the training loop raises it again at its next step.
_INTERRUPT = {"pending": False}


def on_sigint(signum, frame) -> None:
    """SIGINT handler of ``bftrec-train`` (``install_sigint_handler``): records the interrupt, then raises
    ``KeyboardInterrupt`` as Python's default handler does. Raises: KeyboardInterrupt, always."""
    _INTERRUPT["pending"] = True
    raise KeyboardInterrupt


def install_sigint_handler():
    """Make ``on_sigint`` the SIGINT handler, in the main thread only (``signal`` allows no other). Returns the
    handler it replaced (for ``signal.signal`` to put back), or None where it installed nothing."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGINT, on_sigint)
    return None


def clear_interrupt() -> bool:
    """Forget a recorded interrupt (it has been handled: the run ended with its resume line, or it finished).
    Returns whether one was recorded (a Ctrl-C swallowed after the last training step, e.g. in test scoring)."""
    pending = _INTERRUPT["pending"]
    _INTERRUPT["pending"] = False
    return pending


def _raise_if_interrupted() -> None:
    if _INTERRUPT["pending"]:
        clear_interrupt()
        raise KeyboardInterrupt


def fit(model: nn.Module, data, cfg: TrainerConfig, eval_cfg: EvalConfig, out_dir: Path,
        device: torch.device, max_len: int, seed: int, extra_state: Optional[dict] = None,
        on_validate: Optional[Callable[[int, float], None]] = None) -> FitResult:
    """Train ``model`` on ``data`` (a ``SeqData``) and keep the best checkpoint in ``out_dir``.

    The loop, step by step: check the settings, build the training windows and the optimizer, then either
    resume from ``last.pt`` (``_resume``) or calibrate BFT's s₀² on the first batch (``_start``); per epoch,
    ``_train_epoch``, then (every ``eval_every`` epochs and at the last) ``_validate`` keeps the best
    checkpoint; ``_save_progress`` writes ``history.csv`` and ``last.pt``; ``_early_stop`` ends the loop.

    Writes ``checkpoint.pt`` (best weights + ``extra_state``), ``last.pt`` (resume state) and
    ``history.csv`` (per evaluation: epoch, loss, valid metrics, seconds). ``on_validate(epoch, score)`` is
    called after each validation, once ``last.pt`` holds that epoch (``bftrec-tune`` prunes there).
    Raises:
        ConfigError: bad trainer settings, an unreadable ``last.pt`` / ``checkpoint.pt`` to resume from.
        ValueError: divergence: a non-finite loss or gradient norm, or a loss above
            ``divergence_factor`` x the first epoch's mean (the first step's during epoch 1), with
            epoch and step; a non-finite validation score, with the epoch. ``last.pt`` and
            ``checkpoint.pt`` then keep the last good epoch.
    """
    check_trainer_config(cfg, eval_cfg, max_len)
    if not getattr(model, "trainable", True):
        return _count(model, data, cfg, eval_cfg, out_dir, device, max_len, extra_state)
    check_windows_model(cfg.train_windows, model)
    check_fast_paths(cfg, model, device)
    if cfg.tensorboard:
        check_available()
    if cfg.dropout == "mask":
        log.info("trainer.dropout=mask: %d dropout modules draw U(0, 1) masks", use_mask_dropout(model))
    if cfg.compile_precision:
        model.stack.compile_precision = True
        log.info("trainer.compile_precision=true: the precision formulas compile on first use (seconds to a minute)")
    opt = _optimizer(model, cfg)
    tw = train_window_set(data, max_len, device, cfg.train_windows, cfg.train_window_stride)
    log.info("%d training windows of %d items (trainer.train_windows=%s)", len(tw), max_len + 1, cfg.train_windows)
    runner = _loss_runner(model)
    state = _new_state(data)
    first = tw.first(cfg.batch_size)  # calibration batch (BFT.md §1 s₀²) and K probe
    gen = torch.Generator().manual_seed(seed)
    if cfg.resume:
        state = _resume(Path(cfg.resume), model, opt, gen, state, device, out_dir)
    else:
        _start(model, first, state)
    curves = Curves.open(cfg.tensorboard and is_main(), out_dir)  # opt-in TensorBoard curves
    # a resumed run that had stopped early stays stopped, unless the settings now hold it back (as they would
    # have held an unbroken run)
    stopped = _early_stop(cfg, state, state["epoch"])
    for epoch in range(state["epoch"] + 1, (state["epoch"] if stopped else cfg.epochs) + 1):
        t0, c0 = time.time(), time.process_time()
        row = {"epoch": epoch, "loss": _train_epoch(runner, model, opt, tw, gen, cfg, epoch, state, out_dir, device),
               "train_seconds": time.time() - t0, "train_cpu_seconds": time.process_time() - c0}
        if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            row.update(_validate(model, data, cfg, eval_cfg, device, max_len, epoch, state, out_dir, extra_state))
            log.info("epoch %d loss %.4f valid %s %.4f (best %.4f @ %d) %.1fs", epoch, row["loss"],
                     cfg.select_metric, row[f"valid_{cfg.select_metric}"], state["best"], state["best_epoch"],
                     time.time() - t0)
        state["history"].append(row)
        state["epoch"] = epoch
        if curves is not None:
            curves.epoch(epoch, row, mean_gain(model, first), model)
        if is_main():
            _save_progress(out_dir, model, opt, gen, state)
        if on_validate is not None and f"valid_{cfg.select_metric}" in row:
            on_validate(epoch, row[f"valid_{cfg.select_metric}"])
        if _early_stop(cfg, state, epoch):
            log.info("early stop at epoch %d: no better valid %s for %d evaluations", epoch,
                     cfg.select_metric, state["bad"])
            stopped = True
            break
    if curves is not None:
        curves.close()
    if is_main() and state["history"] and not (out_dir / "history.csv").exists():  # resumed with nothing to train
        _save_history(out_dir, state)
    if state["best_epoch"] < 0:
        raise ValueError("no validation ran; set trainer.eval_every <= trainer.epochs")
    return FitResult(state["best_epoch"], state["best_valid"], state["history"], stopped,
                     state.get("initial_gain"), first, state.get("tau_start"))


def _count(model: nn.Module, data, cfg: TrainerConfig, eval_cfg: EvalConfig, out_dir: Path, device: torch.device,
           max_len: int, extra_state: Optional[dict]) -> FitResult:
    """A statistical model (``trainable = False``: ``pop``, ``markov``): ``fit_statistics`` once on every user's
    training items (those before the validation target), validation scored once, ``checkpoint.pt`` and
    ``history.csv`` written as for one epoch (its loss is NaN: nothing is optimised). Deterministic: the seed
    changes nothing."""
    flags = [f for f, on in (("fused_optimizer", cfg.fused_optimizer), ("dropout=mask", cfg.dropout == "mask"),
                              ("last_position_only", cfg.last_position_only),
                              ("compile_precision", cfg.compile_precision), ("tensorboard", cfg.tensorboard)) if on]
    if flags:
        raise ConfigError(f"{type(model).__name__} is counted, not trained: trainer.{', trainer.'.join(flags)} "
                          "would do nothing; drop it")
    state = _new_state(data)
    t0, c0 = time.time(), time.process_time()
    split = loo_split(data.items, data.offsets, "valid")
    model.fit_statistics(data.items, split.start, split.end)
    row = {"epoch": 1, "loss": math.nan, "train_seconds": time.time() - t0,
           "train_cpu_seconds": time.process_time() - c0}
    row.update(_validate(model, data, cfg, eval_cfg, device, max_len, 1, state, out_dir, extra_state))
    state["history"].append(row)
    state["epoch"] = 1
    if is_main():
        _save_history(out_dir, state)
    log.info("counted in %.1fs (no training): valid %s %.4f", row["train_seconds"], cfg.select_metric,
             row[f"valid_{cfg.select_metric}"])
    return FitResult(state["best_epoch"], state["best_valid"], state["history"], False, None, None, None)


def _new_state(data) -> dict:
    """The training state before epoch 1 (what ``last.pt`` carries): no epoch, no best, the data's fingerprint."""
    return {"epoch": 0, "best": -math.inf, "best_epoch": -1, "best_valid": {}, "bad": 0, "history": [],
            "initial_gain": None, "data": data_identity(data)}


def _loss_runner(model: nn.Module) -> nn.Module:
    """The module a training step calls: the model's loss, wrapped in DDP when several processes train."""
    runner: nn.Module = _LossModule(model)
    if world_size() > 1:
        # A BFT stack's last-layer process noise Q feeds no loss term (its λ'' is never used)
        plain = isinstance(getattr(model, "stack", None), Stack)
        runner = nn.parallel.DistributedDataParallel(runner, find_unused_parameters=not plain)
    return runner


def _resume(run: Path, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator, state: dict,
            device: torch.device, out_dir: Path) -> dict:
    """Load ``run/last.pt`` into the model, optimizer and both RNGs; returns its state (epoch, best, history, ...).

    Raises:
        ConfigError: no ``last.pt``, an unreadable one or an unreadable ``checkpoint.pt`` beside it, or a
            ``last.pt`` trained on other data (the fingerprints differ).
    """
    last = run / "last.pt"
    if not last.exists():
        raise ConfigError(f"trainer.resume={run}: no last.pt there; point it at a run directory")
    ck = load_checkpoint(last, device, ("model", "optimizer", "state", "generator", "torch_rng"),
                         "delete it to restart the run from epoch 1 (or resume another run directory)")
    differs = other_data(ck["state"].get("data"), state["data"])
    if differs:  # issue 50: epoch 1 on one file and epoch 2 on another is never one run
        raise ConfigError(f"trainer.resume={run}: the {differs} ({last}); point BFTREC_DATA_ROOT (or "
                          "data_root) at the data the run trained on, or start a new run")
    load_weights(model, ck, last, "resume with the run's own config (trainer.resume reads its config.yaml)")
    opt.load_state_dict(ck["optimizer"])
    state = {**ck["state"], "data": state["data"]}  # a last.pt older than the data record gets it now
    gen.set_state(ck["generator"].cpu())  # CPU RNG states: map_location moved them to a GPU run's device
    torch.set_rng_state(ck["torch_rng"].cpu())
    log.info("resumed from %s at epoch %d", last, state["epoch"])
    best_ck = run / "checkpoint.pt"
    if best_ck.exists():  # the best epoch may precede the resume: it must be readable
        load_checkpoint(best_ck, device, fix=f"its best epoch {state['best_epoch']} is lost; rerun without "
                        "trainer.resume")
    if is_main() and best_ck.exists() and best_ck.resolve() != (out_dir / "checkpoint.pt").resolve():
        shutil.copy2(best_ck, out_dir / "checkpoint.pt")  # the best epoch may precede the resume
    return state


def _start(model: nn.Module, first: dict, state: dict) -> None:
    """A fresh run: calibrate (BFT: s₀² on the first batch, BFT.md §1) and record K and τ at the start."""
    model.calibrate(first)
    state["initial_gain"] = mean_gain(model, first)
    tau = getattr(getattr(model, "stack", None), "tau", None)  # BFT: τ's start, log n̄ included (BFT.md §7)
    state["tau_start"] = tau.start_values().cpu().clone() if tau is not None else None


def step_batch(tw: TrainWindows, idx, cfg: TrainerConfig) -> dict:
    """The batch of windows ``idx`` as a training step feeds it to the model: ``seq`` (B, L' + 1) int64 (and
    ``time``, unix seconds, where the data have it) with the common left padding trimmed (L' the batch's longest
    window), and under ``prefixes`` the flags ``last_target_only`` and ``last_position_only`` (the loss reads the
    last column alone). Used by ``_train_epoch`` and the benches, so they time what the trainer runs."""
    batch = tw.batch(idx)  # (B, L + 1)
    if "time" in batch:
        seq, tim = trim_left(batch["seq"], batch["time"])  # (B, L' + 1) each
        batch = {"seq": seq, "time": tim}
    else:
        batch = {"seq": trim_left(batch["seq"])}
    if cfg.train_windows == "prefixes":
        batch["last_target_only"] = True
        batch["last_position_only"] = cfg.last_position_only
    return batch


def _train_epoch(runner: nn.Module, model: nn.Module, opt: torch.optim.Optimizer, tw: TrainWindows,
                 gen: torch.Generator, cfg: TrainerConfig, epoch: int, state: dict, out_dir: Path,
                 device: torch.device) -> float:
    """One pass over the training windows in ``gen``'s order; returns the mean training loss.

    Raises:
        ValueError: a non-finite loss or gradient norm, or a loss above ``divergence_factor`` x the first
            epoch's mean (during the first epoch: its first step's loss), naming the epoch, step and fix.
    """
    model.train()
    rank = torch.distributed.get_rank() if _distributed() else 0
    batches = epoch_batches(tw.lengths(), cfg.batch_size, gen, rank, world_size(), cfg.length_bucketing)
    params = [p for p in model.parameters() if p.requires_grad]
    amp = cfg.amp and device.type == "cuda"
    total, count, first_loss = 0.0, 0, None  # first_loss: the divergence reference until an epoch's mean exists
    # disable=None: tqdm draws only on a terminal (no bar in logs, pipes or CI)
    bar = tqdm(batches[:cfg.max_steps_per_epoch or None], desc=f"epoch {epoch}", leave=False,
               disable=None if cfg.progress and is_main() else True)
    for step, idx in enumerate(bar):
        _raise_if_interrupted()  # a Ctrl-C swallowed since the last step (``on_sigint``)
        batch = step_batch(tw, idx, cfg)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = runner(batch)
        value = loss.item()
        ref = state["history"][0]["loss"] if state["history"] else (first_loss or value)
        first_loss = first_loss or value
        if not math.isfinite(value):
            raise ValueError(f"non-finite training loss {value} at epoch {epoch}, step {step}; lower "
                             f"trainer.lr (now {cfg.lr:g}) or set trainer.grad_clip; {_last_good(out_dir, state)}")
        if cfg.divergence_factor and value > cfg.divergence_factor * ref:
            raise ValueError(f"training diverged at epoch {epoch}, step {step}: loss {value:.4g} is "
                             f"{value / ref:.3g}x the first {'epoch' if state['history'] else 'step'}'s "
                             f"{ref:.4g} (trainer.divergence_factor={cfg.divergence_factor:g}); lower "
                             f"trainer.lr (now {cfg.lr:g}) or set trainer.grad_clip; {_last_good(out_dir, state)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            norm = nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        else:
            norm = nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if not torch.isfinite(norm):
            raise ValueError(f"non-finite gradient norm at epoch {epoch}, step {step} (loss {value:.4g}); "
                             f"lower trainer.lr (now {cfg.lr:g}) or set trainer.grad_clip; "
                             f"{_last_good(out_dir, state)}")
        opt.step()
        total, count = total + value, count + 1
        bar.set_postfix(loss=f"{total / count:.4f}")
    return total / max(count, 1)


def _validate(model: nn.Module, data, cfg: TrainerConfig, eval_cfg: EvalConfig, device: torch.device,
              max_len: int, epoch: int, state: dict, out_dir: Path, extra_state: Optional[dict]) -> dict:
    """Full-ranking validation; a better ``select_metric`` updates ``state`` and writes ``checkpoint.pt``.
    Returns the history columns ``valid_<metric>``, ``eval_seconds`` (wall) and ``eval_cpu_seconds`` (CPU time of
    this process, all its threads: steadier than wall time on a shared machine).

    Raises:
        ValueError: a non-finite score, naming the epoch and what is kept.
    """
    t1, c1 = time.time(), time.process_time()
    try:
        table = rank_users(model, data.items, data.offsets, data.timestamps, "valid", data.n_items,
                           max_len, data.train_counts(), eval_cfg, device)
    except ValueError as e:  # a non-finite score: name the epoch and what is kept
        raise ValueError(f"validation after epoch {epoch}: {e}; {_last_good(out_dir, state)}") from None
    valid = summarize(table["rank"].to_numpy(), tuple(eval_cfg.ks))
    row = {f"valid_{k}": v for k, v in valid.items() if k != "n_users"}
    row["eval_seconds"], row["eval_cpu_seconds"] = time.time() - t1, time.process_time() - c1
    score = valid[cfg.select_metric]
    if score > state["best"]:
        state.update(best=score, best_epoch=epoch, best_valid=valid, bad=0)
        if is_main():
            with atomic(out_dir / "checkpoint.pt") as tmp:
                torch.save({"model": model.state_dict(), "epoch": epoch, "tau_start": state.get("tau_start"),
                            "data": state["data"], **(extra_state or {})}, tmp)
    else:
        state["bad"] += 1
    return row


def _early_stop(cfg: TrainerConfig, state: dict, epoch: int) -> bool:
    """After an evaluation before the last epoch: patience ran out, and min_epochs are done (a run that
    reaches trainer.epochs did not stop early; a held-back run stops only on an evaluated epoch)."""
    return (epoch % cfg.eval_every == 0 and epoch < cfg.epochs and state["bad"] >= cfg.patience
            and epoch >= cfg.min_epochs)


def _save_history(out_dir: Path, state: dict) -> None:
    with atomic(out_dir / "history.csv") as tmp:  # atomic: a job killed mid-save leaves the previous file intact
        pd.DataFrame(state["history"]).to_csv(tmp, index=False)


def _save_progress(out_dir: Path, model: nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
                   state: dict) -> None:
    """``history.csv`` and ``last.pt`` (weights, optimizer, state, both RNGs), each written atomically."""
    _save_history(out_dir, state)
    with atomic(out_dir / "last.pt") as tmp:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "state": state,
                    "generator": gen.get_state(), "torch_rng": torch.get_rng_state()}, tmp)
