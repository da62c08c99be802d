"""Real datasets from ``$BFTREC_DATA_ROOT`` (CI: ../shared/data); those tests are marked ``data``
and skipped when it is unset.

The literal tables below are copied from each dataset's SOURCE.md ("Statistics (computed here)"),
so a wrongly edited yaml (path, format, expected block) fails here too (the config checks run even
without the data).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from bftrec.data.config import DatasetConfig
from bftrec.data.datasets import CONFIG_DIR, dataset_config, dataset_names, load_dataset
from bftrec.data.preprocess import preprocess
from bftrec.data.readers import read

ROOT = os.environ.get("BFTREC_DATA_ROOT")

def needs_data(f):
    skip = pytest.mark.skipif(not ROOT, reason="BFTREC_DATA_ROOT is not set (CI sets it to ../shared/data)")
    return pytest.mark.data(skip(f))


# name -> (users, items, interactions) of the staged file, from SOURCE.md
SOURCE = {
    "sports": (35_598, 18_357, 296_337),
    "beauty": (22_363, 12_101, 198_502),
    "yelp": (30_431, 20_033, 316_354),
    "toys": (19_412, 11_924, 167_597),
    "office": (4_905, 2_420, 53_258),
    "games": (24_303, 10_672, 231_780),
    "lastfm": (1_090, 3_646, 52_551),
    "instruments": (24_772, 9_922, 206_153),
    "instruments-2014": (1_429, 900, 10_261),
    "ml-100k": (943, 1_682, 100_000),
    "ml-1m": (6_040, 3_706, 1_000_209),
    "ml-1m-ts": (2_999, 3_615, 487_650),
}
# after preprocessing: the same, except ML-100K, the only raw (not k-core) set, which gets a 5-core
PROCESSED = {**SOURCE, "ml-100k": (943, 1_349, 99_287)}
TIMESTAMPED = {"sports", "beauty", "yelp", "instruments-2014", "ml-100k", "ml-1m-ts"}
REAL = [n for n in dataset_names()  # generated data sets (the default, the positive control's) have no source
        if yaml.safe_load((CONFIG_DIR / f"{n}.yaml").read_text()).get("format") != "synthetic"]


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("bftrec_cache"))


def test_every_real_dataset_has_a_source_entry():
    assert sorted(REAL) == sorted(SOURCE)
    for name in REAL:
        e = dataset_config(name).expected
        assert (e.users, e.items, e.interactions) == SOURCE[name], name


@needs_data
@pytest.mark.parametrize("name", REAL)
def test_load_matches_source_md(name, cache):
    cfg = dataset_config(name)
    assert (cfg.expected.users, cfg.expected.items, cfg.expected.interactions) == SOURCE[name]
    data = load_dataset(cfg, ROOT, cache)
    s = data.stats
    assert (s["raw_users"], s["raw_items"], s["raw_interactions"]) == SOURCE[name]
    assert (data.n_users, data.n_items, len(data.items)) == PROCESSED[name]
    assert (s["users"], s["items"], s["interactions"]) == PROCESSED[name]
    assert s["duplicates_dropped"] == 0 and s["short_users_dropped"] == 0
    assert s["has_timestamps"] == (name in TIMESTAMPED) == (data.timestamps is not None)
    assert data.items.dtype == np.int64 and data.items.min() == 1 and data.items.max() == data.n_items
    assert data.lengths.min() >= 3 and len(data.item_ids) == data.n_items + 1
    assert s["repeat_interactions"] == (11_830 if name == "yelp" else 0)
    again = load_dataset(cfg, ROOT, cache)  # from the cache
    np.testing.assert_array_equal(again.items, data.items)


@needs_data
@pytest.mark.parametrize("name,s3rec_file", [
    ("sports", "amazon_sports_2014_5core/Sports_and_Outdoors.txt"),
    ("beauty", "amazon_beauty_2014_5core/Beauty.txt"),
    ("yelp", "yelp/Yelp.txt"),
])
def test_timestamped_tsv_reproduces_s3rec_sequences(name, s3rec_file, cache):
    """Sorting the derived TSV by (user, timestamp, file order) gives exactly S3-Rec's sequences
    and ids (same-day ties keep S3-Rec's order)."""
    data = load_dataset(dataset_config(name), ROOT, cache)
    s3 = preprocess(read("s3rec", Path(ROOT) / s3rec_file), DatasetConfig(name=name, format="s3rec"))
    np.testing.assert_array_equal(data.offsets, s3.offsets)
    np.testing.assert_array_equal(data.items, s3.items)
    np.testing.assert_array_equal(data.item_ids, s3.item_ids)
    np.testing.assert_array_equal(data.item_ids[1:].astype(np.int64), np.arange(1, data.n_items + 1))
    tie_rate = data.stats["tie_rate"]
    assert (tie_rate < 0.01) if name == "yelp" else (0.3 < tie_rate < 0.6)  # seconds vs days


@needs_data
def test_ml_1m_ts_is_ml_1m_users_1_to_2999_with_timestamps(cache):
    """ml-1m-ts (the original ratings.dat lines of users 1-2,999) holds the same items per user as ml-1m,
    with timestamps that never go backward. Same-second ties (53.5% of consecutive pairs) are in file order here and in
    the DiffuRec preprocessing's order in ml-1m, so the two orders differ (SOURCE.md)."""
    ts, full = (load_dataset(dataset_config(n), ROOT, cache) for n in ("ml-1m-ts", "ml-1m"))
    row = {str(u): i for i, u in enumerate(full.user_ids)}
    same_test_item = 0
    for i, u in enumerate(ts.user_ids):
        a = ts.item_ids[ts.items[ts.offsets[i]:ts.offsets[i + 1]]].astype(str)  # original movie ids, time order
        j = row[str(u)]
        b = full.item_ids[full.items[full.offsets[j]:full.offsets[j + 1]]].astype(str)
        assert sorted(a) == sorted(b), u
        same_test_item += int(a[-1] == b[-1])
        assert (np.diff(ts.timestamps[ts.offsets[i]:ts.offsets[i + 1]]) >= 0).all(), u
    assert sorted(int(u) for u in ts.user_ids) == list(range(1, 3000))
    assert same_test_item == 2_222  # the tie order decides the test item of 777 users (26%)
    assert abs(ts.stats["tie_rate"] - 0.535) < 1e-3


@needs_data
@pytest.mark.parametrize("fmt,path,stats", [
    ("sasrec", "amazon_videogames_2014/Video.txt", (31_013, 23_715, 287_107)),
    ("tsv", "amazon_instruments_2014_5core/derived/interactions.tsv", (1_429, 900, 10_261)),
])
def test_other_staged_files_read_with_source_md_counts(fmt, path, stats):
    df = read(fmt, Path(ROOT) / path)
    assert (df["user"].nunique(), df["item"].nunique(), len(df)) == stats


@needs_data
def test_instruments_2014_csv_equals_its_derived_tsv():
    a = read("amazon_csv", Path(ROOT) / "amazon_instruments_2014_5core/Musical_instruments_reviews.csv.zip")
    b = read("tsv", Path(ROOT) / "amazon_instruments_2014_5core/derived/interactions.tsv")
    assert a.equals(b)
