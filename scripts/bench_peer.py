"""Parity with RecBole: bftrec's SASRec and RecBole 1.2.1's SASRec side by side, in one process; writes JSON.

    pip install -e '.[peer]'      # RecBole 1.2.1: an optional extra, never needed by bftrec or CI
    python scripts/bench_peer.py --datasets ml-100k sports --epochs 200 --out results/bench/peer_cpu.json
    python scripts/bench_peer.py --datasets ml-100k sports --eval-speed 7   # validation users/s only
    python scripts/bench_peer.py --datasets ml-100k --workdir peer_state ...  # resumable: rerun to continue

A full run takes hours per seed on one CPU thread (RecBole's epochs are the slow ones). With
``--workdir``, each (dataset, seed) keeps its state there after every epoch (both frameworks' weights,
optimizers and RNG streams, RecBole's loader shuffle included, the rows and the best weights so far), and
the same command run again continues where it stopped, with the same results as an unbroken run.

Same data, split and order: bftrec's preprocessed sequences (``bftrec.data.datasets.load_dataset``)
are exported to RecBole atomic files (``<user>.inter``: ``user_id``, ``item_id``, and ``timestamp`` =
the event's position in its user's sequence, so RecBole's time order is bftrec's order; plus an
``.item`` file listing every item, so both vocabularies hold all N items). RecBole splits them
leave-one-out (``eval_args``: order TO, split LS valid_and_test, mode full), as bftrec does.

Same training targets (``--targets``):

- ``window`` (default): bftrec trains on each user's most recent ``max_len + 1`` training items, i.e.
  the last ``max_len`` training items as targets; RecBole, which predicts one target per row for every
  prefix of a sequence, is fed each user's last ``max_len + 3`` items only (that window, then the
  validation and test items), so its rows are exactly bftrec's targets with the same histories;
- ``all``: every training item after the first is a target (RecBole's own default). RecBole sees the
  full sequences; bftrec trains with ``trainer.train_windows=prefixes``, which cuts them as RecBole
  does: one sample per target (the prefix ending at it, up to ``max_len`` items of context), the loss at
  that target only. Only the architecture then differs.

Same model size and loss: D, blocks, heads, FFN width, max_len, dropouts, Adam lr and batch size from
``configs/model/sasrec.yaml`` + ``configs/tuned/<dataset>_sasrec.yaml`` (``--hp`` overrides), full
softmax (CE). The architectures are each framework's own: bftrec's is pre-LN with a final LayerNorm,
sqrt(D)-scaled embeddings and a loss at every position of a window; RecBole's is post-LN (BERT) with
an input LayerNorm and one target per row. Batch size counts sequences in bftrec and targets in
RecBole (each framework's own unit), so RecBole takes more, smaller steps per epoch.

One thread each, interleaved: per epoch, one bftrec epoch (its real trainer, ``bftrec.trainer.fit``
resumed from the previous epoch's ``last.pt``) and one RecBole epoch (``Trainer._train_epoch``), the
order alternating between epochs. After each epoch both validate natively (timed: bftrec's full
ranking with history masked; RecBole's ``Trainer.evaluate``, history not masked), and both are also
ranked by the same code (``bftrec.evaluation.rank_users``) under both history conventions, untimed.
RecBole's scores go through an adapter that maps its item ids to bftrec's.

Reported per dataset, seed and framework: training targets/s, validation users/s (native full
ranking), both also per CPU second of the process (``*_per_cpu_s``: steadier than wall time on a loaded
machine; with one thread each, the two agree on an idle one), seconds to the best validation NDCG@10,
and test HR@10 / NDCG@10 under both conventions
(``masked``: the user's history items are not candidates, bftrec's default; ``unmasked``: RecBole's
behaviour for sequential models), each at the epoch with the best validation NDCG@10 **under the same
convention**. A figure under one convention is never compared with one under the other.

RecBole 1.2.1 needs two shims here: numpy 2 removed the aliases (``np.float_`` ...) that its Config
re-creates, and importing it switches on autograd anomaly mode for the whole process (its SINE model
calls ``torch.autograd.set_detect_anomaly(True)`` at import), which is switched off again. Its
``torch.load`` calls (weights_only default of torch >= 2.6) are never reached: best weights are kept
in memory.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from torch import nn

from bftrec.config import EvalConfig, TrainerConfig, merge_schema
from bftrec.data.datasets import dataset_config, load_dataset
from bftrec.evaluation import rank_users
from bftrec.experiment import CODE_STATE, cpu_name
from bftrec.layers import LAYER_CONFIGS
from bftrec.metrics import summarize
from bftrec.models import DataInfo
from bftrec.models.sasrec import SASRec, SASRecConfig
from bftrec.trainer import fit, seed_everything

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # scripts/_cli.py, also when this file is run as a script
from scripts import _cli as cli  # noqa: E402

INSTALL_HINT = "install the optional extra: pip install -e '.[peer]'"
CONVENTIONS = ("masked", "unmasked")
FAST_PATHS = {  # --fast NAME: bftrec's opt-in trainer fast paths (docs/results.md §3.1); the model is the same
    "last_position_only": ("last_position_only", True),  # prefixes only: the last block computes the loss position
    "mask_dropout": ("dropout", "mask"),  # U(0, 1) masks, the same keep rate
    "fused_optimizer": ("fused_optimizer", True),  # torch's fused Adam
}
HP_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "dropout", "attn_dropout", "max_len", "lr", "batch_size")
log = logging.getLogger("bench_peer")


# --------------------------------------------------------------------------- RecBole import


def import_recbole() -> SimpleNamespace:
    """RecBole's pieces, with the numpy 2 shim applied and anomaly mode switched off again.

    When RecBole cannot be imported: one line on stderr saying how to install the extra, exit 2.
    """
    try:
        import recbole
        from recbole.config import Config
        from recbole.data import create_dataset, data_preparation
        from recbole.model.sequential_recommender import SASRec as RecBoleSASRec
        from recbole.trainer import Trainer
        from recbole.utils import init_seed
    except ImportError as e:
        print(f"bench_peer: error: RecBole 1.2.1 cannot be imported ({e}); {INSTALL_HINT}", file=sys.stderr)
        sys.exit(2)
    for old, new in (("float_", np.float64), ("complex_", np.complex128), ("unicode_", np.str_)):
        if not hasattr(np, old):  # numpy 2: recbole.config.Config.compatibility_settings reads them
            setattr(np, old, new)
    anomaly = torch.is_anomaly_enabled()
    warnings.filterwarnings("ignore", message=r".*GradScaler", category=FutureWarning)  # its torch.cuda.amp use
    torch.autograd.set_detect_anomaly(False)
    return SimpleNamespace(Config=Config, create_dataset=create_dataset, data_preparation=data_preparation,
                           SASRec=RecBoleSASRec, Trainer=Trainer, init_seed=init_seed,
                           version=recbole.__version__, anomaly_at_import=anomaly)


# --------------------------------------------------------------------------- data export


def export_atomic(data, folder: Path, name: str, max_len: int, targets: str = "window") -> dict:
    """Write ``data`` (a ``SeqData``) as RecBole atomic files ``folder/name/name.{inter,item}``.

    ``.inter`` rows: ``user_id`` (bftrec user index), ``item_id`` (bftrec item id 1..N) and
    ``timestamp`` (float: the event's position in the user's full sequence), grouped by user, in
    order. With ``targets="window"`` each user keeps its last ``max_len + 3`` events (see the module
    docstring); with ``"all"`` every event. ``.item`` lists items 1..N. Returns counts and paths.
    Raises ValueError for an unknown ``targets``.
    """
    if targets not in ("window", "all"):
        raise ValueError(f"targets={targets!r} is not valid; choose window or all")
    lengths = np.diff(data.offsets)  # (U,)
    pos = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], lengths)  # (nnz,) position in sequence
    keep = pos >= np.repeat(lengths - (max_len + 3), lengths) if targets == "window" else np.ones_like(pos, bool)
    users = np.repeat(np.arange(len(lengths)), lengths)[keep]
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    inter = pd.DataFrame({"user_id:token": users, "item_id:token": data.items[keep],
                          "timestamp:float": pos[keep].astype(np.float64)})
    inter.to_csv(out / f"{name}.inter", sep="\t", index=False)
    pd.DataFrame({"item_id:token": np.arange(1, data.n_items + 1)}).to_csv(out / f"{name}.item", sep="\t",
                                                                            index=False)
    kept = np.bincount(users, minlength=len(lengths))  # (U,) events per user in the export
    return {"inter": str(out / f"{name}.inter"), "rows": int(keep.sum()), "users": len(lengths),
            "items": int(data.n_items), "train_targets": int(np.maximum(kept - 3, 0).sum())}


def bftrec_train_targets(data, max_len: int, targets: str) -> int:
    """Targets per bftrec training epoch: per user, ``min(train length, max_len + 1) - 1`` (window) or
    ``train length - 1`` (all)."""
    n_train = np.diff(data.offsets) - 2  # (U,)
    if targets == "window":
        n_train = np.minimum(n_train, max_len + 1)
    return int(np.maximum(n_train - 1, 0).sum())


def right_aligned(item_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, L) int64 histories -> RecBole's layout: items first, padding after, and lengths.

    Returns ``(seq (B, L) int64, lengths (B,) int64)``; row ``b`` of ``seq`` is its ``lengths[b]``
    items, oldest first, then zeros.
    """
    B, L = item_seq.shape
    lengths = item_seq.ne(0).sum(1)  # (B,)
    j = torch.arange(L, device=item_seq.device)
    src = ((L - lengths)[:, None] + j[None, :]).clamp(max=L - 1)  # (B, L) source column of each slot
    return item_seq.gather(1, src) * (j[None, :] < lengths[:, None]), lengths


