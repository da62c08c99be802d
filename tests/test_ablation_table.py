"""bftrec-report ablation (bftrec.report.ablation): the τ ablation table under bft.units=count (one row per
tau=<variant>) and the v1 table, plus the starting λ⁰ the mechanism block records (``lam0_start``)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bftrec.experiment import run
from bftrec.mechanism import aggregate_mechanism
from bftrec.report import ablation
from tests.test_train_e2e import smoke_cfg

REPO = Path(__file__).resolve().parent.parent
CELLS = {"default": (0, 1), "mean_count": (0, 1), "slope_p1": (0,)}  # slope_p1 seed 1 missing: PARTIAL


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A tiny trial sweep laid out as configs/experiment/tau_ablation_count.yaml lays it out."""
    root = tmp_path_factory.mktemp("abl")
    for name, seeds in CELLS.items():
        for seed in seeds:
            run(smoke_cfg(root, "layer=bft", f"+tau_variant={name}", f"seed={seed}"),
                root / "runs" / "synthetic" / "sasrec" / "bft" / f"tau={name}" / f"seed{seed}")
    return root


def _metrics(sweep, name, seed):
    return json.loads((sweep / "runs" / "synthetic" / "sasrec" / "bft" / f"tau={name}" / f"seed{seed}"
                       / "metrics.json").read_text())


def test_variant_table_rows_best_and_partial(sweep, capsys):
    ablation.main(["--runs", str(sweep / "runs"), "--out", str(sweep / "tables")])
    printed = json.loads(capsys.readouterr().out)
    num = pd.read_csv(sweep / "tables" / "synthetic.csv")
    md = (sweep / "tables" / "synthetic.md").read_text()
    assert sorted(num["variant"]) == sorted(CELLS) and list(num["n_seeds"]) == [2, 2, 1]  # default first
    valid = {n: np.mean([_metrics(sweep, n, s)["valid"]["NDCG@10"] for s in seeds]) for n, seeds in CELLS.items()}
    best = max(valid, key=valid.get)
    assert printed["chosen"] == {"synthetic": best} and printed["partial"]
    np.testing.assert_allclose(num.set_index("variant")["valid_NDCG@10_mean"], pd.Series(valid)[num["variant"]])
    delta = num.set_index("variant")["delta_valid_NDCG@10_vs_default"]
    np.testing.assert_allclose(delta["mean_count"], valid["mean_count"] - valid["default"])
    assert "(PARTIAL)" in md.splitlines()[0] and "PARTIAL: 1 of 6 cells missing" in md
    assert "sasrec [tau=slope_p1] bft seed 1" in md and "1 of 2 (seed 0)" in md  # the missing cell and the short row
    assert f"best by validation NDCG@10: **{best}**" in md and "margin to the runner-up" in md
    assert md.count("best valid NDCG@10 |") == 1 and "+tau_variant" not in md
    assert "K initial (per layer)" in md and "λ⁰ Q0: start → best" in md and "λ⁰ Q0/Q4: start → best" in md


def test_start_lambda0_is_recorded_and_moves(sweep):
    """tau_start (after calibration) gives each stratum's starting λ⁰: 1 for scale=count with slope 0,
    uniform over bins for mean_count (τ₀ = log n̄), rising with frequency for slope +1."""
    num = pd.read_csv(sweep / "tables" / "synthetic.csv").set_index("variant")
    np.testing.assert_allclose(num.loc["default", ["lam0_Q0_start", "lam0_Q4_start"]].astype(float), 1.0, rtol=1e-6)
    mc = _metrics(sweep, "mean_count", 0)["mechanism"]["by_item_freq"]
    np.testing.assert_allclose([b["lam0_start"] for b in mc], mc[0]["lam0_start"], rtol=1e-5)
    assert mc[0]["lam0_start"] != pytest.approx(1.0)  # n̄ of the calibration batch, not τ₀ = 0
    p1 = _metrics(sweep, "slope_p1", 0)["mechanism"]["by_item_freq"]
    assert p1[0]["lam0_start"] < p1[-1]["lam0_start"]
    np.testing.assert_allclose(num.loc["slope_p1", "lam0_ratio_start"], p1[0]["lam0_start"] / p1[-1]["lam0_start"])


def test_old_runs_without_lam0_start_get_the_start_only_where_the_config_fixes_it(sweep):
    mt = ablation
    for name, lo, ratio in (("default", 1.0, 1.0), ("mean_count", None, 1.0), ("slope_p1", None, None)):
        m = _metrics(sweep, name, 0)
        for b in m["mechanism"]["by_item_freq"]:
            del b["lam0_start"]
        got = mt.lam0_bins(m)
        assert (got["lo_start"], got["ratio_start"]) == (lo, ratio), name
    assert mt._moved([1.0, None], [0.5, 0.7]).startswith("? → 0.600")


