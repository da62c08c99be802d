"""Cost of per-position sampled-softmax negatives (``model.negatives_per=position``): the two routes
of ``bftrec.models.base.per_position_logits``. Never a timed test.

For each catalogue size of the paper's datasets (N items, so N + 1 table rows), P positions, K
negatives each and width D (HSTU's tuned configs: K = 128, D = 50 on MovieLens, 64 on Amazon and
Yelp), it times forward + backward of ``(logits * w).sum()`` through:

- ``gather``: the (P, K, D) block ``table[neg]`` times h (``torch.bmm``);
- ``dense``: blocks of (chunk, N + 1) logits ``h @ table.T`` and a column gather
  (``DENSE_NEGATIVES_BLOCK`` elements per block).

Each is timed ``--reps`` times, interleaved (the order alternating), after one warm-up; medians of
the process CPU time (robust to other jobs on the machine; with ``--threads`` > 1 it sums the
threads, so it is CPU-seconds, not wall time). On a GPU the crossover differs and is not measured.
The JSON records, per size, both medians, their ratio, the route the rule
(``base.dense_negatives``: ``N + 1 <= DENSE_NEGATIVES_RATIO * K``) takes, and whether that route was
the faster one here, so a rule that is wrong on this machine shows up as ``rule_takes_faster: false``.

Usage::

    .venv/bin/python scripts/bench_negatives.py --threads 1

Writes ``results/bench/negatives_cpu.json`` (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bftrec.experiment import code_stamp, cpu_name  # noqa: E402
from bftrec.models import base  # noqa: E402

# (dataset, items N, HSTU width D): items from ../shared/data/README.md, D from configs/tuned/<dataset>_hstu.yaml
SIZES = [("ml-100k", 1349, 50), ("ml-1m", 3706, 50), ("instruments", 9922, 64), ("toys", 11924, 64),
         ("beauty", 12101, 64), ("sports", 18357, 64), ("yelp", 20033, 64)]
ROUTES = {"gather": 0, "dense": 10**12}  # DENSE_NEGATIVES_RATIO forcing each route


def step_seconds(h: torch.Tensor, table: torch.Tensor, neg: torch.Tensor, w: torch.Tensor) -> float:
    """CPU seconds of one forward + backward through per_position_logits (the current route)."""
    h.grad = table.grad = None
    t = time.process_time()
    (base.per_position_logits(h, table, neg) * w).sum().backward()
    return time.process_time() - t


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--positions", type=int, default=8192, help="P, positions with a target per batch")
    p.add_argument("--negatives", type=int, default=128, help="K, negatives per position")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "results/bench/negatives_cpu.json"))
    a = p.parse_args(argv)
    if a.threads < 1 or a.positions < 1 or a.negatives < 1 or a.reps < 1:
        sys.exit(f"--threads, --positions, --negatives and --reps must be >= 1, got {a.threads}, "
                 f"{a.positions}, {a.negatives}, {a.reps}")
    torch.set_num_threads(a.threads)
    ratio = base.DENSE_NEGATIVES_RATIO
    rows = []
    for name, n_items, d in SIZES:
        g = torch.Generator().manual_seed(0)
        h = torch.randn(a.positions, d, generator=g).requires_grad_()
        table = torch.randn(n_items + 1, d, generator=g).requires_grad_()
        neg = torch.randint(1, n_items + 1, (a.positions, a.negatives), generator=g)
        w = torch.randn(a.positions, a.negatives, generator=g)
        times = {r: [] for r in ROUTES}
        try:
            for rep in range(a.reps + 1):  # rep 0 is the warm-up; the order alternates between reps
                for route in list(ROUTES) if rep % 2 else list(ROUTES)[::-1]:
                    base.DENSE_NEGATIVES_RATIO = ROUTES[route]
                    s = step_seconds(h, table, neg, w)
                    if rep:
                        times[route].append(s)
        finally:
            base.DENSE_NEGATIVES_RATIO = ratio
        med = {r: statistics.median(v) for r, v in times.items()}
        rule = "dense" if base.dense_negatives(n_items + 1, a.negatives) else "gather"
        rows.append({"dataset": name, "items": n_items, "d_model": d,
                     "gather_s": round(med["gather"], 4), "dense_s": round(med["dense"], 4),
                     "gather_over_dense": round(med["gather"] / med["dense"], 2), "rule_takes": rule,
                     "rule_takes_faster": med[rule] <= min(med.values())})
        print(json.dumps(rows[-1]))
    out = {"what": "per-position negatives, forward + backward CPU seconds per batch of P positions "
                   "(median of reps, interleaved)",
           "command": "python scripts/bench_negatives.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "positions": a.positions, "negatives": a.negatives, "reps": a.reps, "threads": a.threads,
           "dense_negatives_ratio": ratio, "dense_negatives_block": base.DENSE_NEGATIVES_BLOCK,
           "device": "cpu", "device_name": cpu_name(), "torch": torch.__version__,
           **code_stamp(), "sizes": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