class RecBoleScorer(nn.Module):
    """A trained RecBole SASRec behind bftrec's scoring contract (``score_items``), for ``rank_users``.

    ``b2r`` (N + 1,) int64 maps a bftrec item id to RecBole's internal id (0 -> 0, padding).
    """

    def __init__(self, model: nn.Module, b2r: np.ndarray) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("b2r", torch.from_numpy(b2r))

    @torch.no_grad()
    def score_items(self, batch: dict) -> torch.Tensor:
        """(B, L) left-padded bftrec ids -> (B, N + 1) float32 scores in bftrec's id order; column 0 -inf."""
        seq, lengths = right_aligned(self.b2r[batch["item_seq"]])
        inter = {self.model.ITEM_SEQ: seq, self.model.ITEM_SEQ_LEN: lengths.clamp(min=1)}
        scores = self.model.full_sort_predict(inter)[:, self.b2r]  # (B, N + 1)
        scores[:, 0] = float("-inf")
        return scores.float()


# --------------------------------------------------------------------------- the two frameworks


def hyperparameters(dataset: str, overrides: list[str]) -> dict:
    """SASRec size, dropout, lr, batch size: configs/model/sasrec.yaml, then configs/tuned/<dataset>_sasrec.yaml,
    then ``key=value`` overrides. Raises SystemExit (one line) on an unknown key."""
    model = OmegaConf.load(REPO / "configs" / "model" / "sasrec.yaml")
    trainer = OmegaConf.load(REPO / "configs" / "trainer" / "default.yaml")
    tuned = REPO / "configs" / "tuned" / f"{dataset}_sasrec.yaml"
    if tuned.exists():
        t = OmegaConf.load(tuned)
        model, trainer = OmegaConf.merge(model, t.get("model", {})), OmegaConf.merge(trainer, t.get("trainer", {}))
    hp = {k: (model.get(k) if k in model else trainer.get(k)) for k in HP_KEYS}
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in hp or not value:
            raise SystemExit(f"bench_peer: error: --hp {item!r}: use key=value with key one of {', '.join(HP_KEYS)}")
        try:
            hp[key] = type(hp[key])(value)
        except ValueError:
            raise SystemExit(f"bench_peer: error: --hp {item!r}: {key} takes a {type(hp[key]).__name__}") from None
        rate = key.endswith("dropout")
        if not (0 <= hp[key] < 1 if rate else hp[key] > 0):
            raise SystemExit(f"bench_peer: error: --hp {item!r}: out of range "
                             f"({'a rate in [0, 1)' if rate else 'give a positive value'})")
    return hp


