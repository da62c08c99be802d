"""dataset.inject_rate: random items injected into the training histories (issue 46 item 3)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bftrec.data.config import DatasetConfig
from bftrec.data.datasets import load_dataset
from bftrec.data.inject import inject_random_items


@pytest.fixture(scope="module")
def clean():
    return load_dataset(DatasetConfig())


def _users(data):
    return [data.items[a:b] for a, b in zip(data.offsets[:-1], data.offsets[1:])]


def test_rate_zero_is_the_identity(clean):
    assert inject_random_items(clean, 0.0, 0) is clean
    assert "injection" not in load_dataset(DatasetConfig()).stats


def test_injection_keeps_targets_and_order_and_adds_about_rate_per_training_item(clean):
    noisy = inject_random_items(clean, 0.3, seed=1)
    before, after = _users(clean), _users(noisy)
    assert len(before) == len(after)
    n_train = 0
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a[-2:], b[-2:])  # the validation and test targets are untouched
        it = iter(a)  # the genuine items are a subsequence of the injected history, in order
        assert all(any(x == y for y in it) for x in b)
        n_train += len(b) - 2
    injected = noisy.stats["injection"]["injected"]
    assert injected == len(noisy.items) - len(clean.items)
    assert 0.27 < injected / n_train < 0.33 and noisy.items.min() >= 1 and noisy.items.max() <= clean.n_items
    assert np.all(np.diff(noisy.timestamps)[np.diff(np.repeat(np.arange(len(after)), [len(a) for a in after])) == 0]
                  >= 0)  # timestamps never decrease within a user
    assert inject_random_items(clean, 0.3, seed=1).items.tolist() == noisy.items.tolist()  # seeded


@pytest.mark.parametrize("rate", [1.0, -0.1, 1.5])
def test_a_rate_out_of_range_fails_in_one_line_naming_it(clean, rate):
    with pytest.raises(ValueError, match="inject_rate") as e:
        DatasetConfig(inject_rate=rate)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="dataset.inject_rate"):
        inject_random_items(clean, rate, 0)


def test_the_rate_reaches_metrics_json(tmp_path):
    from bftrec.experiment import run
    from tests.test_train_e2e import smoke_cfg

    run(smoke_cfg(tmp_path, "dataset.inject_rate=0.2", "dataset.inject_seed=3"), tmp_path / "run")
    got = json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]["injection"]
    assert got["rate"] == 0.2 and got["seed"] == 3 and got["injected"] > 0


def test_the_injection_seed_defaults_to_the_runs_seed(tmp_path):
    """dataset.inject_seed: null (the default): each training seed draws its own injected data."""
    from bftrec.experiment import run
    from tests.test_train_e2e import smoke_cfg

    run(smoke_cfg(tmp_path, "dataset.inject_rate=0.2", "seed=1"), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["data"]["injection"]["seed"] == 1
