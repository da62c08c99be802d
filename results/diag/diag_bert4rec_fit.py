"""Why does BERT4Rec fit slowly? One-factor-at-a-time diagnosis on a tiny controlled setup.

Setup (issue 11 item 5): the first ``--users`` users of ml-100k, D=32, 2 blocks, 2 heads, F=128,
L=50, full batch (one step per epoch), Adam, ``--epochs`` epochs, 1 thread. For every variant it
reports, averaged over ``--seeds`` seeds:

- ``train_drop``: 1 - (mean training loss of the last 5 epochs) / (first epoch's), the figure of the
  issue (a cloze loss for BERT4Rec, a next-item CE for SASRec/HSTU: not the same task);
- ``last_ce``: the comparable figure, in eval mode: full-softmax CE of each user's last training item
  given the items before it (BERT4Rec: history + [MASK]; SASRec/HSTU: the next-item position),
  divided by log N (1.0 = uniform guessing);
- ``valid_ndcg``: full-ranking validation NDCG@10 of those users (history excluded).

Usage: PYTHONPATH=$PWD python results/diag/diag_bert4rec_fit.py --out results/diag/bert4rec_fit.json
Needs BFTREC_DATA_ROOT (ml-100k). Prints a table; writes JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch import nn

import bftrec.models  # noqa: F401  registers the backbones
from bftrec.config import EvalConfig
from bftrec.data.batches import trim_left
from bftrec.data.datasets import dataset_config, load_dataset
from bftrec.evaluation import rank_users
from bftrec.layers import LAYER_CONFIGS
from bftrec.metrics import summarize
from bftrec.models import MODELS, DataInfo
from bftrec.models.base import next_item_loss
from bftrec.trainer import training_tensors

BASE = dict(d_model=32, n_layers=2, n_heads=2, d_ff=128, max_len=50, dropout=0.1, attn_dropout=0.1)

# name -> (backbone, model overrides, run options); one factor changed from "bert4rec (as is)"
VARIANTS = {
    "bert4rec (as is)": ("bert4rec", {}, {}),
    "mask_prob 0.1": ("bert4rec", {"mask_prob": 0.1}, {}),
    "mask_prob 0.4": ("bert4rec", {"mask_prob": 0.4}, {}),
    "mask_prob 0.6": ("bert4rec", {"mask_prob": 0.6}, {}),
    "last_item_mask_share 0": ("bert4rec", {"last_item_mask_share": 0.0}, {}),
    "last_item_mask_share 0.5": ("bert4rec", {"last_item_mask_share": 0.5}, {}),
    "last_item_mask_share 1": ("bert4rec", {"last_item_mask_share": 1.0}, {}),
    "lr 0.001": ("bert4rec", {}, {"lr": 0.001}),
    "lr 0.003": ("bert4rec", {}, {"lr": 0.003}),
    "lr 0.03": ("bert4rec", {}, {"lr": 0.03}),
    "warm-up 10 steps (linear)": ("bert4rec", {}, {"warmup": 10}),
    "loss: mean per sequence": ("bert4rec", {}, {"per_sequence_loss": True}),
    "head: tied only (model.head=tied)": ("bert4rec", {"head": "tied"}, {}),
    "head: no output bias": ("bert4rec", {}, {"head": "no_bias"}),
    "init: truncated normal": ("bert4rec", {}, {"trunc_init": True}),
    "dropout 0": ("bert4rec", {"dropout": 0.0, "attn_dropout": 0.0}, {}),
    "4x epochs": ("bert4rec", {}, {"epochs_x": 4}),
    "bert4rec: same masks every epoch": ("bert4rec", {}, {"fixed_masks": True}),
    "sasrec": ("sasrec", {}, {}),
    "sasrec, 20% of targets kept": ("sasrec", {}, {"keep_targets": 0.2}),
    "hstu (ce, no time bias)": ("hstu", {"loss": "ce", "n_heads": 1, "attn_dropout": 0.0, "time_bias": False}, {}),
}


def subset(data, n_users: int):
    """The first ``n_users`` users of a SeqData (item ids unchanged)."""
    end = int(data.offsets[n_users])
    ts = data.timestamps[:end] if data.timestamps is not None else None
    return dataclasses.replace(data, items=data.items[:end], timestamps=ts, offsets=data.offsets[: n_users + 1],
                               user_ids=data.user_ids[:n_users])


def swap_head(model: nn.Module, head: str) -> None:
    if head == "no_bias":
        model.out_bias.requires_grad_(False)


def trunc_init(model: nn.Module, std: float) -> None:
    """Re-draw every Linear/Embedding weight from N(0, std) truncated at +-2 std (BERT's initializer)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                nn.init.zeros_(m.weight.data[m.padding_idx])


@torch.no_grad()
def last_item_ce(model, seqs: torch.Tensor, n_items: int) -> float:
    """Mean CE (nats) of each window's last item given the items before it, eval mode."""
    model.eval()
    hist, target = seqs[:, :-1], seqs[:, -1]  # (U, L), (U,)
    scores = model.score_items({"item_seq": hist})[:, 1:]  # (U, N) items 1..N
    scale = 1.0 / getattr(model.cfg, "temperature", 1.0)  # HSTU scores are cosines; its loss divides by T
    return float(F.cross_entropy(scores * scale, target - 1))


def per_sequence_loss(model):
    """Cloze CE averaged per sequence, then over sequences (each sequence weighs the same)."""
    def loss(batch):
        seq = batch["seq"][:, -model.cfg.max_len:]  # (B, L)
        inputs, targets = model.cloze(seq)
        h = model.head(model.encode(inputs))  # (B, L, D)
        n = model.n_items
        logits = h @ model.item_emb.weight[1: n + 1].t() + model.out_bias[1: n + 1]  # (B, L, N)
        keep = targets.ne(0)
        ce = F.cross_entropy(logits.flatten(0, 1), (targets - 1).clamp(min=0).flatten(), reduction="none")
        ce = ce.view(seq.shape) * keep  # (B, L)
        return (ce.sum(1) / keep.sum(1).clamp(min=1)).mean()
    return loss


def fixed_masks(model):
    """The cloze masks of every step drawn from one fixed seed: the same (input, target) pairs each epoch."""
    orig = model.cloze

    def cloze(seq):
        with torch.random.fork_rng():
            torch.manual_seed(12345)
            return orig(seq)
    model.cloze = cloze


def kept_targets(model, share: float):
    """SASRec's next-item loss on a random ``share`` of the positions (the rest get no target)."""
    def loss(batch):
        seq = batch["seq"]  # (B, L + 1)
        inputs, targets = seq[:, :-1], seq[:, 1:] * seq[:, :-1].ne(0)  # (B, L)
        targets = targets * (torch.rand(targets.shape) < share)
        return next_item_loss(model.encode(inputs), targets, model.item_emb.weight, "ce", 0, model.n_items)
    return loss


def run(name: str, data, seed: int, args) -> dict:
    backbone, over, opts = VARIANTS[name]
    torch.manual_seed(seed)
    cls = MODELS.get(backbone)
    cfg = cls.Config(**{**BASE, **over})
    info = DataInfo(n_items=data.n_items, train_counts=data.train_counts(), has_timestamps=data.timestamps is not None)
    model = cls(cfg, LAYER_CONFIGS["standard"](), info)
    if opts.get("trunc_init"):
        trunc_init(model, cfg.init_std)
    swap_head(model, opts.get("head", ""))
    if opts.get("fixed_masks"):
        fixed_masks(model)
    loss_fn = model.training_loss
    if opts.get("per_sequence_loss"):
        loss_fn = per_sequence_loss(model)
    if opts.get("keep_targets"):
        loss_fn = kept_targets(model, opts["keep_targets"])
    seqs, times = training_tensors(data, cfg.max_len, torch.device("cpu"))  # (U, L + 1)
    batch = {"seq": trim_left(seqs)} if times is None else dict(zip(("seq", "time"), trim_left(seqs, times)))
    lr = opts.get("lr", args.lr)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    warm = opts.get("warmup", 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
    epochs = args.epochs * opts.get("epochs_x", 1)
    ce0 = last_item_ce(model, seqs, data.n_items)
    losses, t0 = [], time.time()
    for _ in range(epochs):
        model.train()
        loss = loss_fn(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    ce1 = last_item_ce(model, seqs, data.n_items)
    table = rank_users(model, data.items, data.offsets, data.timestamps, "valid", data.n_items, cfg.max_len,
                       data.train_counts(), EvalConfig(), torch.device("cpu"))
    valid = summarize(table["rank"].to_numpy(), (10,))
    logn = math.log(data.n_items)
    return {"variant": name, "seed": seed, "epochs": epochs, "loss_first": losses[0],
            "loss_last5": float(np.mean(losses[-5:])), "train_drop": 1 - float(np.mean(losses[-5:])) / losses[0],
            "last_ce_start": ce0 / logn, "last_ce": ce1 / logn, "valid_ndcg": valid["NDCG@10"],
            "seconds": time.time() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=100)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    p.add_argument("--out", type=Path, default=Path("results/diag/bert4rec_fit.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    data = subset(load_dataset(dataset_config("ml-100k")), args.users)
    rows = [run(n, data, s, args) for n in (args.only or VARIANTS) for s in range(args.seeds)]
    keys = ("train_drop", "last_ce_start", "last_ce", "valid_ndcg", "seconds")
    summary = []
    for n in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == n]
        means = {k: float(np.mean([r[k] for r in rs])) for k in keys}
        summary.append({"variant": n, "epochs": rs[0]["epochs"], **means})
    print(tabulate(summary, headers="keys", floatfmt=".3f"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"setup": {**vars(args), "out": str(args.out), "base": BASE,
                                              "n_items": data.n_items}, "summary": summary, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