class Bftrec:
    """bftrec's SASRec trained one epoch at a time by its own trainer (``fit``, resumed each epoch)."""

    name = "bftrec"
    native_convention = "masked"  # its own validation is rank_users with history masked: reused, not redone

    def __init__(self, data, hp: dict, seed: int, targets: str, workdir: Path, fast: tuple = ()) -> None:
        self.data, self.hp, self.seed, self.dir = data, hp, seed, workdir
        self.tc = TrainerConfig(batch_size=hp["batch_size"], lr=hp["lr"], patience=10 ** 9, device="cpu",
                                num_threads=1, progress=False)
        if targets == "all":
            # RecBole's every-prefix expansion: one sample per training target, its loss alone, once per epoch
            self.tc.train_windows = "prefixes"
        for name in fast:  # FAST_PATHS: the trainer refuses one the setting cannot honour, in one line
            key, value = FAST_PATHS[name]
            setattr(self.tc, key, value)
        mc = merge_schema(SASRecConfig, {**{k: hp[k] for k in HP_KEYS if k in SASRecConfig.__dataclass_fields__},
                                         "loss": "ce"}, "model")
        seed_everything(seed, False)  # as bftrec.experiment.train_and_test: seed, then build the model
        info = DataInfo(n_items=data.n_items, train_counts=data.train_counts(), has_timestamps=False)
        self.model = SASRec(mc, LAYER_CONFIGS["standard"](), info)
        self.rng = torch.get_rng_state()  # the first epoch starts from it, as in a bftrec-train run
        self.epoch = 0
        self.targets_per_epoch = bftrec_train_targets(data, hp["max_len"], targets)
        self.valid_users = data.n_users

    def train_epoch(self) -> dict:
        """One epoch + bftrec's own validation (full ranking, history masked); times from history.csv."""
        self.epoch += 1
        self.tc.epochs = self.epoch
        self.tc.resume = str(self.dir) if self.epoch > 1 else None
        if self.epoch == 1:
            torch.set_rng_state(self.rng)  # later epochs: fit restores it from last.pt
        res = fit(self.model, self.data, self.tc, EvalConfig(ks=[10], mechanism=False), self.dir,
                  torch.device("cpu"), self.hp["max_len"], self.seed)
        row = res.history[-1]
        return {"loss": row["loss"], "train_s": row["train_seconds"], "eval_s": row["eval_seconds"],
                "train_cpu_s": row["train_cpu_seconds"], "eval_cpu_s": row["eval_cpu_seconds"],
                "native_valid": {"HR@10": row["valid_HR@10"], "NDCG@10": row["valid_NDCG@10"]}}

    def state(self) -> dict:
        """What resuming needs beyond ``last.pt`` in its folder: the epoch. ``fit`` restores weights,
        optimizer and RNG from ``last.pt`` at the next epoch (``self.rng`` only seeds epoch 1)."""
        return {"epoch": self.epoch}

    def load_state(self, state: dict) -> None:
        self.epoch = state["epoch"]

    def validate(self) -> dict:
        """bftrec's native validation, as ``fit`` runs it after an epoch: full ranking, history masked."""
        return common_metrics(self.model, self.data, "valid", self.hp["max_len"], "masked")

    def scorer(self) -> nn.Module:
        return self.model


