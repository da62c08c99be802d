"""Cost of the BFT layer against the standard layer (BFT.md §5.8). Never a timed test.

Measures, standard vs BFT with the same model size and batch, the median over ``--steps`` steps
(after ``--warmup``):

(a) the layer alone, forward + backward, at D=64, F=256, T=50, B=256 (2 heads, dropout 0.2, train
    mode). The backward runs from ``<h'', g>`` for the standard block and from ``<h'', g> + <λ'', g'>``
    for the BFT block, i.e. every output a non-final layer of a stack produces.
(b) the end-to-end SASRec train step (zero_grad, loss, backward, Adam step) at the Sports
    configuration: N=18357 items, D=64, 2 layers, 2 heads, F=256, max_len 50, batch 256. Inputs are
    real Sports training windows when ``$BFTREC_DATA_ROOT`` holds them, else synthetic windows with
    Sports-like lengths. The loss covers every non-padding input position (next-item targets
    ``seq[:, 1:]``).

BFT runs with the default config and with ``bft.detach_precision_grad=true``. Steps of the variants
are interleaved (round-robin), so load drift on a shared machine hits all of them alike.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` during the timed steps of one variant
(after ``reset_peak_memory_stats``; includes parameters and optimizer states). On CPU each variant
runs a few steps alone in a fresh process with a fixed glibc mmap threshold (so freed tensors leave
the resident set) and reports the peak resident set size during those steps (``VmHWM``, reset through
``/proc/self/clear_refs`` after a warm-up step) minus the resident set between steps: the working
memory of a step (activations, temporaries, gradients), plus allocator slack. The ratio uses it.

Usage::

    .venv/bin/python scripts/bench_layer.py --device cpu --steps 10 --warmup 2
    .venv/bin/python scripts/bench_layer.py --device cuda --steps 50      # loss ce, bf16 AMP

Writes ``results/bench/layer_<device>.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bftrec.layers import StandardLayerConfig, build_masks  # noqa: E402
from bftrec.layers.bft import BFTLayerConfig, BFTParams, LayerRun  # noqa: E402
from bftrec.models import MODELS, DataInfo  # noqa: E402
from bftrec.models.sasrec import SASRecBlock, SASRecConfig  # noqa: E402
from bftrec.models.sasrec_bft import BFTSASRecBlock  # noqa: E402
from bftrec.train import device_name  # noqa: E402

SPORTS_ITEMS = 18357
LAYER = {"d_model": 64, "d_ff": 256, "T": 50, "B": 256, "n_heads": 2, "dropout": 0.2}
E2E = {"n_items": SPORTS_ITEMS, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256, "max_len": 50,
       "batch": 256, "dropout": 0.2}
VARIANTS = ("standard", "bft", "bft_detach")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _amp(device: torch.device, on: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if on and device.type == "cuda" else nullcontext()


def _bft_params(variant: str) -> BFTParams:
    """bft: the default config; bft_detach: bft.detach_precision_grad=true."""
    return BFTParams(detach_precision_grad=variant == "bft_detach")


# ------------------------------------------------------------------------------------------------ data
def sports_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sequence lengths with a Sports-like distribution (5-core: >= 3 training items, mean about 6)."""
    return np.minimum(3 + rng.geometric(1 / 4.3, n), E2E["max_len"] + 1)


def training_windows(rng: np.random.Generator) -> tuple[torch.Tensor, str]:
    """(U, max_len + 1) int64 left-padded training windows and a note on their source."""
    L = E2E["max_len"] + 1
    root = os.environ.get("BFTREC_DATA_ROOT")
    if root:
        try:
            from bftrec.data.batches import train_windows
            from bftrec.data.datasets import dataset_config, load_dataset

            data = load_dataset(dataset_config("sports"), data_root=root)
            if data.n_items == SPORTS_ITEMS:
                w = torch.from_numpy(train_windows(data.items, data.offsets, L))
                return w[w[:, -1] != 0], "real Amazon Sports training windows"
        except Exception as err:  # noqa: BLE001  the data package may be unavailable; fall back
            print(f"(real data unavailable: {err}; using synthetic windows)")
    n = 4096
    lens = sports_lengths(n, rng)
    w = np.zeros((n, L), dtype=np.int64)
    for i, k in enumerate(lens):
        w[i, L - k:] = rng.integers(1, SPORTS_ITEMS + 1, k)
    return torch.from_numpy(w), "synthetic windows with Sports-like lengths (BFTREC_DATA_ROOT unset)"


