"""Preprocessing (DESIGN.md "Data protocol"): dedup, k-core fixed point, short users, stable sort,
remap, leave-one-out views without leakage."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bftrec.data.config import DatasetConfig
from bftrec.data.preprocess import SeqData, kcore, natural_order, preprocess


def frame(rows, with_time: bool = True) -> pd.DataFrame:
    users = [str(r[0]) for r in rows]
    items = [str(r[1]) for r in rows]
    if with_time:
        ts = np.array([r[2] for r in rows], dtype=np.int64)
    else:
        ts = pd.array([pd.NA] * len(rows), dtype="Int64")
    return pd.DataFrame({"user": pd.array(users, dtype=str), "item": pd.array(items, dtype=str),
                         "timestamp": ts})


def cfg(**kw) -> DatasetConfig:
    return DatasetConfig(name="t", format="tsv", **kw)


def seqs(d: SeqData) -> dict[str, list[str]]:
    return {d.user_ids[u]: [d.item_ids[i] for i in d.sequence(u)] for u in range(d.n_users)}


def random_frame(seed: int, n_users: int = 60, n_items: int = 40, ties: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        n = int(rng.integers(1, 15))
        times = rng.choice(10**6, n, replace=False) if not ties else rng.integers(0, 3, n)
        for t in times:
            rows.append((f"u{u}", f"i{int(rng.zipf(1.5)) % n_items}", int(t)))
    return frame(rows)


def naive_kcore(df: pd.DataFrame, k: int) -> pd.DataFrame:
    while True:
        uc = df.groupby("user")["user"].transform("size")
        ic = df.groupby("item")["item"].transform("size")
        ok = (uc >= k) & (ic >= k)
        if ok.all():
            return df
        df = df[ok]


def test_kcore_needs_several_passes_and_reaches_a_fixed_point():
    # 3-core: users a, b, d x items x, w, v form the core. Pass 1 drops (f, z) (z has 1 row); pass 2
    # drops user f (2 rows left); pass 3 drops y and q (2 rows each); pass 4 drops users e and g.
    core = [(u, i) for u in "abd" for i in "xwv"]
    chain = [("e", "x"), ("e", "y"), ("e", "q"), ("f", "y"), ("f", "q"), ("f", "z"),
             ("g", "y"), ("g", "q"), ("g", "w")]
    rows = [(u, i, t) for t, (u, i) in enumerate(core + chain)]
    df = frame(rows)
    keep, rounds = kcore(pd.factorize(df["user"])[0], pd.factorize(df["item"])[0], 3)
    assert rounds == 4 and keep.tolist() == [True] * 9 + [False] * 9
    d = preprocess(df, cfg(kcore=3))
    assert seqs(d) == {u: ["x", "w", "v"] for u in "abd"}
    assert d.stats["kcore_rounds"] == 4 and d.stats["kcore_removed"] == 9
    assert d.stats["raw_users"] == 6 and d.stats["users"] == 3


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_kcore_matches_naive_fixed_point(seed, k):
    df = random_frame(seed, n_users=120, n_items=60)
    u, _ = pd.factorize(df["user"])
    i, _ = pd.factorize(df["item"])
    keep, _ = kcore(u, i, k)
    ref = naive_kcore(df, k)
    assert sorted(np.flatnonzero(keep)) == sorted(ref.index)
    kept = df[keep]
    if len(kept):
        assert kept.groupby("user").size().min() >= k and kept.groupby("item").size().min() >= k


def test_kcore_that_empties_the_data_raises():
    rows = [("a", "x", 1), ("a", "y", 2), ("a", "z", 3), ("b", "x", 4)]
    with pytest.raises(ValueError, match=r"the 5-core is empty; try a smaller kcore") as e:
        preprocess(frame(rows), cfg(kcore=5))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("seed", [0, 1])
def test_shuffled_rows_give_identical_data(seed):
    df = random_frame(seed)
    df = pd.concat([df, df.iloc[::7]], ignore_index=True)  # exact duplicates too
    a = preprocess(df, cfg(kcore=2))
    b = preprocess(df.sample(frac=1.0, random_state=seed + 10).reset_index(drop=True), cfg(kcore=2))
    assert a.stats == b.stats and a.stats["duplicates_dropped"] > 0
    for f in ("items", "timestamps", "offsets", "user_ids", "item_ids"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    for which in ("valid", "test"):
        for x, y in zip(a.split(which), b.split(which)):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.train_counts(), b.train_counts())


def test_sorted_by_time_within_user():
    d = preprocess(random_frame(3), cfg())
    assert d.timestamps is not None
    for u in range(d.n_users):
        t = d.timestamps[d.offsets[u]:d.offsets[u + 1]]
        assert (np.diff(t) >= 0).all()


def test_stable_order_under_timestamp_ties_keeps_file_order():
    rows = [("u", "c", 5), ("v", "p", 1), ("u", "a", 5), ("u", "z", 1), ("v", "q", 1), ("u", "b", 5),
            ("v", "r", 0)]
    d = preprocess(frame(rows), cfg())
    assert seqs(d) == {"u": ["z", "c", "a", "b"], "v": ["r", "p", "q"]}
    # 3 tied pairs (c-a, a-b, p-q) out of 5 consecutive same-user pairs
    assert d.stats["tie_rate"] == pytest.approx(3 / 5)


def test_no_timestamps_keeps_file_order_and_repeats():
    rows = [("u", "c"), ("u", "a"), ("v", "x"), ("u", "c"), ("v", "y"), ("v", "x"), ("u", "c")]
    d = preprocess(frame(rows, with_time=False), cfg())
    assert d.timestamps is None and d.stats["tie_rate"] is None
    assert d.stats["duplicates_dropped"] == 0 and d.stats["repeat_interactions"] == 3
    assert seqs(d) == {"u": ["c", "a", "c", "c"], "v": ["x", "y", "x"]}
    assert d.split_timestamps("test") is None


def test_dedup_drops_exact_duplicates_only():
    rows = [("u", "a", 1), ("u", "a", 1), ("u", "a", 2), ("u", "b", 3), ("u", "c", 4)]
    d = preprocess(frame(rows), cfg())
    assert d.stats["duplicates_dropped"] == 1 and seqs(d)["u"] == ["a", "a", "b", "c"]
    d = preprocess(frame(rows), cfg(dedup=False))
    assert d.stats["duplicates_dropped"] == 0 and len(d.items) == 5


def test_short_users_are_dropped_and_counted():
    rows = [("a", "x", 1), ("a", "y", 2), ("a", "z", 3),
            ("b", "only_b", 1), ("c", "x", 1), ("c", "only_c", 2)]
    d = preprocess(frame(rows), cfg())
    assert list(d.user_ids) == ["a"]
    assert d.stats["short_users_dropped"] == 2 and d.stats["short_interactions_dropped"] == 3
    assert d.n_items == 3 and list(d.item_ids) == ["<pad>", "x", "y", "z"]  # no dead item ids
    with pytest.raises(ValueError, match="no user has >= 4"):
        preprocess(frame(rows), cfg(min_user_interactions=4))


def test_min_user_interactions_below_3_is_impossible():
    with pytest.raises(ValueError, match="min_user_interactions=2 is impossible") as e:
        cfg(min_user_interactions=2)
    assert "\n" not in str(e.value)


def test_partial_timestamps_raise():
    df = frame([("u", "a", 1), ("u", "b", 2), ("u", "c", 3)])
    df["timestamp"] = pd.array([1, pd.NA, 3], dtype="Int64")
    with pytest.raises(ValueError, match="1 of 3 rows lack a timestamp"):
        preprocess(df, cfg())


def test_remap_natural_order_and_padding():
    rows = [("10", "10", 1), ("10", "9", 2), ("10", "2", 3), ("9", "2", 1), ("9", "10", 2),
            ("9", "100", 3)]
    d = preprocess(frame(rows), cfg())
    assert list(d.user_ids) == ["9", "10"]  # integer order, not string order
    assert list(d.item_ids) == ["<pad>", "2", "9", "10", "100"] and d.n_items == 4
    assert d.items.min() == 1 and d.items.max() == d.n_items and d.items.dtype == np.int64
    assert natural_order(np.array(["b", "a", "10"])).tolist() == [2, 1, 0]  # mixed: string order


def test_leave_one_out_views_have_no_leakage():
    d = preprocess(random_frame(5), cfg())
    valid, test = d.split("valid"), d.split("test")
    assert valid.offsets.dtype == np.int64 and valid.targets.shape == (d.n_users,)
    counts = np.zeros(d.n_items + 1, dtype=np.int64)
    for u in range(d.n_users):
        s = d.sequence(u)
        assert len(s) >= 3
        np.testing.assert_array_equal(valid.items[valid.offsets[u]:valid.offsets[u + 1]], s[:-2])
        np.testing.assert_array_equal(test.items[test.offsets[u]:test.offsets[u + 1]], s[:-1])
        assert valid.targets[u] == s[-2] and test.targets[u] == s[-1]
        np.add.at(counts, s[:-2], 1)
    np.testing.assert_array_equal(valid.users, np.arange(d.n_users))
    # item statistics come from training interactions only
    np.testing.assert_array_equal(d.train_counts(), counts)
    assert d.train_counts()[0] == 0
    ts_in, ts_tgt = d.split_timestamps("test")
    np.testing.assert_array_equal(ts_tgt, d.timestamps[d.offsets[1:] - 1])
    assert len(ts_in) == len(test.items)
    with pytest.raises(ValueError, match="unknown split 'train'"):
        d.split("train")


def test_stats_are_json_serialisable():
    import json

    d = preprocess(random_frame(0, n_users=30), cfg(kcore=2))
    s = json.loads(json.dumps(d.stats))
    for key in ("raw_users", "raw_items", "raw_interactions", "duplicates_dropped", "kcore_rounds",
                "short_users_dropped", "users", "items", "interactions", "mean_len", "tie_rate",
                "has_timestamps"):
        assert key in s
    assert s["interactions"] == len(d.items) and s["users"] == d.n_users