class Peer:
    """RecBole's SASRec on the exported atomic files, trained with its own ``Trainer``."""

    name = "recbole"
    native_convention = None  # its own validation skips users with 3 interactions: always re-ranked here

    def __init__(self, rb: SimpleNamespace, data, hp: dict, seed: int, targets: str, workdir: Path,
                 eval_batch_size: int) -> None:
        export = export_atomic(data, workdir, "bench", hp["max_len"], targets)
        cfg = {
            "data_path": str(workdir), "checkpoint_dir": str(workdir / "saved"), "gpu_id": "", "use_gpu": False,
            "seed": seed, "reproducibility": True, "state": "WARNING", "show_progress": False, "worker": 0,
            "USER_ID_FIELD": "user_id", "ITEM_ID_FIELD": "item_id", "TIME_FIELD": "timestamp",
            "load_col": {"inter": ["user_id", "item_id", "timestamp"], "item": ["item_id"]},
            "MAX_ITEM_LIST_LENGTH": hp["max_len"], "hidden_size": hp["d_model"], "inner_size": hp["d_ff"],
            "n_layers": hp["n_layers"], "n_heads": hp["n_heads"], "hidden_dropout_prob": hp["dropout"],
            "attn_dropout_prob": hp["attn_dropout"], "hidden_act": "gelu", "initializer_range": 0.02,
            "loss_type": "CE", "train_neg_sample_args": None, "learner": "adam", "learning_rate": hp["lr"],
            "weight_decay": 0.0, "train_batch_size": hp["batch_size"], "eval_batch_size": eval_batch_size,
            "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "mode": "full", "group_by": "user"},
            "metrics": ["Hit", "NDCG"], "topk": [10], "valid_metric": "NDCG@10", "epochs": 10 ** 6,
        }
        with _cwd(workdir):  # RecBole's Trainer opens a tensorboard folder in the working directory
            self.config = rb.Config(model="SASRec", dataset="bench", config_dict=cfg)
            rb.init_seed(seed, True)
            dataset = rb.create_dataset(self.config)
            self.train_data, self.valid_data, self.test_data = rb.data_preparation(self.config, dataset)
            rb.init_seed(seed, True)
            self.model = rb.SASRec(self.config, self.train_data.dataset)
            self.trainer = rb.Trainer(self.config, self.model)
        self.rng = torch.get_rng_state()  # its own torch RNG stream, kept across the interleaved bftrec epochs
        self.trainer.eval_collector.data_collect(self.train_data)
        tokens = dataset.field2token_id["item_id"]
        b2r = np.zeros(data.n_items + 1, dtype=np.int64)
        for b in range(1, data.n_items + 1):
            b2r[b] = tokens[str(b)]
        self.b2r, self.export = b2r, export
        self.targets_per_epoch = len(self.train_data.dataset)
        self.valid_users = len(self.valid_data._dataset)  # one row per validated user
        self.epoch = 0

    def train_epoch(self) -> dict:
        """One ``Trainer._train_epoch`` + RecBole's own validation (``Trainer.evaluate``), timed here."""
        torch.set_rng_state(self.rng)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = self.trainer._train_epoch(self.train_data, self.epoch, show_progress=False)
        t1, c1 = time.perf_counter(), time.process_time()
        valid = self.validate()
        t2, c2 = time.perf_counter(), time.process_time()
        self.rng = torch.get_rng_state()
        self.epoch += 1
        return {"loss": float(loss) / max(len(self.train_data), 1), "train_s": t1 - t0, "eval_s": t2 - t1,
                "train_cpu_s": c1 - c0, "eval_cpu_s": c2 - c1, "native_valid": valid}

    def validate(self) -> dict:
        """RecBole's native validation (``Trainer.evaluate``: full ranking, history not masked)."""
        valid = self.trainer.evaluate(self.valid_data, load_best_model=False)
        return {"HR@10": float(valid["hit@10"]), "NDCG@10": float(valid["ndcg@10"])}

    def state(self) -> dict:
        """Weights, optimizer, both RNG streams (dropout; the training loader's shuffle) and the epoch."""
        return {"model": self.model.state_dict(), "optimizer": self.trainer.optimizer.state_dict(),
                "rng": self.rng, "loader_rng": self.train_data.generator.get_state(), "epoch": self.epoch}

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.trainer.optimizer.load_state_dict(state["optimizer"])
        self.train_data.generator.set_state(state["loader_rng"])
        self.rng, self.epoch = state["rng"], state["epoch"]

    def native_test(self) -> dict:
        res = self.trainer.evaluate(self.test_data, load_best_model=False)
        return {"HR@10": float(res["hit@10"]), "NDCG@10": float(res["ndcg@10"])}

    def scorer(self) -> nn.Module:
        return RecBoleScorer(self.model, self.b2r)


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def common_metrics(scorer: nn.Module, data, which: str, max_len: int, convention: str) -> dict:
    """HR@10 and NDCG@10 of ``scorer`` on split ``which`` ranked by ``bftrec.evaluation.rank_users``."""
    ev = EvalConfig(ks=[10], mechanism=False, exclude_history=convention == "masked")
    table = rank_users(scorer, data.items, data.offsets, data.timestamps, which, data.n_items, max_len,
                       data.train_counts(), ev, torch.device("cpu"))
    m = summarize(table["rank"].to_numpy(), (10,))
    return {"HR@10": m["HR@10"], "NDCG@10": m["NDCG@10"]}


