"""How many of a dataset's training targets one epoch predicts under each training-window mode.

    BFTREC_DATA_ROOT=../shared/data python results/windows/window_coverage.py \\
        --datasets sports instruments beauty toys yelp ml-1m ml-100k --out results/windows/coverage.json

Per dataset, at the ``model.max_len`` of its tuned SASRec config (``configs/tuned/<dataset>_sasrec.yaml``;
the SASRec default where that file sets none):
training targets (``t_1 .. t_{n-1}`` of each user's training part ``s[:-2]``), windows per epoch and
targets predicted per epoch under ``trainer.train_windows=last`` and ``sliding`` (stride ``max_len``,
every target once; ``bftrec.data.batches.train_window_bounds``). Where ``last`` already covers nearly
every target the two modes train on nearly the same data, and the choice between them cannot matter
much; where it covers little, it has to be measured (``configs/experiment/windows.yaml``). Writes JSON
and logs one line per dataset. Reads data only; trains nothing.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository (this script sits in results/<study>/)
sys.path.insert(0, str(ROOT))
from bftrec.data.batches import train_window_bounds  # noqa: E402

log = logging.getLogger("window_coverage")


def targets_per_window(start: np.ndarray, end: np.ndarray, max_len: int) -> np.ndarray:
    """(W,) int64: next-item targets a window predicts: ``t_i`` for ``max(1, e - max_len) <= i <= e - 1``,
    with ``e = end - start`` the window's end within the user's training part (``train_window_bounds``)."""
    e = end - start
    return np.maximum(e - np.maximum(1, e - max_len), 0)


def coverage(offsets: np.ndarray, max_len: int) -> dict:
    """Targets, windows and targets predicted per epoch under both modes, for CSR ``offsets`` (U + 1,)."""
    n = np.diff(offsets).astype(np.int64) - 2  # (U,) training items per user
    out = {"users": int(len(n)), "max_len": int(max_len), "targets": int(np.maximum(n - 1, 0).sum())}
    for mode in ("last", "sliding"):
        _, start, end = train_window_bounds(offsets, max_len + 1, mode)
        predicted = int(targets_per_window(start, end, max_len).sum())
        out[mode] = {"windows": int(len(start)), "targets_predicted": predicted,
                     "share_of_targets": round(predicted / out["targets"], 4)}
    out["users_longer_than_a_window"] = round(float((n > max_len + 1).mean()), 4)
    return out


def composed_max_len(dataset: str) -> int:
    """``model.max_len`` of ``bftrec-train dataset=<dataset> model=sasrec``: the tuned config over the
    model's defaults, composed by Hydra as a run composes it."""
    from hydra import compose, initialize_config_dir

    from bftrec.config import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return int(compose("train", overrides=[f"dataset={dataset}", "model=sasrec"]).model.max_len)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", required=True)
    ap.add_argument("--data-root", default=None, help="default: BFTREC_DATA_ROOT")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from bftrec.data.datasets import dataset_config, load_dataset

    result = {}
    for name in args.datasets:
        tuned = ROOT / "configs" / "tuned" / f"{name}_sasrec.yaml"
        if not tuned.exists():
            ap.error(f"--datasets {name}: no {tuned.relative_to(ROOT)} to take model.max_len from")
        max_len = composed_max_len(name)
        result[name] = coverage(load_dataset(dataset_config(name), data_root=args.data_root).offsets, max_len)
        r = result[name]
        log.info("%s (max_len %d): last predicts %.1f%% of %d training targets, sliding %.1f%% "
                 "(%d windows against %d)", name, max_len, 100 * r["last"]["share_of_targets"], r["targets"],
                 100 * r["sliding"]["share_of_targets"], r["sliding"]["windows"], r["last"]["windows"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(argv or sys.argv[1:])
    args.out.write_text(json.dumps({"command": f"python results/windows/window_coverage.py {cmd}",
                                    "datasets": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
