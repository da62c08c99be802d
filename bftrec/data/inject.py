"""Random items injected into the training histories: a signal-to-noise knob on real data (issue 46 item 3).

``dataset.inject_rate`` = r in [0, 1): before each *training* interaction of a user (every interaction but
the last two, the validation and test targets, which stay untouched), a uniformly random item id in 1..N is
inserted with probability r, drawn by ``numpy.random.default_rng(dataset.inject_seed)``. So r is the
expected number of injected items per genuine training interaction (r = 0.3: about 23% of the training
tokens are noise). The validation and test histories contain the injected items too: they are the user's
history. An inserted item takes the timestamp of the interaction it precedes (a tie). Training counts,
and so the item-frequency strata, are recomputed from the injected data by the trainer, as for any data.

The processed (clean) data are cached as usual; the injection is applied after loading, so changing r never
re-reads the raw file. ``data.stats["injection"]`` records ``rate``, ``seed`` and the number ``injected``,
and reaches ``metrics.json`` with the other data statistics.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bftrec.data.preprocess import SeqData


def inject_random_items(data: SeqData, rate: float, seed: int) -> SeqData:
    """A copy of ``data`` with random items inserted into every user's training part (module docstring).

    Args:
        data: the processed sequences; items (nnz,) int64 1..N grouped by user, offsets (U + 1,) int64.
        rate: expected injected items per training interaction, in [0, 1); 0 returns ``data`` unchanged.
        seed: the generator seed.
    Raises:
        ValueError: ``rate`` outside [0, 1) (one line, naming ``dataset.inject_rate``).
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dataset.inject_rate={rate} must be in [0, 1) (expected injected items per training "
                         "interaction; 0 = off)")
    if rate == 0.0:
        return data
    rng = np.random.default_rng(seed)
    lengths = np.diff(data.offsets)  # (U,)
    pos = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], lengths)  # position within its user
    training = pos < np.repeat(lengths - 2, lengths)  # (nnz,) bool: not the validation or test target
    insert = training & (rng.random(len(data.items)) < rate)  # an item goes in before each such row
    noise = rng.integers(1, data.n_items + 1, size=int(insert.sum()))
    # new layout: each row is preceded by its insert (if any); (nnz + k,) arrays
    slots = 1 + insert.astype(np.int64)
    end = np.cumsum(slots)  # exclusive end of each original row's slot group
    items = np.empty(int(end[-1]) if len(end) else 0, dtype=np.int64)
    items[end - 1] = data.items
    items[(end - 2)[insert]] = noise
    timestamps = None
    if data.timestamps is not None:
        timestamps = np.empty_like(items)
        timestamps[end - 1] = data.timestamps
        timestamps[(end - 2)[insert]] = data.timestamps[insert]
    user = np.repeat(np.arange(len(lengths)), lengths)  # (nnz,) user index of each row
    added = np.concatenate([[0], np.cumsum(np.bincount(user[insert], minlength=len(lengths)))])  # (U + 1,)
    offsets = data.offsets + added
    stats = {**data.stats, "injection": {"rate": rate, "seed": seed, "injected": int(insert.sum()),
                                         "where": "training part of each history (not the last two items)"}}
    return dataclasses.replace(data, items=items, timestamps=timestamps, offsets=offsets, stats=stats)