# --------------------------------------------------------------------------- one run


@contextlib.contextmanager
def _run_dir(workdir: Path | None, dataset: str, seed: int):
    """``workdir/<dataset>-seed<seed>`` (kept: the run resumes from it), or a temporary folder."""
    if workdir is None:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    else:
        path = (workdir / f"{dataset}-seed{seed}").resolve()  # RecBole reads its files after a chdir
        path.mkdir(parents=True, exist_ok=True)
        yield path


def run_pair(rb: SimpleNamespace, dataset: str, seed: int, epochs: int, patience: int, hp: dict, targets: str,
             eval_batch_size: int, workdir: Path | None = None, fast: tuple = ()) -> dict:
    """Train both frameworks, interleaved, for at most ``epochs`` epochs each; a framework stops after
    ``patience`` epochs without a better validation NDCG@10 under either convention. Returns per-framework
    epochs and results.

    With ``workdir``, the state after each finished epoch (both frameworks' weights, optimizers and RNG
    streams, the rows and the best weights so far) is kept in ``workdir/<dataset>-seed<seed>/state.pt``,
    and a rerun with the same settings (dataset, seed, hyperparameters, targets, epochs, patience,
    scoring chunk, bftrec's fast paths ``fast`` (``FAST_PATHS`` names), and the commit of bftrec's code)
    continues from it. Raises SystemExit (one line),
    before anything is built, when that state was written with other settings."""
    data = load_dataset(dataset_config(dataset))
    settings = {"dataset": dataset, "seed": seed, "hp": hp, "targets": targets, "epochs": epochs, "patience": patience,
                "eval_batch_size": eval_batch_size, "bftrec_commit": CODE_STATE["git_sha"]}
    if fast:  # absent when none: states written before --fast resume
        settings["bftrec_fast_paths"] = sorted(set(fast))
    with _run_dir(workdir, dataset, seed) as tmp:
        state_file, state, start = tmp / "state.pt", None, 1
        if state_file.exists():
            state = torch.load(state_file, map_location="cpu", weights_only=False)
            if state["settings"] != settings:
                diff = {k: (state["settings"].get(k), v) for k, v in settings.items() if state["settings"].get(k) != v}
                raise SystemExit(f"bench_peer: error: {state_file} was written with other settings (was, now: "
                                 f"{diff}); rerun with the same ones, use another --workdir, or delete {tmp}")
        fw = {"bftrec": Bftrec(data, hp, seed, targets, tmp / "bftrec", fast)}
        (tmp / "bftrec").mkdir(exist_ok=True)
        (tmp / "recbole").mkdir(exist_ok=True)
        fw["recbole"] = Peer(rb, data, hp, seed, targets, tmp / "recbole", eval_batch_size)
        rows = {k: [] for k in fw}
        best = {k: {c: (-math.inf, 0, None) for c in CONVENTIONS} for k in fw}  # (valid NDCG@10, epoch, weights)
        if state is not None:
            rows, best, start = state["rows"], state["best"], state["epoch"] + 1
            for k in fw:
                fw[k].load_state(state["fw"][k])
            log.info("%s seed %d: resumed from %s after epoch %d", dataset, seed, state_file, state["epoch"])
        for epoch in range(start, epochs + 1):
            live = [k for k in fw if epoch - max(best[k][c][1] for c in CONVENTIONS) <= patience]
            if not live:
                break
            for k in live if epoch % 2 else live[::-1]:  # who goes first alternates
                row = {"epoch": epoch, **fw[k].train_epoch()}
                row["valid"] = {c: row["native_valid"] if c == fw[k].native_convention
                                else common_metrics(fw[k].scorer(), data, "valid", hp["max_len"], c)
                                for c in CONVENTIONS}
                for c in CONVENTIONS:
                    if row["valid"][c]["NDCG@10"] > best[k][c][0]:
                        best[k][c] = (row["valid"][c]["NDCG@10"], epoch, copy.deepcopy(fw[k].model.state_dict()))
                rows[k].append(row)
                log.info("%s %s seed %d epoch %d: loss %.4f train %.1fs eval %.1fs valid NDCG@10 %s", dataset, k,
                         seed, epoch, row["loss"], row["train_s"], row["eval_s"],
                         {c: round(row["valid"][c]["NDCG@10"], 4) for c in CONVENTIONS})
            if workdir is not None:  # written whole, then renamed: an interrupted save leaves the last one
                torch.save({"settings": settings, "epoch": epoch, "rows": rows, "best": best,
                            "fw": {k: f.state() for k, f in fw.items()}}, tmp / "state.pt.tmp")
                os.replace(tmp / "state.pt.tmp", state_file)
        out = {}
        for k, f in fw.items():
            train_s = sum(r["train_s"] for r in rows[k])
            eval_s = [r["eval_s"] for r in rows[k]]
            res = {"train_targets_per_epoch": f.targets_per_epoch,
                   "train_targets_per_s": f.targets_per_epoch * len(rows[k]) / train_s,
                   "valid_users": f.valid_users, "eval_users_per_s": f.valid_users * len(eval_s) / sum(eval_s),
                   "selected": {}, "epochs": rows[k]}
            if all("train_cpu_s" in r for r in rows[k]):  # CPU seconds of the process: steadier under load
                res["train_targets_per_cpu_s"] = (f.targets_per_epoch * len(rows[k])
                                                  / sum(r["train_cpu_s"] for r in rows[k]))
                res["eval_users_per_cpu_s"] = f.valid_users * len(eval_s) / sum(r["eval_cpu_s"] for r in rows[k])
            for c in CONVENTIONS:
                score, epoch, weights = best[k][c]
                f.model.load_state_dict(weights)
                sel = {"best_epoch": epoch, "valid_NDCG@10": score,
                       "seconds_to_best": sum(r["train_s"] + r["eval_s"] for r in rows[k][:epoch]),
                       "test": common_metrics(f.scorer(), data, "test", hp["max_len"], c)}
                if k == "recbole" and c == "unmasked":
                    sel["native_test"] = f.native_test()  # RecBole's own evaluator: a check of the adapter
                res["selected"][c] = sel
            out[k] = res
        out["recbole"]["export"] = {k: v for k, v in fw["recbole"].export.items() if k != "inter"}
        out["same_train_targets"] = fw["bftrec"].targets_per_epoch == fw["recbole"].targets_per_epoch
        if not out["same_train_targets"]:  # RecBole's LS split leaves out only the test item of a 2-row user
            out["note"] = (f"{int((np.diff(data.offsets) == 3).sum())} users have 3 interactions: RecBole's "
                           "leave-one-out puts their validation item into training and does not validate them")
        out["_data"] = data_summary(data)
    return out


