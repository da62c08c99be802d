"""How fine a dataset's timestamps are for HSTU's time bias: the time buckets of the pairs it attends over.

    BFTREC_DATA_ROOT=../shared/data python results/hstu_time_bias/time_gaps.py \\
        --datasets ml-100k ml-1m ml-1m-ts sports beauty yelp --out results/hstu_time_bias/time_gaps.json

HSTU's relative time bias (``model.time_bias``, ``bftrec/models/hstu.py``) adds a learned value per
bucket ``floor(ln(max(|τ_t - τ_j|, 1)) / 0.301)`` (``bftrec.models.hstu.time_buckets``) to every
(query t, key j <= t) pair of a window. Per dataset, over the window each user is scored with (the
last ``max_len`` items of the sequence, ``model.max_len`` of ``configs/tuned/<dataset>_hstu.yaml``):

- ``pairs``: the (t, j < t) pairs (the diagonal, always bucket 0, is left out);
- the share of pairs in bucket 0 (a gap of at most 1 s), under a minute, under an hour, over a day;
- the median and the 90th percentile of the bucket, and how many buckets hold at least 1% of pairs;
- ``consecutive``: the same shares for the gaps between a user's consecutive interactions.

A dataset without timestamps is recorded as such. Reads data only; trains nothing.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository (this script sits in results/<study>/)
sys.path.insert(0, str(ROOT))
from bftrec.data.datasets import dataset_config, load_dataset  # noqa: E402
from bftrec.models.hstu import HSTUConfig, time_buckets  # noqa: E402

log = logging.getLogger("time_gaps")


def shares(gaps: np.ndarray) -> dict:
    """Shares of |gaps| (seconds) of at most 1 s (bucket 0), under 60 s, under 1 h and over 1 day."""
    g = np.abs(gaps)
    return {"share_bucket0": float((g <= 1).mean()), "share_under_60s": float((g < 60).mean()),
            "share_under_1h": float((g < 3600).mean()), "share_over_1day": float((g > 86400).mean())}


def window_pairs(timestamps: np.ndarray, offsets: np.ndarray, max_len: int) -> np.ndarray:
    """(pairs,) int64 gaps τ_t - τ_j, j < t, within each user's last ``max_len`` items (CSR ``offsets``)."""
    out = []
    for u in range(len(offsets) - 1):
        t = timestamps[max(offsets[u], offsets[u + 1] - max_len): offsets[u + 1]].astype(np.int64)
        q, k = np.tril_indices(len(t), -1)  # query after key
        out.append(t[q] - t[k])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def summary(timestamps: np.ndarray, offsets: np.ndarray, max_len: int, n_buckets: int) -> dict:
    gaps = window_pairs(timestamps, offsets, max_len)
    buckets = time_buckets(torch.from_numpy(gaps), n_buckets).numpy()
    counts = np.bincount(buckets, minlength=n_buckets + 1) / max(len(buckets), 1)
    within = np.ones(len(timestamps) - 1, dtype=bool)
    within[offsets[1:-1] - 1] = False  # the step from one user's last item to the next user's first
    consecutive = np.diff(timestamps.astype(np.int64))[within]
    return {"max_len": max_len, "pairs": int(len(gaps)), **shares(gaps),
            "median_bucket": float(np.median(buckets)), "p90_bucket": float(np.percentile(buckets, 90)),
            "buckets_with_1pct": int((counts >= 0.01).sum()),
            "consecutive": {"gaps": int(len(consecutive)), **shares(consecutive),
                            "median_s": float(np.median(consecutive))}}


def tuned_max_len(name: str) -> int:
    path = ROOT / "configs" / "tuned" / f"{name}_hstu.yaml"
    tuned = (yaml.safe_load(path.read_text()) or {}).get("model", {}) if path.exists() else {}
    return int(tuned.get("max_len", HSTUConfig().max_len))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", required=True, help="bftrec dataset names")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    out = {"command": f"python results/hstu_time_bias/time_gaps.py {cmd}",
           "datasets": {}}
    for name in args.datasets:
        try:
            data = load_dataset(dataset_config(name))
        except (ValueError, OSError) as e:  # unknown name, missing or malformed files: one line
            sys.exit(f"time_gaps: error: {e}")
        if data.timestamps is None:
            out["datasets"][name] = {"timestamps": False}
        else:
            out["datasets"][name] = {"timestamps": True, **summary(data.timestamps, data.offsets, tuned_max_len(name),
                                                                  HSTUConfig().n_time_buckets)}
        log.info("%s: %s", name, out["datasets"][name])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