# ------------------------------------------------------------------------------------------------ runners
class LayerRunner:
    """One block, forward + backward on fixed inputs."""

    def __init__(self, variant: str, device: torch.device, amp: bool) -> None:
        torch.manual_seed(0)
        c = LAYER
        args = (c["d_model"], c["n_heads"], c["d_ff"], c["dropout"], c["dropout"])
        self.variant, self.device, self.amp = variant, device, amp
        self.block = (SASRecBlock(*args) if variant == "standard" else
                      BFTSASRecBlock(*args, bft_cfg=_bft_params(variant))).to(device).train()
        g = torch.Generator().manual_seed(1)
        B, T, D = c["B"], c["T"], c["d_model"]
        items = torch.randint(1, 1000, (B, T), generator=g)
        lens = torch.from_numpy(sports_lengths(B, np.random.default_rng(1))).clamp(max=T)
        items[torch.arange(T)[None, :] < (T - lens)[:, None]] = 0  # left padding
        self.masks = build_masks(items.to(device), causal=True)
        self.rows = self.masks.valid.reshape(-1).nonzero().squeeze(1)  # as BFTStack computes once per forward
        self.h = torch.randn(B, T, D, device=device, requires_grad=True)
        n = len(self.rows)
        self.lam = (torch.rand(n, D, device=device) * 50 + 10).requires_grad_()  # λ rows of the valid positions
        self.g = torch.randn(B, T, D, device=device)
        self.g2 = torch.randn(n, D, device=device) * 1e-3
        if variant != "standard":  # s₀² from these inputs, as the trainer's calibration pass sets it (BFT.md §1)
            self.block.eval()
            with torch.no_grad():
                self.block(self.h, self.lam, self.masks, run=LayerRun(calibrate=True, rows=self.rows))
            self.block.train()

    def step(self) -> None:
        with _amp(self.device, self.amp):
            if self.variant == "standard":
                out = (self.block(self.h, self.masks).float() * self.g).sum()
            else:
                h2, lam2, _ = self.block(self.h, self.lam, self.masks, run=LayerRun(rows=self.rows))
                out = (h2.float() * self.g).sum() + (lam2 * self.g2).sum()
        out.backward()
        self.block.zero_grad(set_to_none=True)
        self.h.grad = self.lam.grad = None


class E2ERunner:
    """The SASRec train step at the Sports configuration."""

    def __init__(self, variant: str, device: torch.device, amp: bool, loss: str, windows: torch.Tensor) -> None:
        torch.manual_seed(0)
        c = E2E
        cfg = SASRecConfig(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"], d_ff=c["d_ff"],
                           max_len=c["max_len"], dropout=c["dropout"], attn_dropout=c["dropout"], loss=loss)
        layer = StandardLayerConfig() if variant == "standard" else BFTLayerConfig(bft=_bft_params(variant))
        counts = np.ones(c["n_items"] + 1, dtype=np.int64)
        self.model = MODELS.get("sasrec")(cfg, layer, DataInfo(n_items=c["n_items"], train_counts=counts)).to(device)
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.device, self.amp, self.windows = device, amp, windows.to(device)
        self.gen = torch.Generator().manual_seed(2)
        self.model.calibrate({"seq": self.windows[: c["batch"]]})

    def step(self) -> None:
        idx = torch.randint(0, len(self.windows), (E2E["batch"],), generator=self.gen).to(self.device)
        with _amp(self.device, self.amp):
            loss = self.model.training_loss({"seq": self.windows[idx]})
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def make_runner(kind: str, variant: str, device: torch.device, amp: bool, loss: str, windows):
    return LayerRunner(variant, device, amp) if kind == "layer" else E2ERunner(variant, device, amp, loss, windows)