def eval_speed(rb: SimpleNamespace, dataset: str, seed: int, hp: dict, reps: int, eval_batch_size: int) -> dict:
    """Full-ranking validation users/s of both frameworks, untrained (the cost of a forward does not depend
    on the weights): one untimed warm-up each, then ``reps`` timed validations each, interleaved, the order
    alternating. Each framework validates natively (as after every epoch of a run) over its own users."""
    data = load_dataset(dataset_config(dataset))
    with tempfile.TemporaryDirectory() as tmp:
        fw = {"bftrec": Bftrec(data, hp, seed, "window", Path(tmp) / "bftrec"),
              "recbole": Peer(rb, data, hp, seed, "window", Path(tmp) / "recbole", eval_batch_size)}
        for f in fw.values():
            f.model.eval()
            f.validate()  # warm-up
        seconds, cpu = {k: [] for k in fw}, {k: [] for k in fw}
        for rep in range(reps):
            for k in list(fw) if rep % 2 == 0 else list(fw)[::-1]:
                t0, c0 = time.perf_counter(), time.process_time()
                fw[k].validate()
                seconds[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
        out = {k: {"valid_users": fw[k].valid_users, "seconds": seconds[k], "cpu_seconds": cpu[k],
                   "users_per_s_median": fw[k].valid_users / float(np.median(seconds[k])),
                   "users_per_cpu_s_median": fw[k].valid_users / float(np.median(cpu[k]))} for k in fw}
    ratio = out["bftrec"]["users_per_s_median"] / out["recbole"]["users_per_s_median"]
    return {**out, "bftrec_over_recbole": ratio, "eval_users_per_s_at_least_3x": ratio >= 3,
            "data": data_summary(data)}


# --------------------------------------------------------------------------- summary


def summarize_runs(runs: list[dict]) -> dict:
    """Speed ratios (bftrec / RecBole) and the quality comparison per convention, over seeds."""
    if not all(r["same_train_targets"] for r in runs):
        log.warning("the two frameworks trained on different targets: %s", runs[0].get("note"))
    ratio = {m: float(np.mean([r["bftrec"][m] / r["recbole"][m] for r in runs]))
             for m in ("train_targets_per_s", "eval_users_per_s")}
    for m in ("train_targets_per_cpu_s", "eval_users_per_cpu_s"):  # CPU-time ratios, where every run has them
        if all(m in r[k] for r in runs for k in ("bftrec", "recbole")):
            ratio[m] = float(np.mean([r["bftrec"][m] / r["recbole"][m] for r in runs]))
    quality = {}
    for c in CONVENTIONS:
        b, p = (np.array([r[k]["selected"][c]["test"]["NDCG@10"] for r in runs]) for k in ("bftrec", "recbole"))
        q = {"bftrec_test_NDCG@10_mean": float(b.mean()), "recbole_test_NDCG@10_mean": float(p.mean()),
             "difference": float(b.mean() - p.mean()), "seeds": len(runs)}
        if len(runs) >= 2:  # two standard errors of the difference of the means
            noise = 2 * math.sqrt(b.var(ddof=1) / len(b) + p.var(ddof=1) / len(p))
            q.update(seed_noise_2se=noise, within_seed_noise=bool(abs(q["difference"]) <= noise))
        else:
            q["within_seed_noise"] = None  # one seed: no noise estimate
        quality[c] = q
    speed = {"train_targets_per_s_at_least_5x": ratio["train_targets_per_s"] >= 5,  # the issue: on Sports, CE
             "train_targets_per_s_at_least_3x": ratio["train_targets_per_s"] >= 3,  # issue 49: ml-100k, prefixes
             "eval_users_per_s_at_least_3x": ratio["eval_users_per_s"] >= 3}
    return {"bftrec_over_recbole": ratio, "speed_targets_met": speed, "quality": quality}


def progress(workdir: Path, datasets: list[str], seeds: list[int]) -> dict:
    """No training: what a ``--workdir`` run has done so far, read from each ``<dataset>-seed<seed>/state.pt``:
    its settings, the last finished epoch, each framework's per-epoch rows (loss, seconds, validation under
    both conventions) and its best validation NDCG@10 so far per convention. Test is never scored here.
    Raises SystemExit (one line) when a requested run has no state, or one that is not a bench_peer state."""
    runs = {}
    for name in datasets:
        for seed in seeds:
            path = workdir / f"{name}-seed{seed}" / "state.pt"
            if not path.exists():
                raise SystemExit(f"bench_peer: error: no {path}; --progress reads a --workdir run, start it first")
            try:
                state = torch.load(path, map_location="cpu", weights_only=False)
                rows_of, best_of, settings, last = state["rows"], state["best"], state["settings"], state["epoch"]
            except Exception as e:  # a torn or foreign file: one line, not a traceback
                raise SystemExit(f"bench_peer: error: {path} is not a bench_peer state ({type(e).__name__}: {e}); "
                                 "rerun the run without --progress, or delete it") from None
            fw = {}
            for k, rows in rows_of.items():
                best = {c: {"valid_NDCG@10": v if math.isfinite(v) else None, "epoch": e}
                        for c, (v, e, _) in best_of[k].items()}
                fw[k] = {"epochs_done": len(rows), "best_so_far": best,
                         "epochs": [{"epoch": r["epoch"], "loss": r["loss"], "train_s": r["train_s"],
                                     "eval_s": r["eval_s"], "train_cpu_s": r.get("train_cpu_s"),
                                     "eval_cpu_s": r.get("eval_cpu_s"), "valid": r["valid"]} for r in rows]}
            runs[f"{name}-seed{seed}"] = {"settings": settings, "last_epoch": last, "frameworks": fw}
    return runs


def write_json(result: dict, out: Path) -> None:
    """Write ``result`` to ``out``; called after each dataset, so a partial result survives."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def data_summary(data) -> dict:
    """Users, items and interactions of a loaded dataset, as recorded in the JSON."""
    return {"users": data.n_users, "items": data.n_items, "interactions": int(len(data.items))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "sports"], help="bftrec dataset names")
    ap.add_argument("--epochs", type=cli.at_least(1), default=200, help="most epochs per framework")
    ap.add_argument("--patience", type=cli.at_least(1), default=10,
                    help="a framework stops after this many epochs without a better valid NDCG@10 (either convention)")
    ap.add_argument("--seeds", type=cli.int_list, default=[0], help="comma-separated seeds")
    ap.add_argument("--targets", choices=("window", "all"), default="window",
                    help="training targets: bftrec's window (RecBole fed truncated sequences) or all prefixes")
    ap.add_argument("--hp", nargs="*", default=[], help="hyperparameter overrides, e.g. max_len=50 batch_size=128")
    ap.add_argument("--fast", nargs="*", default=[], choices=sorted(FAST_PATHS),
                    help="bftrec's opt-in trainer fast paths (same model; last_position_only needs --targets all)")
    ap.add_argument("--eval-batch-size", type=cli.at_least(1), default=1024,
                    help="users per scoring chunk, both frameworks")
    ap.add_argument("--trial", action="store_true", help="mark the JSON as a trial (small budget)")
    ap.add_argument("--eval-speed", type=int, metavar="REPS", default=0,
                    help="no training: time REPS full-ranking validations per framework, interleaved "
                         "(default out: results/bench/peer_eval_cpu.json)")
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default results/bench/peer_cpu.json)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="keep each run's state here after every epoch; rerunning the same command resumes "
                         "(default: a temporary folder, no resume)")
    ap.add_argument("--progress", action="store_true",
                    help="no training: write what the --workdir runs have done so far (per-epoch validation, "
                         "best so far; no test) to --out, marked unfinished; RecBole not needed")
    args = ap.parse_args(argv)
    if args.progress:
        if args.workdir is None or args.out is None:
            ap.error("--progress reads --workdir and writes --out; give both")
        seeds = args.seeds
        write_json({"command": "python " + " ".join([Path(sys.argv[0]).as_posix(),
                                                      *(argv if argv is not None else sys.argv[1:])]),
                    "date": datetime.now().isoformat(timespec="seconds"), "finished": False,
                    "note": "a run in progress: validation so far, no test; the same command without "
                            "--progress resumes it and writes the final JSON, from a checkout at the run's "
                            "settings.bftrec_commit (a state written at another commit is refused)",
                    "runs": progress(args.workdir, args.datasets, seeds)}, args.out)
        return
    if args.eval_speed < 0:
        ap.error(f"--eval-speed {args.eval_speed} must be >= 0 (0 = train and compare)")
    if "last_position_only" in args.fast and args.targets != "all":
        ap.error("--fast last_position_only needs --targets all (prefixes: one loss position per window)")
    if args.out is None:
        args.out = REPO / "results" / "bench" / ("peer_eval_cpu.json" if args.eval_speed else "peer_cpu.json")
    rb = import_recbole()  # first: without RecBole, fail in one line before any data is read
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", force=True)
    for name in ("bench_peer", "bftrec"):  # RecBole logs to the root logger: only its warnings show
        logging.getLogger(name).setLevel(logging.INFO)
    torch.set_num_threads(1)
    seeds = args.seeds
    result = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now().isoformat(timespec="seconds"), "trial": args.trial,
        "budget": ({"reps": args.eval_speed, "seeds": seeds[:1], "threads": 1, "training": "none"}
                   if args.eval_speed else {"max_epochs": args.epochs, "patience": args.patience, "seeds": seeds,
                                            "threads": 1, "targets": args.targets}),
        "bftrec_code": CODE_STATE, "bftrec_fast_paths": sorted(set(args.fast)), "device": cpu_name(),
        "torch": torch.__version__, "numpy": np.__version__,
        "recbole": rb.version,
        "recbole_anomaly_mode": {"on_after_import": rb.anomaly_at_import, "on_during_runs": torch.is_anomaly_enabled()},
        "conventions": {"masked": "history items are not candidates (bftrec default)",
                        "unmasked": "only padding excluded (RecBole for sequential models)",
                        "rule": "selection and test under the same convention; never compared across"},
        "datasets": {},
    }
    if args.eval_speed:
        for name in args.datasets:
            hp = hyperparameters(name, args.hp)
            result["datasets"][name] = {"hyperparameters": {**hp, "loss": "ce"},
                                        **eval_speed(rb, name, seeds[0], hp, args.eval_speed, args.eval_batch_size)}
            write_json(result, args.out)
        print(json.dumps({n: {k: d[k] for k in ("bftrec_over_recbole", "eval_users_per_s_at_least_3x")}
                          for n, d in result["datasets"].items()}, indent=2))
        return
    for name in args.datasets:
        hp = hyperparameters(name, args.hp)
        runs = [run_pair(rb, name, s, args.epochs, args.patience, hp, args.targets, args.eval_batch_size,
                         args.workdir, tuple(args.fast)) for s in seeds]
        result["datasets"][name] = {"hyperparameters": {**hp, "loss": "ce"}, **summarize_runs(runs),
                                    "data": runs[0].pop("_data"), "runs": runs}
        for r in runs[1:]:
            r.pop("_data")
        write_json(result, args.out)
    print(json.dumps({n: {k: d[k] for k in ("bftrec_over_recbole", "speed_targets_met", "quality")}
                      for n, d in result["datasets"].items()}, indent=2))


if __name__ == "__main__":
    main()
