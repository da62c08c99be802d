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

(c) the trainer's real setting (``--only trainer``, part of the default ``all``): real Amazon Sports
    training windows (needs ``$BFTREC_DATA_ROOT``), 1 thread, batch 512, sampled softmax, length
    bucketing as ``bftrec.trainer`` does it (``epoch_batches`` sortish batches, left padding trimmed by
    ``trim_left``), ``--trainer-steps`` steps (a few hundred, not full epochs); every variant walks the
    same batches in the same order, so ``time_total`` (the ratio of summed step times) is the fair one.

BFT runs in four variants: ``bft.units`` count (``bft``, the default) or h (``bft_h``, v1), each with
``bft.detach_precision_grad`` false or true (``*_detach``, the cheaper variant). Steps of the variants
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
from typing import Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bftrec.experiment import code_stamp, device_name  # noqa: E402
from bftrec.layers import StandardLayerConfig, build_masks  # noqa: E402
from bftrec.layers.bft import BFTHLayerConfig, BFTLayerConfig, BFTParams, LayerRun  # noqa: E402
from bftrec.layers.precision import compiling  # noqa: E402
from bftrec.models import MODELS, DataInfo  # noqa: E402
from bftrec.models.sasrec import SASRecBlock, SASRecConfig  # noqa: E402
from bftrec.models.sasrec_bft import BFTSASRecBlock  # noqa: E402
from scripts import _cli as cli  # noqa: E402

SPORTS_ITEMS = 18357
LAYER = {"d_model": 64, "d_ff": 256, "T": 50, "B": 256, "n_heads": 2, "dropout": 0.2}
E2E = {"n_items": SPORTS_ITEMS, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256, "max_len": 50,
       "batch": 256, "dropout": 0.2}
