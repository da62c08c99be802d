"""Cost of a Sports full-softmax (CE) training epoch against the matmul-FLOP bound. Never a timed test.

SASRec on Amazon Sports (35,598 users, 18,357 items) at its tuned config
(``configs/tuned/sports_sasrec.yaml``) with ``model.loss=ce``, CPU, ``--threads`` (default 1):

- **FLOP per epoch**: forward + backward matmul FLOPs (3x the forward: one GEMM for the inputs' and
  one for the weights' gradient per forward GEMM) of the encoder (QKV, output and FFN projections,
  QK^T and AV per block) and of the softmax head (``2 P N D`` forward), summed over the batches the
  trainer produces for epoch 1 (``bftrec.trainer.epoch_batches`` with length bucketing, each batch
  trimmed by ``trim_left``: the real (B, L') shapes and target counts P). The formula is checked
  against ``torch.utils.flop_counter.FlopCounterMode`` on real batches (``flop_check``).
- **GEMM rate**: the three head GEMMs ``torch.mm`` at the FLOP-weighted median batch's shapes, (P, D) x (D, N),
  (P, N) x (N, D) and (N, P) x (P, D), outputs preallocated, best of ``--gemm-reps``; one thread.
- **Epoch time**: ``--steps`` trainer steps (zero_grad, loss, backward, Adam) on batches spread evenly over
  epoch 1 after ``--warmup`` steps (the first warm-up step is the epoch's largest batch, so the peak
  memory covers the whole epoch), extrapolated to the epoch by FLOP: ``epoch_s = timed_s x
  epoch_flop / timed_flop`` (the step-count extrapolation is recorded too). Times are the process
  CPU time (``time.process_time``; one thread, so robust to other jobs on a shared machine) and wall.
- **Distance from the bound**: ``timed_s / (timed_flop / gemm_rate)``, per clock.
- **Evaluation**: CPU seconds of one full-ranking pass over the validation users (default ``eval``).
- **Peak RSS**: each variant runs in a fresh process; ``resource.getrusage(RUSAGE_SELF).ru_maxrss``
  at its end (the whole process: interpreter, torch, data, model, optimizer, steps).

Training windows are the tuned config's (``trainer.train_windows``: ``prefixes`` for Sports since 2026-12-05, one
window per training target with the loss at its last column), cut, batched and trimmed by the trainer's own
functions (``train_window_set``, ``epoch_batches``, ``trim_left``).

Variants: ``chunked`` (the default CE head, ``model.ce_chunk``), ``plain`` (``model.ce_chunk=0``, the
materialised reference), ``legacy`` (the head before issue 11.3, copied below: logits over the whole table
divided by the temperature, column 0 overwritten in place, ``F.cross_entropy``) and ``fast`` (``chunked`` with
the trainer's opt-in fast paths: ``trainer.last_position_only`` under ``prefixes``, ``trainer.dropout=mask``,
``trainer.fused_optimizer``; docs/results.md §3.1).

Two bounds per variant: ``bound_s``, the FLOPs that variant computes at the measured GEMM rates, and
``needed_bound_s``, the FLOPs of the last-position computation (under ``prefixes``: the last block's attention,
query, output projection and FFN at the last position alone, its keys and values at every position, as ``fast``
computes them).
The GEMM rates are measured at the epoch's shapes, the head's three GEMMs at the FLOP-weighted median P and the
encoder's projection GEMMs at the FLOP-weighted median B·L'; a class of FLOPs is charged at its own rate.
A chunk sweep times the head alone (forward + backward) at that batch's P: it chose ``CE_CHUNK``.

Usage (needs ``$BFTREC_DATA_ROOT`` holding Amazon Sports)::

    BFTREC_DATA_ROOT=/work/shared/data .venv/bin/python scripts/bench_train.py --threads 1

Writes ``results/bench/train_cpu.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bftrec.data.batches import trim_left  # noqa: E402
from bftrec.experiment import code_stamp  # noqa: E402
from bftrec.models import base  # noqa: E402
from bftrec.trainer import (  # noqa: E402
    _optimizer,
    epoch_batches,
    seed_everything,
    step_batch,
    train_window_set,
    use_mask_dropout,
)
from scripts import _cli as cli  # noqa: E402

log = logging.getLogger("bench_train")
VARIANTS = ("legacy", "plain", "chunked", "fast")
DEFAULT_VARIANTS = ("chunked", "fast")
OVERRIDES = ["dataset=sports", "model=sasrec", "model.loss=ce", "trainer.device=cpu"]
SWEEP = (32, 64, 128, 256, 512, 1024)


# ------------------------------------------------------------------------------------------------ setup
def build(variant: str, threads: int):
    """(model, data, trainer config, seed) at the tuned Sports config; ``variant`` picks the CE head."""
    from hydra import compose, initialize_config_dir

    from bftrec.config import CONFIG_DIR
    from bftrec.experiment import build as build_model
    from bftrec.experiment import typed_groups

    torch.set_num_threads(threads)
    over = OVERRIDES + [f"trainer.num_threads={threads}"] + (["model.ce_chunk=0"] if variant in ("plain", "legacy")
                                                             else [])
    if variant == "fast":
        over += ["trainer.dropout=mask", "trainer.fused_optimizer=true"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("train", overrides=over)
    g = typed_groups(cfg)
    if variant == "fast" and g["trainer"].train_windows == "prefixes":
        g["trainer"].last_position_only = True
    seed_everything(g["root"].seed, False)
    data, _, model = build_model(g, torch.device("cpu"))
    if variant == "legacy":
        import bftrec.models.sasrec as sasrec

        sasrec.next_item_loss = legacy_next_item_loss
    return model, data, g["trainer"], g["root"].seed, g["model"]


def legacy_next_item_loss(h, targets, item_emb, loss, n_negatives, n_items, bias=None, temperature=1.0,
                          ce_chunk=0, negatives_per="batch"):
    """The CE head before issue 11.3 (bftrec/models/base.py at 5d95b5d), for the "before" figure (the arguments
    the model passes today are accepted; CE uses no negatives)."""
    keep = targets.ne(0)
    h, pos = h[keep], targets[keep]  # (P, D), (P,)
    logits = h @ item_emb[: n_items + 1].t()  # (P, N + 1)
    logits = logits / temperature
    logits[:, 0] = torch.finfo(logits.dtype).min  # in place: autograd clones the (P, N + 1) gradient
    return F.cross_entropy(logits.float(), pos)


def epoch_shapes(data, tc, seed: int, max_len: int):
    """Epoch 1's batches as the trainer builds them (its windows, order and trimming): the window set and a
    list of (row indices, B, L', P), P the loss positions (one per window under ``prefixes``)."""
    tw = train_window_set(data, max_len, torch.device("cpu"), tc.train_windows, tc.train_window_stride)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for idx in epoch_batches(tw.lengths(), tc.batch_size, gen, 0, 1, tc.length_bucketing):
        seq = trim_left(tw.batch(idx)["seq"])  # (B, L' + 1)
        pairs = seq[:, 1:].ne(0) & seq[:, :-1].ne(0)  # (B, L') input and target both real
        P = int((pairs[:, -1] if tc.train_windows == "prefixes" else pairs).sum())
        out.append((idx, seq.shape[0], seq.shape[1] - 1, P))
    return tw, out


def flop(B: int, L: int, P: int, mc, n_items: int, last_only: bool = False) -> dict:
    """Forward + backward matmul FLOPs of one SASRec step: encoder and head (3x the forward). ``last_only``:
    the last block projects keys and values at all L positions (attention needs them) but the query,
    attention, output projection and FFN at the last one alone (``trainer.last_position_only``)."""
    D, F_, T = mc.d_model, mc.d_ff, B * L
    full = T * (2 * D * 3 * D + 2 * D * D + 2 * 2 * D * F_) + 2 * 2 * B * L * L * D  # one block, every position
    last = T * 2 * D * 2 * D + B * (2 * D * 2 * D + 2 * 2 * D * F_) + 2 * 2 * B * L * D  # KV at all; Q, out, FFN at 1
    enc = (mc.n_layers - 1) * full + (last if last_only else full)
    return {"encoder": 3 * enc, "head": 3 * 2 * P * n_items * D}


# ------------------------------------------------------------------------------------------------ measures
def _best_cpu_s(calls: dict, reps: int) -> dict:
    """Best CPU seconds of each call over ``reps`` runs after one warm-up run."""
    best = {}
    for name, f in calls.items():
        f()
        ts = []
        for _ in range(reps):
            t0 = time.process_time()
            f()
            ts.append(time.process_time() - t0)
        best[name] = min(ts)
    return best


def gemm_rate(P: int, N: int, D: int, reps: int) -> dict:
    """GFLOP/s of the three head GEMMs at (P, N, D), outputs preallocated, best of ``reps`` (CPU time)."""
    g = torch.Generator().manual_seed(0)
    h, W, G = torch.randn(P, D, generator=g), torch.randn(N, D, generator=g), torch.rand(P, N, generator=g)
    o1, o2, o3 = torch.empty(P, N), torch.empty(P, D), torch.empty(N, D)
    best = _best_cpu_s({"h @ W^T (P, N)": lambda: torch.mm(h, W.t(), out=o1),
                        "G @ W (P, D)": lambda: torch.mm(G, W, out=o2),
                        "G^T @ h (N, D)": lambda: torch.mm(G.t(), h, out=o3)}, reps)
    fl = 2 * P * N * D
    return {"P": P, "N": N, "D": D, "per_gemm_gflops": {k: fl / v / 1e9 for k, v in best.items()},
            "gflops": 3 * fl / sum(best.values()) / 1e9}


def encoder_gemm_rate(T: int, D: int, F_: int, reps: int) -> dict:
    """GFLOP/s of the encoder's projection GEMMs at T tokens (QKV (T, D) x (D, 3D), FFN in (T, D) x (D, F), FFN
    out (T, F) x (F, D)), outputs preallocated, best of ``reps`` (CPU time), FLOP-weighted over the three."""
    g = torch.Generator().manual_seed(0)
    x, h = torch.randn(T, D, generator=g), torch.randn(T, F_, generator=g)
    w_qkv, w1, w2 = (torch.randn(D, 3 * D, generator=g), torch.randn(D, F_, generator=g),
                     torch.randn(F_, D, generator=g))
    o_qkv, o1, o2 = torch.empty(T, 3 * D), torch.empty(T, F_), torch.empty(T, D)
    best = _best_cpu_s({"QKV (T, D) x (D, 3D)": lambda: torch.mm(x, w_qkv, out=o_qkv),
                        "FFN in (T, D) x (D, F)": lambda: torch.mm(x, w1, out=o1),
                        "FFN out (T, F) x (F, D)": lambda: torch.mm(h, w2, out=o2)}, reps)
    fl = {"QKV (T, D) x (D, 3D)": 2 * T * D * 3 * D, "FFN in (T, D) x (D, F)": 2 * T * D * F_,
          "FFN out (T, F) x (F, D)": 2 * T * F_ * D}
    return {"T": T, "D": D, "F": F_, "per_gemm_gflops": {k: fl[k] / v / 1e9 for k, v in best.items()},
            "gflops": sum(fl.values()) / sum(best.values()) / 1e9}


def weighted_median(values: list[int]) -> int:
    """The value at which the running sum of the sorted values first reaches half their total."""
    v = sorted(values)
    return int(next(x for x, c in zip(v, np.cumsum(v)) if c >= sum(v) / 2))


def chunk_sweep(P: int, N: int, D: int, reps: int) -> dict:
    """CPU seconds of the CE head alone (loss + backward) at (P, N, D): plain and each chunk size."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(P, D, generator=g).requires_grad_()
    W = (torch.randn(N, D, generator=g) * 0.1).requires_grad_()
    t = torch.randint(0, N, (P,), generator=g)
    fns = {"plain": lambda: base.plain_ce(h, t, W)}
    fns.update({str(c): (lambda c=c: base.chunked_ce(h, t, W, chunk=c)) for c in SWEEP})
    times: dict = {k: [] for k in fns}
    for rep in range(reps + 1):  # round-robin; the first round warms up
        for k, f in fns.items():
            t0 = time.process_time()
            f().backward()
            h.grad = W.grad = None
            if rep:
                times[k].append(time.process_time() - t0)
    return {"P": P, "min_cpu_s": {k: min(v) for k, v in times.items()}}


def run_variant(variant: str, steps: int, warmup: int, threads: int) -> dict:
    """Child process: time the trainer steps of one variant; peak RSS at the end."""
    model, data, tc, seed, mc = build(variant, threads)
    tw, shapes = epoch_shapes(data, tc, seed, mc.max_len)
    if tc.dropout == "mask":
        use_mask_dropout(model)
    opt = _optimizer(model, tc)
    model.train()
    biggest = max(range(len(shapes)), key=lambda i: (shapes[i][1] * shapes[i][2], shapes[i][3]))  # tokens, then P
    rest = [i for i in range(len(shapes)) if i != biggest]
    # warm-up: the biggest batch, then the next ones; timed: --steps batches spread evenly over the rest of the
    # epoch's order (a sample of every length, whatever the order)
    warm = [biggest] + rest[: max(warmup - 1, 0)]
    left = rest[max(warmup - 1, 0):]
    timed = [left[j] for j in np.unique(np.linspace(0, len(left) - 1, min(steps, len(left))).round().astype(int))]
    order = warm + timed
    cpu = wall = 0.0
    for k, i in enumerate(order):
        batch = step_batch(tw, shapes[i][0], tc)
        c0, w0 = time.process_time(), time.perf_counter()
        loss = model.training_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if k >= len(warm):
            cpu, wall = cpu + time.process_time() - c0, wall + time.perf_counter() - w0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"timed_batches": timed, "timed_cpu_s": cpu, "timed_wall_s": wall, "peak_rss_bytes": peak,
            "biggest_batch_P": shapes[biggest][3], "biggest_batch_tokens": shapes[biggest][1] * shapes[biggest][2],
            "n_batches": len(shapes),
            "fast_paths": {"last_position_only": tc.last_position_only, "dropout": tc.dropout,
                           "fused_optimizer": tc.fused_optimizer}}


def flop_check(model, tw, shapes, mc, tc, n_items: int, picks) -> list:
    """The formula against FlopCounterMode on a few real batches (loss + backward), with the plain head:
    FlopCounterMode counts the autograd GEMMs but not the chunked head's in-place ``addmm_``. Under
    ``prefixes`` each batch is counted with and without ``last_position_only``."""
    from dataclasses import replace

    from torch.utils.flop_counter import FlopCounterMode

    out = []
    chunk, model.cfg.ce_chunk = model.cfg.ce_chunk, 0
    modes = (False, True) if tc.train_windows == "prefixes" else (False,)
    for i in picks:
        idx, B, L, P = shapes[i]
        for last_only in modes:
            with FlopCounterMode(display=False) as fc:
                model.training_loss(step_batch(tw, idx, replace(tc, last_position_only=last_only))).backward()
            model.zero_grad(set_to_none=True)
            f = flop(B, L, P, mc, n_items, last_only)
            out.append({"B": B, "L": L, "P": P, "last_position_only": last_only, "formula": f["encoder"] + f["head"],
                        "counted": fc.get_total_flops()})
    model.cfg.ce_chunk = chunk
    return out


def eval_cost(model, data, max_len: int) -> dict:
    """CPU seconds of one full-ranking pass over the validation users (default eval config)."""
    from bftrec.config import EvalConfig
    from bftrec.evaluation import rank_users

    cfg = EvalConfig()
    t0 = time.process_time()
    rank_users(model, data.items, data.offsets, data.timestamps, "valid", data.n_items, max_len,
               data.train_counts(), cfg, torch.device("cpu"))
    return {"users": int(data.n_users), "eval_batch_size": cfg.batch_size, "cpu_s": time.process_time() - t0}


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=cli.at_least(1), default=1)
    ap.add_argument("--steps", type=cli.at_least(1), default=30, help="timed steps per variant")
    ap.add_argument("--warmup", type=cli.at_least(0), default=2,
                    help="untimed steps first (the first: the largest batch)")
    ap.add_argument("--gemm-reps", type=cli.at_least(1), default=5)
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench" / "train_cpu.json"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.child:
        print(json.dumps(run_variant(a.child, a.steps, a.warmup, a.threads)))
        return
    if not os.environ.get("BFTREC_DATA_ROOT"):
        sys.exit("bench_train.py: error: set BFTREC_DATA_ROOT to the folder holding Amazon Sports")
    unknown = sorted(set(a.variants.split(",")) - set(VARIANTS))
    if unknown:
        ap.error(f"--variants {','.join(unknown)}: unknown; choose from {', '.join(VARIANTS)}")
    started, load0 = time.time(), os.getloadavg()
    model, data, tc, seed, mc = build("chunked", a.threads)
    N, D = data.n_items, mc.d_model
    tw, shapes = epoch_shapes(data, tc, seed, mc.max_len)
    prefixes = tc.train_windows == "prefixes"
    per = {lo: [flop(B, L, P, mc, N, lo) for _, B, L, P in shapes] for lo in ((False, True) if prefixes else (False,))}
    needed = per[prefixes]  # the FLOPs the loss needs: under prefixes, the last block at the last position only
    epoch = {lo: {"gflop": sum(f["encoder"] + f["head"] for f in fs) / 1e9,
                  "gflop_head": sum(f["head"] for f in fs) / 1e9,
                  "gflop_encoder": sum(f["encoder"] for f in fs) / 1e9} for lo, fs in per.items()}
    P_med = weighted_median([s[3] for s in shapes])  # FLOP-weighted median of the head's P
    T_med = weighted_median([s[1] * s[2] for s in shapes])  # and of the encoder's tokens B·L'
    rate = gemm_rate(P_med, N, D, a.gemm_reps)
    enc_rate = encoder_gemm_rate(T_med, D, mc.d_ff, a.gemm_reps)
    sweep = chunk_sweep(P_med, N, D, 3)
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][1] * shapes[i][2])
    check = flop_check(model, tw, shapes, mc, tc, N, [order[0], order[len(order) // 2]])
    evaluation = eval_cost(model, data, mc.max_len)

    def bound(fs: list, batches) -> float:
        """Seconds of the matmuls of ``batches`` at the measured rates (head and encoder each at its own)."""
        return sum(fs[i]["head"] / (rate["gflops"] * 1e9) + fs[i]["encoder"] / (enc_rate["gflops"] * 1e9)
                   for i in batches)

    peak = max([*rate["per_gemm_gflops"].values(), *enc_rate["per_gemm_gflops"].values()])  # the fastest GEMM
    results = {}
    for v in a.variants.split(","):
        cmd = [sys.executable, __file__, "--child", v, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--threads", str(a.threads)]
        child = subprocess.run(cmd, capture_output=True, text=True)
        if child.returncode:
            tail = (child.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SystemExit(f"bench_train.py: error: variant {v} failed (exit {child.returncode}): {tail}")
        r = json.loads(child.stdout.strip().splitlines()[-1])
        fs = per[bool(r["fast_paths"]["last_position_only"])]  # what this variant computes
        timed = r["timed_batches"]
        timed_flop = sum(fs[i]["encoder"] + fs[i]["head"] for i in timed)
        epoch_flop = sum(f["encoder"] + f["head"] for f in fs)
        bound_s, needed_s = bound(fs, timed), bound(needed, timed)
        results[v] = {
            "fast_paths": r["fast_paths"], "timed_steps": len(timed), "timed_gflop": timed_flop / 1e9,
            "timed_cpu_s": r["timed_cpu_s"], "timed_wall_s": r["timed_wall_s"], "bound_s": bound_s,
            "needed_bound_s": needed_s, "x_bound_cpu": r["timed_cpu_s"] / bound_s,
            "x_bound_wall": r["timed_wall_s"] / bound_s, "x_needed_bound_cpu": r["timed_cpu_s"] / needed_s,
            "x_peak_bound_cpu": r["timed_cpu_s"] * peak * 1e9 / timed_flop,
            "epoch_cpu_s": r["timed_cpu_s"] * epoch_flop / timed_flop,
            "epoch_wall_s": r["timed_wall_s"] * epoch_flop / timed_flop,
            "epoch_cpu_s_by_steps": r["timed_cpu_s"] * len(shapes) / len(timed),
            "peak_rss_gb": r["peak_rss_bytes"] / 1e9}
        log.info("%-8s %7.1f s/epoch (CPU)  %.2fx its bound, %.2fx the needed bound  peak RSS %.2f GB", v,
                 results[v]["epoch_cpu_s"], results[v]["x_bound_cpu"], results[v]["x_needed_bound_cpu"],
                 results[v]["peak_rss_gb"])
    out = {
        "command": "BFTREC_DATA_ROOT=... python scripts/bench_train.py " + " ".join(argv or sys.argv[1:]),
        "device": "cpu", "device_name": _cpu_name(), "torch": torch.__version__, "threads": a.threads,
        "cpu_count": os.cpu_count(), "load_average_start": list(load0), "load_average_end": list(os.getloadavg()),
        "config": {"tuned": "configs/tuned/sports_sasrec.yaml", "overrides": OVERRIDES,
                   "model": {k: getattr(mc, k) for k in ("d_model", "n_layers", "n_heads", "d_ff", "max_len")},
                   "ce_chunk_default": base.CE_CHUNK, "batch_size": tc.batch_size, "train_windows": tc.train_windows,
                   "length_bucketing": tc.length_bucketing, "n_items": N, "n_users": int(data.n_users)},
        "epoch": {"batches": len(shapes), "windows": len(tw), "positions_P": sum(s[3] for s in shapes),
                  "tokens_BL": sum(s[1] * s[2] for s in shapes), "computed_every_position": epoch[False],
                  **({"computed_last_position_only": epoch[True]} if prefixes else {}),
                  "flop_weighted_median_batch_P": P_med, "flop_weighted_median_batch_tokens": T_med,
                  "flop_counting": "forward + backward (3x forward) matmul FLOPs of the encoder (QKV, out, FFN, "
                                   "QK^T, AV) and the head (2 P N D forward) over epoch 1's real trimmed batches; "
                                   "last_position_only: the last block's key and value projections at every "
                                   "position, the rest at the last"},
        "flop_check": check,
        "gemm_rate": rate,
        "encoder_gemm_rate": enc_rate,
        "extrapolation": "epoch_s = timed_s x epoch_gflop / timed_gflop over --steps batches spread evenly over "
                         "epoch 1 after --warmup steps (the first warm-up step: the epoch's largest batch); "
                         "epoch_cpu_s_by_steps = timed_s x batches / timed steps",
        "x_bound": "timed_s / bound_s, bound_s = head GFLOP / gemm_rate.gflops + encoder GFLOP / "
                   "encoder_gemm_rate.gflops of what the variant computes; x_needed_bound: the same against the "
                   "FLOPs the loss needs (prefixes: the last block at the last position only); x_peak_bound: every "
                   "FLOP of the variant at the fastest measured GEMM's rate (stricter); _cpu: process CPU time, _wall: "
                   "wall clock",
        "peak_rss": "ru_maxrss of a fresh process per variant (interpreter, torch, data, model, Adam, steps)",
        "chunk_sweep_head_alone": sweep,
        "eval_valid_full_ranking": evaluation,
        "variants": results,
        "seconds": time.time() - started,
        **code_stamp(),  # the code measured
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    log.info("wrote %s", a.out)


def _cpu_name() -> str:
    from bftrec.experiment import device_name

    return device_name(torch.device("cpu"))


if __name__ == "__main__":
    main()
