"""load_dataset: data root, checksums, expected statistics, the on-disk cache, configs, download."""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

from bftrec.data import datasets
from bftrec.data.config import DatasetConfig, ExpectedStats
from bftrec.data.datasets import (
    cache_key,
    dataset_config,
    dataset_names,
    download,
    load_dataset,
    verify_checksum,
)
from bftrec.data.readers import READERS

TEXT = "1 1 2 3 4\n2 2 3 4\n3 1 3\n4 9\n"


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("BFTREC_DATA_ROOT", raising=False)
    monkeypatch.delenv("BFTREC_CACHE_DIR", raising=False)
    (tmp_path / "raw" / "toy").mkdir(parents=True)
    (tmp_path / "raw" / "toy" / "seqs.txt").write_text(TEXT)
    return tmp_path


def toy(**kw) -> DatasetConfig:
    base = dict(name="toy", format="s3rec", path="toy/seqs.txt",
                sha256=hashlib.sha256(TEXT.encode()).hexdigest(),
                expected=ExpectedStats(users=4, items=5, interactions=10))
    base.update(kw)
    return DatasetConfig(**base)


@pytest.fixture
def counting_reader(monkeypatch):
    calls = []
    original = READERS.get("s3rec")

    def reader(path):
        calls.append(path)
        return original(path)

    monkeypatch.setitem(READERS._items, "s3rec", reader)
    return calls