# ------------------------------------------------------------------------------------------------ measurement
def time_interleaved(runners: dict, steps: int, warmup: int, device: torch.device) -> dict:
    """Round-robin over the variants; per variant the list of step times in seconds."""
    times: dict = {k: [] for k in runners}
    for i in range(warmup + steps):
        for name, r in runners.items():
            _sync(device)
            t0 = time.perf_counter()
            r.step()
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def _proc_status() -> dict:
    """VmRSS and VmHWM of this process in bytes (Linux /proc)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) * 1024
    return out


def _rss_child(kind: str, variant: str, loss: str, windows, steps: int, threads: int, q) -> None:
    torch.set_num_threads(threads)
    r = make_runner(kind, variant, torch.device("cpu"), False, loss, windows)
    r.step()  # steady state: optimizer states exist, gradients freed (set_to_none)
    gc.collect()
    base = _proc_status()["VmRSS"]
    try:  # reset the high-water mark to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        how = "VmHWM after clear_refs"
    except OSError:
        how = "ru_maxrss (not reset: includes setup)"
    for _ in range(steps):
        r.step()
    if how.startswith("VmHWM"):
        peak = _proc_status()["VmHWM"]
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    q.put((base, peak, how))


def peak_memory(kind: str, variant: str, device: torch.device, amp: bool, loss: str, windows, steps: int) -> dict:
    if device.type == "cuda":
        r = make_runner(kind, variant, device, amp, loss, windows)
        r.step()
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            r.step()
        _sync(device)
        return {"peak_bytes": int(torch.cuda.max_memory_allocated(device))}
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    # a fixed mmap threshold: every large tensor is mmapped and unmapped on free, so RSS tracks live tensors
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    try:
        p = ctx.Process(target=_rss_child, args=(kind, variant, loss, windows, steps, torch.get_num_threads(), q))
        p.start()
        base, peak, how = q.get()
        p.join()
    finally:
        if old is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_")
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = old
    return {"rss_between_steps_bytes": base, "peak_rss_bytes": peak, "peak_bytes": peak - base, "rss_measure": how}


def summarize(times: dict, mem: dict) -> dict:
    out: dict = {"variants": {}}
    for name, ts in times.items():
        out["variants"][name] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                                 "n_steps": len(ts), **mem.get(name, {})}
    base = out["variants"]["standard"]
    out["ratios_vs_standard"] = {
        name: {"time": v["median_s"] / base["median_s"],
               "peak_memory": (v["peak_bytes"] / base["peak_bytes"]) if base.get("peak_bytes") else None}
        for name, v in out["variants"].items() if name != "standard"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first")
    ap.add_argument("--loss", default=None,
                    help="end-to-end loss: sampled_softmax (CPU default) | ce (CUDA default) | bce")
    ap.add_argument("--amp", choices=("auto", "on", "off"), default="auto",
                    help="bf16 autocast; auto = on for CUDA (as the trainer), off on CPU")
    ap.add_argument("--mem-steps", type=int, default=2, help="steps per variant for the peak-memory pass")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0 = torch default); 1 is steadier on a shared machine")
    ap.add_argument("--only", choices=("layer", "e2e", "both"), default="both")
    ap.add_argument("--out", default=None, help="JSON path; default results/bench/layer_<device>.json")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. why --threads was set)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    amp = args.amp == "on" or (args.amp == "auto" and device.type == "cuda")
    loss = args.loss or ("ce" if device.type == "cuda" else "sampled_softmax")
    n_neg = SASRecConfig().n_negatives
    windows, source = training_windows(np.random.default_rng(0))
    t_start = time.time()
    result = {
        "command": "python " + " ".join(sys.argv),
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "note": args.note,
        "load_average_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "amp_bf16": amp, "compile": False, "steps": args.steps, "warmup": args.warmup,
        "statistic": "median step time over the timed steps; variants interleaved round-robin",
        "memory_measure": ("torch.cuda.max_memory_allocated over timed steps" if device.type == "cuda" else
                           "fresh process per variant (glibc MALLOC_MMAP_THRESHOLD_=65536): peak RSS (VmHWM, reset "
                           "after one warm-up step) minus RSS between steps (params, grads freed, Adam states, data); "
                           "i.e. the working memory of a step: activations and temporaries plus allocator slack"),
        "config": {"layer": LAYER, "e2e": {**E2E, "loss": loss,
                                            "n_negatives": n_neg if loss == "sampled_softmax" else None}},
        "loss_positions": "every non-padding input position: next-item targets seq[:, 1:] where seq[:, :-1] != 0",
        "e2e_inputs": source,
        "layer_backward": "standard: from <h'', g>; BFT: from <h'', g> + <lambda'', g'> (all outputs of a stack layer)",
    }
    for kind in (("layer", "e2e") if args.only == "both" else (args.only,)):
        runners = {v: make_runner(kind, v, device, amp, loss, windows) for v in VARIANTS}
        times = time_interleaved(runners, args.steps, args.warmup, device)
        del runners
        mem = {v: peak_memory(kind, v, device, amp, loss, windows, args.mem_steps) for v in VARIANTS}
        result[kind] = summarize(times, mem)
        r = result[kind]["ratios_vs_standard"]
        med = {k: round(v["median_s"] * 1e3, 1) for k, v in result[kind]["variants"].items()}
        print(f"{kind}: median ms {med}")
        for name, x in r.items():
            print(f"  {name}: time {x['time']:.2f}x, peak memory {x['peak_memory'] or math.nan:.2f}x of standard")
    result["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    result["wall_s"] = round(time.time() - t_start, 1)
    out = Path(args.out or ROOT / "results" / "bench" / f"layer_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
