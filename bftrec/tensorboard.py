"""Opt-in TensorBoard curves of a run (``trainer.tensorboard=true``; the optional extra ``tensorboard``).

Per epoch: ``train/loss``; ``valid/<metric>`` for every validation metric (HR@K, NDCG@K, MRR); for a BFT run
``bft/K/layer<i>`` (mean Kalman gain per block on the first training batch, ``trainer.mean_gain``) and, with
``tau.kind=item``, ``bft/lambda0_mean`` (the mean initial precision e^τ over the item table, BFT.md §0).
Event files go to ``<run dir>/tensorboard/``: ``tensorboard --logdir <run dir>``. The default install does
not include the package; asking for the curves without it is a one-line error before training.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

import torch

from bftrec.config import ConfigError


def check_available() -> None:
    """Raise a one-line ConfigError when the ``tensorboard`` package is missing."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("trainer.tensorboard=true needs the tensorboard package: pip install -e '.[tensorboard]' "
                          "(or set trainer.tensorboard=false)")


class Curves:
    """A ``SummaryWriter`` into ``<out_dir>/tensorboard`` (None-safe: ``Curves.open`` returns None when off)."""

    def __init__(self, out_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the optional extra: imported only when asked for

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    @classmethod
    def open(cls, enabled: bool, out_dir: Path) -> Optional[Curves]:
        return cls(out_dir) if enabled else None

    def epoch(self, epoch: int, row: dict, gains: Optional[list], model: torch.nn.Module) -> None:
        """Log one epoch's row of ``history.csv`` (``loss``, ``valid_<metric>``) and the BFT mechanism."""
        self.writer.add_scalar("train/loss", row["loss"], epoch)
        for key, value in row.items():
            if key.startswith("valid_"):
                self.writer.add_scalar(f"valid/{key[len('valid_'):]}", value, epoch)
        for i, k in enumerate(gains or []):
            self.writer.add_scalar(f"bft/K/layer{i}", k, epoch)
        tau = getattr(getattr(model, "stack", None), "tau", None)  # BFT's InitialPrecision
        table = getattr(tau, "tau", None) if tau is not None else None  # (n_tokens, dims) with tau.kind=item
        if isinstance(table, torch.nn.Parameter):
            lam0 = table.detach()[1:].float().exp().mean()  # row 0 is padding
            self.writer.add_scalar("bft/lambda0_mean", float(lam0), epoch)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