def assert_same(a, b):
    assert a.name == b.name and a.n_items == b.n_items and a.stats == b.stats
    for f in ("items", "offsets", "user_ids", "item_ids"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert getattr(a, f).dtype == getattr(b, f).dtype
    assert (a.timestamps is None) == (b.timestamps is None)


def test_second_load_hits_the_cache(root, counting_reader):
    first = load_dataset(toy(), str(root / "raw"), str(root / "cache"))
    second = load_dataset(toy(), str(root / "raw"), str(root / "cache"))
    assert len(counting_reader) == 1
    assert_same(first, second)
    assert first.stats["short_users_dropped"] == 2 and first.n_users == 2
    assert list(second.item_ids) == ["<pad>", "1", "2", "3", "4"]  # item 9 left with user 4
    assert len(list((root / "cache").glob("toy-*.npz"))) == 1
    assert not list((root / "cache").glob("*.tmp"))


def test_env_vars_set_roots(root, counting_reader, monkeypatch):
    monkeypatch.setenv("BFTREC_DATA_ROOT", str(root / "raw"))
    monkeypatch.setenv("BFTREC_CACHE_DIR", str(root / "envcache"))
    load_dataset(toy())
    assert list((root / "envcache").glob("toy-*.npz"))


def test_use_cache_false_reads_again(root, counting_reader):
    for _ in range(2):
        load_dataset(toy(), str(root / "raw"), str(root / "cache"), use_cache=False)
    assert len(counting_reader) == 2 and not (root / "cache").exists()


def test_preprocessing_fields_change_the_key():
    base = cache_key(toy(), "abc")
    for change in (dict(kcore=2), dict(dedup=False), dict(min_user_interactions=4),
                   dict(format="sasrec"), dict(name="toy2")):
        assert cache_key(toy(**change), "abc") != base, change
    for same in (dict(citation="x"), dict(url="http://x"), dict(expected=ExpectedStats())):
        assert cache_key(toy(**same), "abc") == base, same
    assert cache_key(toy(), "abd") != base


def test_changed_raw_file_is_read_again(root, counting_reader):
    load_dataset(toy(sha256=None, expected=ExpectedStats()), str(root / "raw"), str(root / "cache"))
    (root / "raw" / "toy" / "seqs.txt").write_text(TEXT + "5 1 2 3\n")
    d = load_dataset(toy(sha256=None, expected=ExpectedStats()), str(root / "raw"),
                     str(root / "cache"))
    assert len(counting_reader) == 2 and d.n_users == 3


def test_a_broken_cache_file_is_recomputed(root, counting_reader):
    load_dataset(toy(), str(root / "raw"), str(root / "cache"))
    (cache_file,) = (root / "cache").glob("toy-*.npz")
    cache_file.write_bytes(b"garbage")
    d = load_dataset(toy(), str(root / "raw"), str(root / "cache"))
    assert len(counting_reader) == 2 and d.n_users == 2


@pytest.mark.parametrize("fld,value", [("users", 5), ("items", 4), ("interactions", 11)])
def test_expected_stats_mismatch(root, fld, value):
    bad = dataclasses.replace(toy().expected, **{fld: value})
    for _ in range(2):  # fresh read, then (after a good load filled the cache) a cache hit
        with pytest.raises(ValueError) as e:
            load_dataset(toy(expected=bad), str(root / "raw"), str(root / "cache"))
        msg = str(e.value)
        assert "\n" not in msg and f"expected {value} {fld}" in msg and "seqs.txt" in msg
        assert "'toy'" in msg
        load_dataset(toy(), str(root / "raw"), str(root / "cache"))


def test_checksum_mismatch(root):
    with pytest.raises(ValueError, match="checksum mismatch .*seqs.txt") as e:
        load_dataset(toy(sha256="0" * 64), str(root / "raw"), str(root / "cache"))
    assert "\n" not in str(e.value)


def test_verify_checksum(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"hello")
    digest = hashlib.sha256(b"hello").hexdigest()
    assert verify_checksum(p, digest) == digest == verify_checksum(p, None)
    assert verify_checksum(p, digest.upper()) == digest
    with pytest.raises(ValueError, match="expected 00"):
        verify_checksum(p, "00" * 32)
    with pytest.raises(FileNotFoundError, match="BFTREC_DATA_ROOT"):
        verify_checksum(tmp_path / "nope", digest)


def test_missing_data_root_and_missing_file(root):
    with pytest.raises(ValueError, match=r"BFTREC_DATA_ROOT=/path, or pass data_root=/path to bftrec-train"):
        load_dataset(toy())
    with pytest.raises(FileNotFoundError) as e:
        load_dataset(toy(path="toy/none.txt"), str(root / "raw"))
    assert str((root / "raw" / "toy" / "none.txt").resolve()) in str(e.value)


def test_download_from_a_local_url(root):
    src = root / "raw" / "toy" / "seqs.txt"
    cfg = toy(url=src.as_uri(), path="copy/seqs.txt")
    dest = download(cfg, str(root / "dl"))
    assert dest == root / "dl" / "copy" / "seqs.txt" and dest.read_text() == TEXT
    assert download(cfg, str(root / "dl")) == dest  # already there, checksum ok
    with pytest.raises(ValueError, match="checksum mismatch"):
        download(toy(url=src.as_uri(), path="bad/seqs.txt", sha256="1" * 64), str(root / "dl"))
    assert not (root / "dl" / "bad" / "seqs.txt").exists()
    assert not list((root / "dl" / "bad").glob("*"))  # no partial file left
    with pytest.raises(ValueError, match="no direct download url"):
        download(toy(url=None, path="x/y.txt"), str(root / "dl"))
    with pytest.raises(OSError, match="download of .* failed"):
        download(toy(url=(root / "missing.txt").as_uri(), path="m/y.txt"), str(root / "dl"))


# --------------------------------------------------------------------------- configs


def test_every_yaml_loads_and_is_named_after_its_file():
    names = dataset_names()
    assert {"synthetic", "sports", "beauty", "yelp", "toys", "office", "games", "lastfm",
            "instruments", "instruments-2014", "ml-100k", "ml-1m"} <= set(names)
    for name in names:
        cfg = dataset_config(name)
        assert cfg.name == name
        assert cfg.format == "synthetic" or cfg.format in READERS
        if cfg.format != "synthetic":
            assert cfg.path and cfg.sha256 and len(cfg.sha256) == 64
            assert None not in (cfg.expected.users, cfg.expected.items, cfg.expected.interactions)


def test_config_errors_are_one_line(tmp_path):
    (tmp_path / "typo.yaml").write_text("name: typo\nkcoer: 5\n")
    (tmp_path / "deep.yaml").write_text("name: deep\nsynthetic:\n  n_userz: 5\n")
    (tmp_path / "stem.yaml").write_text("name: other\n")
    (tmp_path / "low.yaml").write_text("name: low\nmin_user_interactions: 1\n")
    for name, pattern in [("typo", "kcoer"), ("deep", "synthetic.n_userz"),
                          ("stem", "must equal the file stem"), ("low", "impossible"),
                          ("nope", "unknown dataset 'nope'; known: deep, low, stem, typo")]:
        with pytest.raises(ValueError, match=pattern) as e:
            dataset_config(name, tmp_path)
        assert "\n" not in str(e.value)


def test_load_accepts_a_dictconfig():
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(OmegaConf.structured(DatasetConfig),
                          {"synthetic": {"n_users": 40, "n_items": 30}})
    d = load_dataset(cfg)
    assert d.n_users == 40 and d.stats.get("source") is None
    with pytest.raises(ValueError, match="bogus"):
        load_dataset({"bogus": 1})


def test_module_has_no_stray_roots():
    assert datasets.CONFIG_DIR.name == "dataset" and datasets.CONFIG_DIR.is_dir()
