"""The positive control's planted synthetic data (issue 46 item 2): ground truth that holds by construction."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bftrec.data.config import DatasetConfig, SyntheticConfig
from bftrec.data.synthetic import generate, generate_with_truth

PLANTED = dict(n_users=600, n_items=200, unreliable_share=0.3, unreliable_rare_bias=1.0, noisy_user_share=0.3,
               noisy_user_rate=0.5)


def test_knobs_at_zero_leave_the_default_data_untouched():
    frame, truth = generate_with_truth(SyntheticConfig())
    pd.testing.assert_frame_equal(frame, generate(SyntheticConfig()))
    assert not truth["planted"].any() and all(truth["item_reliable"].values())


def test_the_next_item_follows_the_last_reliable_genuine_item():
    """With every step a transition (p_transition 1, noise 0), each genuine item after the first reliable
    one is a successor of the user's last reliable, non-inserted item: unreliable and inserted items are
    skipped by the chain, never followed."""
    frame, truth = generate_with_truth(SyntheticConfig(**PLANTED, p_transition=1.0, noise=0.0))
    reliable, succ = truth["item_reliable"], truth["successors"]
    checked = 0
    for (_, d), (_, ins) in zip(frame.groupby("user", sort=False),
                                pd.Series(truth["inserted"]).groupby(frame["user"].to_numpy(), sort=False)):
        anchor = None
        for item, inserted in zip(d["item"], ins):
            if inserted:
                continue
            if anchor is not None:
                assert item in succ[anchor]
                checked += 1
            if reliable[item]:
                anchor = item
    assert checked > 1000


def test_unreliable_items_lean_rare_and_insertions_hit_noisy_users_only():
    frame, truth = generate_with_truth(SyntheticConfig(**PLANTED))
    counts = frame["item"].value_counts()
    unrel = [i for i, ok in truth["item_reliable"].items() if not ok]
    assert len(unrel) == 60  # 30% of 200
    rel = [i for i, ok in truth["item_reliable"].items() if ok]
    assert counts.reindex(unrel).fillna(0).median() < counts.reindex(rel).fillna(0).median()
    ins_users = set(frame["user"][truth["inserted"]])
    assert ins_users and all(truth["noisy_user"][u] for u in ins_users)
    noisy_rows = frame["user"].map(truth["noisy_user"]).to_numpy()
    first = ~frame["user"].duplicated().to_numpy()
    rate = truth["inserted"][noisy_rows & ~first].mean()
    assert 0.45 < rate < 0.55  # noisy_user_rate 0.5 at every position but the first


def test_oracle_drops_planted_inputs_and_keeps_every_test_target():
    planted, _ = generate_with_truth(SyntheticConfig(**PLANTED))
    oracle, truth = generate_with_truth(SyntheticConfig(**PLANTED, oracle_clean=True))
    last = lambda f: f.groupby("user", sort=False).tail(1).reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(last(planted), last(oracle))
    assert oracle.groupby("user").size().min() >= 3 and len(oracle) < 0.85 * len(planted)
    inner = ~(~oracle["user"].duplicated() | ~oracle["user"].duplicated(keep="last")).to_numpy()
    assert truth["planted"][inner].mean() < 0.1  # what stays planted keeps short users at 3 rows


@pytest.mark.parametrize("key, value", [("unreliable_share", 1.5), ("noisy_user_share", -0.1),
                                        ("noisy_user_rate", 1.0), ("unreliable_rare_bias", -1.0)])
def test_a_knob_out_of_range_fails_in_one_line_naming_it(key, value):
    with pytest.raises(ValueError, match=key) as e:
        DatasetConfig(synthetic=SyntheticConfig(**{key: value}))
    assert "\n" not in str(e.value)


def test_every_planted_row_is_an_unreliable_item_or_an_insertion():
    frame, truth = generate_with_truth(SyntheticConfig(**PLANTED))
    unreliable = ~frame["item"].map(truth["item_reliable"]).to_numpy()
    np.testing.assert_array_equal(truth["planted"], unreliable | truth["inserted"])
