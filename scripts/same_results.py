"""Do two folders of runs give the same results? Compares the ``test`` section of metrics.json cell by cell.

    python scripts/same_results.py results/paper_cpu/runs/office/sasrec results/office_sasrec/runs

Cells are matched on (dataset, model, tag, layer, seed). Prints one line per cell found in both folders
(``identical`` or the first differing metric) and a count; exits 1 if any cell differs, 2 if none matches.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tables import load_runs  # noqa: E402


def first_difference(a: dict, b: dict, path: str = "test") -> str | None:
    """Dotted key of the first value that differs between two nested dicts (None if equal)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return None if a == b else path
    for key in sorted(set(a) | set(b), key=str):
        diff = first_difference(a.get(key), b.get(key), f"{path}.{key}")
        if diff:
            return diff
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="first folder searched for metrics.json")
    ap.add_argument("b", type=Path, help="second folder searched for metrics.json")
    args = ap.parse_args(argv)

    def key(r: dict) -> tuple:
        return r["dataset"], r["model"], r["tag"], r["layer"], r["seed"]

    a = {key(r): r for r in load_runs(args.a)}
    b = {key(r): r for r in load_runs(args.b)}
    common = sorted(set(a) & set(b))
    if not common:
        print(f"same_results: no cell (dataset, model, tag, layer, seed) is in both {args.a} and {args.b}")
        return 2
    differ = 0
    for k in common:
        diff = first_difference(a[k]["test"], b[k]["test"])
        differ += diff is not None
        print(f"{'/'.join(str(x) for x in k if x != '')}: {'identical' if diff is None else 'differs at ' + diff}")
    print(f"{len(common)} cells in both folders; {len(common) - differ} identical test sections, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