@pytest.mark.parametrize("layer", ["bft", "bft_h"])
def test_compare_with_v1_says_plainly_when_h_wins(sweep, tmp_path, layer):
    src = sweep / "runs" / "synthetic" / "sasrec" / "bft" / "tau=default" / "seed0"
    dst = tmp_path / "v1" / "synthetic" / "sasrec" / layer / "seed0"
    shutil.copytree(src, dst)
    m = json.loads((dst / "metrics.json").read_text())
    m["tag"], m["valid"]["NDCG@10"], m["layer"] = None, 1.0, layer
    if layer == "bft":
        del m["layer_config"]["bft"]["units"]  # a legacy v1 run: units=h (upgrade_legacy_layer)
    else:
        m["layer_config"]["bft"]["units"] = "h"  # layer=bft_h
    (dst / "metrics.json").write_text(json.dumps(m))
    ablation.main(["--runs", str(sweep / "runs"), "--out", str(tmp_path / "t"),
                                             "--compare", str(tmp_path / "v1")])
    md = (tmp_path / "t" / "synthetic.md").read_text()
    assert "v1 (bft.units=h) SASRec bft" in md and "h BEATS count on validation" in md


def test_grid_names_every_expected_variant():
    datasets, tags, seeds = ablation.grid_expected(
        REPO / "configs" / "experiment" / "tau_ablation_count.yaml")
    assert datasets == ["office", "instruments-2014"] and seeds == [0, 1, 2]
    assert tags[0] == "tau=default" and len(tags) == 7 and "tau=lr100" in tags


def test_v1_table_still_regenerates_the_committed_csv(tmp_path):
    ablation.main(["--runs", str(REPO / "results" / "office_sasrec" / "ablation"),
                                             "--out", str(tmp_path / "tau_ablation")])
    got = pd.read_csv(tmp_path / "tau_ablation.csv")
    pd.testing.assert_frame_equal(got, pd.read_csv(REPO / "results" / "office_sasrec" / "tau_ablation.csv"))


def test_aggregate_mechanism_lam0_start_is_the_token_mean_of_exp_tau_start():
    items = torch.tensor([[0, 1, 2, 3], [0, 0, 3, 3]])  # (B, L), 0 is padding
    layer = {"K": torch.full((2, 4), 0.5)}
    sink = [{"mech": {"units": "count", "lam0": torch.ones(2, 4), "layers": [layer]}, "item_seq": items,
             "users": np.array([0, 1])}]
    counts = np.array([0, 1, 1, 9])  # item 3 is frequent
    bins = [{"bin": "Q0", "lo": 0, "hi": 1, "n_items": 2}, {"bin": "Q1", "lo": 2, "hi": 9, "n_items": 1}]
    tau_start = torch.tensor([0.0, 0.0, np.log(2.0), np.log(4.0)])
    out = aggregate_mechanism(sink, counts, bins, np.array([3, 2]), 2, tau_start)
    lo, hi = out["by_item_freq"]
    np.testing.assert_allclose([lo["lam0_start"], hi["lam0_start"]], [(1 + 2) / 2, 4.0])
    np.testing.assert_allclose(out["cold_users"]["lam0_start"], 4.0)  # user 1 (history 2) holds items 3, 3
    assert "lam0_start" not in aggregate_mechanism(sink, counts, bins, np.array([3, 2]), 2)["by_item_freq"][0]


def test_grid_lists_variants_and_datasets_without_any_run(sweep, tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text("hydra:\n  sweeper:\n    params:\n      dataset: synthetic,office\n"
                    "      +tau_variant: default,mean_count,slope_p1,lr10\n      seed: 0,1\n")
    ablation.main(["--runs", str(sweep / "runs"), "--out", str(tmp_path / "t"),
                                             "--grid", str(grid)])
    assert json.loads(capsys.readouterr().out)["partial"]
    md = (tmp_path / "t" / "synthetic.md").read_text()
    assert "PARTIAL: 3 of 8 cells missing" in md and "sasrec [tau=lr10] bft seeds 0, 1" in md
    assert "PARTIAL: no run yet" in (tmp_path / "t" / "office.md").read_text()


def test_a_folder_without_bft_runs_is_one_line(tmp_path):
    run(smoke_cfg(tmp_path, "layer=standard"), tmp_path / "runs" / "standard")
    with pytest.raises(SystemExit, match="have no τ settings .*give a folder of BFT runs"):
        ablation.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