TRAINER = {"threads": 1, "batch": 512, "loss": "sampled_softmax", "length_bucketing": True, "steps": 300}
# bft: bft.units=count (default, BFT.md §7); bft_h: bft.units=h (v1, layer=bft_h); *_detach: detach_precision_grad;
# bft_compiled: bft with its precision formulas through torch.compile (trainer.compile_precision; not in the default)
VARIANTS = ("standard", "bft", "bft_detach", "bft_h", "bft_h_detach")
EXTRA_VARIANTS = ("bft_compiled",)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _amp(device: torch.device, on: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if on and device.type == "cuda" else nullcontext()


def _bft_params(variant: str) -> BFTParams:
    """bft[_h]: bft.units=count (h); *_detach: bft.detach_precision_grad=true."""
    return BFTParams(units="h" if variant.startswith("bft_h") else "count",
                     detach_precision_grad=variant.removesuffix("_compiled").endswith("_detach"))


def _layer_cfg(variant: str):
    if variant == "standard":
        return StandardLayerConfig()
    return (BFTHLayerConfig if variant.startswith("bft_h") else BFTLayerConfig)(bft=_bft_params(variant))


# ------------------------------------------------------------------------------------------------ data
def sports_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Sequence lengths with a Sports-like distribution (5-core: >= 3 training items, mean about 6)."""
    return np.minimum(3 + rng.geometric(1 / 4.3, n), E2E["max_len"] + 1)


def sports_windows() -> Optional[torch.Tensor]:
    """(U, max_len + 1) int64 left-padded real Amazon Sports training windows, or None without the data."""
    L = E2E["max_len"] + 1
    root = os.environ.get("BFTREC_DATA_ROOT")
    if root:
        try:
            from bftrec.data.batches import train_windows
            from bftrec.data.datasets import dataset_config, load_dataset

            data = load_dataset(dataset_config("sports"), data_root=root)
            if data.n_items == SPORTS_ITEMS:
                w = torch.from_numpy(train_windows(data.items, data.offsets, L))
                return w[w[:, -1] != 0]
        except Exception as err:  # noqa: BLE001  the data package may be unavailable
            print(f"(real Sports data unavailable: {err})")
    return None


def training_windows(rng: np.random.Generator) -> tuple[torch.Tensor, str]:
    """(U, max_len + 1) int64 left-padded synthetic windows with Sports-like lengths (the bench's own
    end-to-end setting; the trainer setting reads the real ones, ``sports_windows``) and a note."""
    L = E2E["max_len"] + 1
    n = 4096
    lens = sports_lengths(n, rng)
    w = np.zeros((n, L), dtype=np.int64)
    for i, k in enumerate(lens):
        w[i, L - k:] = rng.integers(1, SPORTS_ITEMS + 1, k)
    return torch.from_numpy(w), "synthetic windows with Sports-like lengths"


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
        with _amp(self.device, self.amp), compiling(self.variant.endswith("_compiled")):
            if self.variant == "standard":
                out = (self.block(self.h, self.masks).float() * self.g).sum()
            else:
                h2, lam2, _ = self.block(self.h, self.lam, self.masks, run=LayerRun(rows=self.rows))
                out = (h2.float() * self.g).sum() + (lam2 * self.g2).sum()
        out.backward()
        self.block.zero_grad(set_to_none=True)
        self.h.grad = self.lam.grad = None


class E2ERunner:
    """The train step of backbone ``model`` (SASRec by default) at the Sports configuration. HSTU runs without
    its time bias (the windows carry no timestamps)."""

    def __init__(self, variant: str, device: torch.device, amp: bool, loss: str, windows: torch.Tensor,
                 batch: int = E2E["batch"], model: str = "sasrec") -> None:
        torch.manual_seed(0)
        c = E2E
        cls = MODELS.get(model)
        cfg = cls.Config(d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"], d_ff=c["d_ff"],
                         max_len=c["max_len"], dropout=c["dropout"], attn_dropout=c["dropout"], loss=loss,
                         **({"time_bias": False} if model == "hstu" else {}))
        layer = _layer_cfg(variant)
        counts = np.ones(c["n_items"] + 1, dtype=np.int64)
        self.model = cls(cfg, layer, DataInfo(n_items=c["n_items"], train_counts=counts)).to(device)
        self.model.train()
        if variant.endswith("_compiled"):
            self.model.stack.compile_precision = True
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.device, self.amp, self.windows = device, amp, windows.to(device)
        self.gen = torch.Generator().manual_seed(2)
        self.batch_size = batch
        self.model.calibrate({"seq": self.windows[:batch]})

    def next_batch(self) -> torch.Tensor:
        idx = torch.randint(0, len(self.windows), (self.batch_size,), generator=self.gen).to(self.device)
        return self.windows[idx]

    def step(self) -> None:
        seq = self.next_batch()
        with _amp(self.device, self.amp):
            loss = self.model.training_loss({"seq": seq})
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


class TrainerRunner(E2ERunner):
    """The trainer's real setting: real Sports windows, batch 512, sampled softmax, length bucketing.

    Batches are ``bftrec.trainer.epoch_batches`` (sortish: similar lengths) with the common left
    padding trimmed (``trim_left``), exactly as ``bftrec.trainer`` feeds them; every variant walks the
    same batch list in the same order.
    """

    def __init__(self, variant: str, device: torch.device, amp: bool, loss: str, windows: torch.Tensor,
                 model: str = "sasrec") -> None:
        from bftrec.trainer import epoch_batches

        self.batch_size = TRAINER["batch"]
        E2ERunner.__init__(self, variant, device, amp, TRAINER["loss"], windows, batch=self.batch_size, model=model)
        lengths = windows.ne(0).sum(1)  # (W,)
        self.batches = epoch_batches(lengths, self.batch_size, torch.Generator().manual_seed(3),
                                     bucket=TRAINER["length_bucketing"])
        self.i = 0

    def next_batch(self) -> torch.Tensor:
        from bftrec.data.batches import trim_left

        idx = self.batches[self.i % len(self.batches)]
        self.i += 1
        return trim_left(self.windows[idx.to(self.device)])


def make_runner(kind: str, variant: str, device: torch.device, amp: bool, loss: str, windows, model: str = "sasrec"):
    if kind == "layer":
        return LayerRunner(variant, device, amp)
    return (TrainerRunner if kind == "trainer" else E2ERunner)(variant, device, amp, loss, windows, model=model)


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


def _rss_child(kind: str, variant: str, loss: str, windows, steps: int, threads: int, q, model: str = "sasrec") -> None:
    torch.set_num_threads(threads)
    r = make_runner(kind, variant, torch.device("cpu"), False, loss, windows, model)
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


def peak_memory(kind: str, variant: str, device: torch.device, amp: bool, loss: str, windows, steps: int,
                model: str = "sasrec") -> dict:
    if device.type == "cuda":
        r = make_runner(kind, variant, device, amp, loss, windows, model)
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
        p = ctx.Process(target=_rss_child,
                        args=(kind, variant, loss, windows, steps, torch.get_num_threads(), q, model))
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
        out["variants"][name] = {"median_s": statistics.median(ts), "total_s": sum(ts), "min_s": min(ts),
                                 "max_s": max(ts), "n_steps": len(ts), **mem.get(name, {})}
    base = out["variants"]["standard"]
    out["ratios_vs_standard"] = {
        name: {"time": v["median_s"] / base["median_s"], "time_total": v["total_s"] / base["total_s"],
               "peak_memory": (v["peak_bytes"] / base["peak_bytes"]) if base.get("peak_bytes") else None}
        for name, v in out["variants"].items() if name != "standard"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", type=cli.device, help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--steps", type=cli.at_least(1), default=8, help="timed steps per variant (median reported)")
    ap.add_argument("--warmup", type=cli.at_least(0), default=2, help="untimed steps per variant first")
    ap.add_argument("--loss", default=None, choices=("sampled_softmax", "ce", "bce"),
                    help="end-to-end loss: sampled_softmax (CPU default) | ce (CUDA default) | bce")
    ap.add_argument("--amp", choices=("auto", "on", "off"), default="auto",
                    help="bf16 autocast; auto = on for CUDA (as the trainer), off on CPU")
    ap.add_argument("--mem-steps", type=cli.at_least(1), default=2, help="steps per variant for the peak-memory pass")
    ap.add_argument("--threads", type=cli.at_least(0), default=0,
                    help="torch CPU threads (0 = torch default); 1 is steadier on a shared machine")
    ap.add_argument("--only", choices=("layer", "e2e", "trainer", "both", "all"), default="all",
                    help="both = layer and e2e; all = layer, e2e and the trainer's setting")
    ap.add_argument("--trainer-steps", type=cli.at_least(1), default=TRAINER["steps"],
                    help="timed steps per variant in the trainer's setting (real Sports, 1 thread, batch 512)")
    ap.add_argument("--trainer-mem-steps", type=cli.at_least(1), default=20,
                    help="bucketed batches per variant for the trainer setting's peak-memory pass (same batches)")
    ap.add_argument("--out", default=None,
                    help="JSON path; default results/bench/layer_<device>.json (SASRec), layer_<model>_<device>.json")
    ap.add_argument("--note", default="", help="free text stored in the JSON (e.g. why --threads was set)")
    ap.add_argument("--model", default="sasrec", choices=("sasrec", "bert4rec", "hstu"),
                    help="the backbone of the e2e and trainer settings (the layer alone is SASRec's block)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, standard always included; of {','.join(VARIANTS + EXTRA_VARIANTS)}")
    args = ap.parse_args()
    variants = ("standard",) + tuple(v for v in args.variants.split(",") if v and v != "standard")
    if set(variants) - set(VARIANTS + EXTRA_VARIANTS):
        raise SystemExit(f"bench_layer: --variants {args.variants}: choose from {','.join(VARIANTS + EXTRA_VARIANTS)}")

    if args.model != "sasrec" and args.only not in ("e2e", "trainer"):
        raise SystemExit(f"bench_layer: --model {args.model} needs --only e2e or --only trainer (the layer alone is "
                         "SASRec's block)")
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
        "model": args.model, "amp_bf16": amp, "compile": "bft_compiled" in variants, "variants": list(variants),
        "steps": args.steps, "warmup": args.warmup,
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
    kinds = {"both": ("layer", "e2e"), "all": ("layer", "e2e", "trainer")}.get(args.only, (args.only,))
    real = sports_windows() if "trainer" in kinds else None
    if "trainer" in kinds and real is None:
        if args.only == "trainer":  # nothing else to measure: refuse rather than write an empty result
            raise SystemExit("bench_layer: --only trainer needs the real Sports data; set BFTREC_DATA_ROOT")
        print("trainer setting skipped: it needs the real Sports data under $BFTREC_DATA_ROOT")
        kinds = tuple(k for k in kinds if k != "trainer")
    for kind in kinds:
        threads = torch.get_num_threads()
        steps, mem_steps, data = args.steps, args.mem_steps, windows
        if kind == "trainer":
            torch.set_num_threads(TRAINER["threads"])
            steps, mem_steps, data = args.trainer_steps, args.trainer_mem_steps, real
            result["config"]["trainer"] = {**E2E, **TRAINER, "steps": steps, "mem_batches": mem_steps,
                                           "threads": TRAINER["threads"], "amp_bf16": amp,
                                           "n_negatives": n_neg, "inputs": "real Amazon Sports training windows "
                                           "(bftrec.trainer.epoch_batches sortish batches, common left padding "
                                           "trimmed by trim_left, as the trainer feeds them)"}
        runners = {v: make_runner(kind, v, device, amp, loss, data, args.model) for v in variants}
        times = time_interleaved(runners, steps, args.warmup, device)
        del runners
        mem = {v: peak_memory(kind, v, device, amp, loss, data, mem_steps, args.model) for v in variants}
        result[kind] = summarize(times, mem)
        result[kind]["threads"] = torch.get_num_threads()
        torch.set_num_threads(threads)
        r = result[kind]["ratios_vs_standard"]
        med = {k: round(v["median_s"] * 1e3, 1) for k, v in result[kind]["variants"].items()}
        print(f"{kind}: median ms {med}")
        for name, x in r.items():
            print(f"  {name}: time {x['time']:.2f}x (total {x['time_total']:.2f}x), "
                  f"peak memory {x['peak_memory'] or math.nan:.2f}x of standard")
    result["load_average_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    result["wall_s"] = round(time.time() - t_start, 1)
    name = f"layer_{device.type}.json" if args.model == "sasrec" else f"layer_{args.model}_{device.type}.json"
    out = Path(args.out or ROOT / "results" / "bench" / name)  # another backbone never overwrites SASRec's
    out.parent.mkdir(parents=True, exist_ok=True)
    result.update(code_stamp())  # the code measured
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
