"""Do two folders of runs give the same results? Compares the ``test`` section of metrics.json cell by cell.

    bftrec-report same results/paper_cpu/runs/office/sasrec results/office_sasrec/runs

Cells are matched on (dataset, model, tag, layer, seed). Two numbers count as the same within a relative
tolerance (``--rtol``, default 1e-6, plus an absolute 1e-12): an exact rerun on another CPU or thread count
can differ in the last float32 bits of MRR or NDCG, never in a hit count. Prints one line per cell found in
both folders (``same`` with the largest relative difference, or the first metric beyond the tolerance) and a
count; exits 1 if any cell differs, 2 if none matches.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from bftrec.report.runs import load_runs

RTOL, ATOL = 1e-6, 1e-12


def _close(x, y, rtol: float) -> bool:
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
        return math.isclose(x, y, rel_tol=rtol, abs_tol=ATOL)
    return x == y


def first_difference(a: dict, b: dict, path: str = "test", rtol: float = RTOL) -> str | None:
    """Dotted key of the first value that differs beyond ``rtol`` between two nested dicts (None if the same)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return next((d for i, (x, y) in enumerate(zip(a, b))
                         if (d := first_difference(x, y, f"{path}[{i}]", rtol))), None)
        return None if _close(a, b, rtol) else path
    for key in sorted(set(a) | set(b), key=str):
        diff = first_difference(a.get(key), b.get(key), f"{path}.{key}", rtol)
        if diff:
            return diff
    return None


def largest_relative_difference(a, b) -> float:
    """The largest |x − y| / max(|x|, |y|) over the numbers the two nested structures share (0 if none)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return max([largest_relative_difference(a[k], b[k]) for k in set(a) & set(b)] or [0.0])
    if isinstance(a, list) and isinstance(b, list):
        return max([largest_relative_difference(x, y) for x, y in zip(a, b)] or [0.0])
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and a != b:
        return abs(a - b) / max(abs(a), abs(b))
    return 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bftrec-report same", description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="first folder searched for metrics.json")
    ap.add_argument("b", type=Path, help="second folder searched for metrics.json")
    ap.add_argument("--rtol", type=float, default=RTOL, help=f"relative tolerance per number (default {RTOL})")
    args = ap.parse_args(argv)

    def key(r: dict) -> tuple:
        return r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]

    a = {key(r): r for r in load_runs(args.a)}
    b = {key(r): r for r in load_runs(args.b)}
    common = sorted(set(a) & set(b))
    if not common:
        print(f"bftrec-report same: no cell (dataset, model, tag, layer, seed) is in both {args.a} and {args.b}")
        return 2
    differ = 0
    for k in common:
        diff = first_difference(a[k]["test"], b[k]["test"], rtol=args.rtol)
        differ += diff is not None
        worst = largest_relative_difference(a[k]["test"], b[k]["test"])
        same = ("identical" if worst == 0 else
                f"same within rtol {args.rtol:g} (largest relative difference {worst:.1e})")
        print(f"{'/'.join(str(x) for x in k if x != '')}: {same if diff is None else 'differs at ' + diff}")
    print(f"{len(common)} cells in both folders; {len(common) - differ} the same within rtol {args.rtol:g}, "
          f"{differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
