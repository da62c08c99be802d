"""How fine a dataset's timestamps are: the gaps between a user's consecutive interactions.

    BFTREC_DATA_ROOT=../shared/data python scripts/time_gaps.py \\
        --datasets ml-100k ml-1m sports beauty yelp --out results/hstu_time_bias/time_gaps.json

HSTU's relative time bias (``model.time_bias``, ``bftrec/models/hstu.py``) puts each (query, key) pair
into the bucket ``floor(ln(max(gap, 1)) / 0.301)`` of their time gap in seconds, so where most gaps
are 0 s or a few seconds, most pairs share the first buckets and the bias has little to tell apart.
Per dataset: the number of consecutive gaps (all interactions, per user, in sequence order), the
share of gaps of 0 s, under 60 s, under 1 h and over 1 day, and the median gap. A dataset without
timestamps is recorded as such. Reads data only; trains nothing.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bftrec.data.datasets import dataset_config, load_dataset  # noqa: E402

log = logging.getLogger("time_gaps")


def gap_summary(timestamps: np.ndarray, offsets: np.ndarray) -> dict:
    """Shares of consecutive per-user gaps (seconds) for CSR ``offsets`` (U + 1,) over ``timestamps`` (I,)."""
    gaps = np.diff(timestamps.astype(np.int64))
    within_user = np.ones(len(gaps), dtype=bool)
    within_user[offsets[1:-1] - 1] = False  # the gap from one user's last item to the next user's first
    gaps = gaps[within_user]
    return {"gaps": int(len(gaps)), "share_0s": float((gaps == 0).mean()), "share_under_60s": float((gaps < 60).mean()),
            "share_under_1h": float((gaps < 3600).mean()), "share_over_1day": float((gaps > 86400).mean()),
            "median_s": float(np.median(gaps))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", required=True, help="bftrec dataset names")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    out = {"command": "python scripts/time_gaps.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "datasets": {}}
    for name in args.datasets:
        data = load_dataset(dataset_config(name))
        if data.timestamps is None:
            out["datasets"][name] = {"timestamps": False}
        else:
            out["datasets"][name] = {"timestamps": True, **gap_summary(data.timestamps, data.offsets)}
        log.info("%s: %s", name, out["datasets"][name])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
