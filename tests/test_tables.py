"""bftrec-report tables (bftrec.report.tables) reads only metrics.json and ranks.csv.gz and pairs users across seeds."""
import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bftrec.experiment import run
from bftrec.report import runs as rr
from bftrec.report import same, tables
from tests.test_train_e2e import smoke_cfg

REPO = Path(__file__).resolve().parent.parent


def _make_tables():
    return tables


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for layer in ("standard", "bft"):
        for seed in (0, 1):
            run(smoke_cfg(root, f"layer={layer}", f"seed={seed}"), root / "runs" / layer / f"seed{seed}")
    return root


def _copy(runs, tmp_path):
    import shutil

    shutil.copytree(runs / "runs", tmp_path / "runs")
    return tmp_path / "runs"


def _edit_config(run_dir: Path, edit) -> None:
    import yaml

    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    edit(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))


def _as_layer(src: Path, dst: Path, layer: str) -> None:
    """A copy of run ``src`` relabelled as layer ``layer`` (a third layer such as bft_h)."""
    import shutil

    shutil.copytree(src, dst)
    m = json.loads((dst / "metrics.json").read_text())
    m["layer"] = layer
    m["test"]["overall"]["HR@10"] *= 1.05
    (dst / "metrics.json").write_text(json.dumps(m))
    _edit_config(dst, lambda c: c["layer"].update(name=layer))


def test_tables_written_with_header_gain_and_p(runs, caplog):
    mt = _make_tables()
    with caplog.at_level("INFO", logger="bftrec.report.tables"):
        mt.main(["--runs", str(runs / "runs"), "--out", str(runs / "tables")])
    out = caplog.text
    assert "wrote 16 files" in out and "summary.md" in out and "meta.md" in out  # says what it wrote
    assert "beyond_tests.md" in out
    beyond = pd.read_csv(runs / "tables" / "beyond.csv")
    assert list(beyond["layer"]) == ["bft", "standard"] and "coverage@10" in beyond and "gini@10" in beyond
    overall = (runs / "tables" / "overall.md").read_text()
    head = overall.split("\n|")[0]
    assert len(head) < 600 and "[protocol.md](protocol.md)" in head  # a short header; the rest is one click away
    assert "HR@10 gain bft (p_seeds, p_Holm, 95% CI)" in overall
    proto = (runs / "tables" / "protocol.md").read_text()
    assert "protocol: leave-one-out" in proto and "commit(s):" in proto and "p_Holm: Holm over" in proto
    assert "B=1000" in proto and "one draw of users shared by every seed" in proto
    assert "- budget per pair (from the runs' configs): synthetic/sasrec: L 12, ≤ 1 epochs, patience" in proto
    strata = (runs / "tables" / "strata.md").read_text()
    for name in ("Q0", "Q4", "cold", "warm"):
        assert name in strata
    mech = (runs / "tables" / "mechanism.md").read_text()
    assert "K bft" in mech and "K at init bft" in mech and "layer 0" in mech
    assert "| at target " in mech and "| history tokens " in mech  # both groupings, each labelled
    assert "nan" not in mech  # K at init is blank on stratum rows
    summary = (runs / "tables" / "summary.csv").read_text().splitlines()
    assert len(summary) == 2 and "Q0 HR@10 gain bft (p_seeds, p_Holm, 95% CI)" in summary[0]
    assert "K Q0 / Q4 bft" in summary[0] and "(at target)" in summary[1]
    comp = pd.read_csv(runs / "tables" / "comparisons.csv", keep_default_na=False)
    assert set(comp["stratum"]) >= {"overall", "Q0", "cold", "warm"}
    for col in ("gain_seeds", "p_seeds", "p_holm_seeds", "ci_lo_seeds", "ci_hi_seeds", "mde_seeds", "endpoint",
                "p_fixed_seeds", "p_holm_fixed_seeds", "ci_lo_fixed_seeds", "flags", "test_note"):
        assert col in comp, col
    pre = comp[comp["endpoint"] == "pre-registered"]
    assert sorted(pre["stratum"]) == ["Q0", "cold", "overall"] and set(pre["metric"]) == {"HR@10"}
    # 1-epoch smoke runs: every row is a trial in its own body, not only in the header
    assert (comp["flags"].str.startswith("TRIAL") | comp["flags"].str.contains("capped")).all()
    assert "capped while validation rose" in (runs / "tables" / "overall.md").read_text()
    meta = pd.read_csv(runs / "tables" / "meta.csv")
    assert set(meta["endpoint"]) == {"HR@10 overall", "HR@10 Q0", "HR@10 cold"} and "p_holm" in meta


def test_budget_line_states_min_epochs(runs, tmp_path):
    """A run with trainer.min_epochs > 0 says so in the budget line; the others' line is unchanged."""
    _make_tables()
    src = _copy(runs, tmp_path)
    for d in src.glob("*/seed*"):
        _edit_config(d, lambda c: c["trainer"].update(min_epochs=1))
    line = rr.budgets(rr.load_runs(src))[0]
    assert "≤ 1 epochs, ≥ 1 before stopping, patience" in line, line
    plain = rr.budgets(rr.load_runs(runs / "runs"))[0]
    assert "before stopping" not in plain and "≤ 1 epochs, patience" in plain, plain


def test_seed_mean_matches_metrics_json(runs):
    mt = _make_tables()
    groups = rr.cells(rr.load_runs(runs / "runs"))
    std = groups[("synthetic", "sasrec", "", "standard")]
    paths = [runs / "runs" / "standard" / f"seed{s}" / "metrics.json" for s in (0, 1)]
    vals = [json.loads(p.read_text())["test"]["overall"]["HR@10"] for p in paths]
    assert mt.fmt(vals) == mt.overall_table(groups, mt.comparisons(groups))["HR@10 standard"].iloc[0]
    assert len(std) == 2


def test_one_seed_prints_the_value_alone():
    mt = _make_tables()
    assert mt.fmt_epochs([7]) == "7 (1 seed)" and mt.fmt_epochs([7, 9]) == "8.0 ± 1.4"
    assert mt.fmt([0.25]) == "0.2500 (1 seed)"


def test_holm_step_down():
    holm = _make_tables().holm
    # sorted 0.01, 0.03, 0.04 (m = 3): 3 * 0.01, max(0.03, 2 * 0.03), max(0.06, 1 * 0.04)
    assert np.allclose(holm([0.01, 0.04, 0.03, None])[:3], [0.03, 0.06, 0.06])
    assert holm([0.01, 0.04, 0.03, None])[3] is None and holm([0.6, 0.9]) == [1.0, 1.0]


def test_bootstrap_interval_is_fixed_and_covers_the_gain():
    ci = _make_tables().bootstrap_gain_ci
    rng = np.random.default_rng(1)
    b = rng.random(300)
    assert np.allclose(ci(2 * b, b), (1.0, 1.0))  # every resample has gain exactly +100%
    a = b + rng.normal(0.05, 0.2, 300)
    lo, hi = ci(a, b)
    assert lo < a.mean() / b.mean() - 1 < hi and ci(a, b) == (lo, hi)  # fixed seed: same interval
    assert ci(a, np.zeros(300)) is None and ci(a[:0], b[:0]) is None


def test_paired_test_averages_users_over_seeds(runs):
    mt = _make_tables()
    groups = rr.cells(rr.load_runs(runs / "runs"))
    std = groups[("synthetic", "sasrec", "", "standard")]
    assert mt.paired_p(std, std, "HR@10") is None  # identical runs: no difference to test
    p = mt.paired_p(groups[("synthetic", "sasrec", "", "bft")], std, "NDCG@10")
    assert p is None or 0.0 <= p <= 1.0


def test_a_layer_with_fewer_seeds_is_compared_on_the_seeds_both_have(runs, tmp_path):
    """bft at seed 0 only against standard at seeds 0 and 1 (a partial grid): seed 0 against seed 0."""
    import shutil

    mt = _make_tables()
    root = _copy(runs, tmp_path)
    shutil.rmtree(root / "bft" / "seed1")
    comp = mt.comparisons(rr.cells(rr.load_runs(root)))
    row = comp[(comp["stratum"] == "overall") & (comp["metric"] == "NDCG@10")].iloc[0]
    ndcg = {(layer, s): json.loads((runs / "runs" / layer / f"seed{s}" / "metrics.json").read_text())
           ["test"]["overall"]["NDCG@10"] for layer in ("standard", "bft") for s in (0, 1)}
    assert ndcg[("standard", 0)] != pytest.approx(ndcg[("standard", 1)], rel=1e-6)  # seeds differ: a real check
    seed0 = (ndcg[("bft", 0)] - ndcg[("standard", 0)]) / ndcg[("standard", 0)]
    assert row["gain"] == pytest.approx(seed0, rel=1e-9, abs=1e-12)
    assert (row["seeds"], row["baseline_seeds"]) == (1, 1)
    std = rr.cells(rr.load_runs(root))[("synthetic", "sasrec", "", "standard")]
    a, b = mt.paired_users(rr.cells(rr.load_runs(root))[("synthetic", "sasrec", "", "bft")], std, "NDCG@10")
    only0, _ = mt.paired_users(std[:1] if std[0]["seed"] == 0 else std[1:], std, "NDCG@10")
    assert np.allclose(b, only0)  # the baseline side is seed 0's per-user metric, not the mean of two


def test_seed_gains_are_each_seed_alone(runs):
    mt = _make_tables()
    comp = mt.comparisons(rr.cells(rr.load_runs(runs / "runs")))
    row = comp[(comp["stratum"] == "overall") & (comp["metric"] == "NDCG@10")].iloc[0]
    ndcg = {(layer, s): json.loads((runs / "runs" / layer / f"seed{s}" / "metrics.json").read_text())
            ["test"]["overall"]["NDCG@10"] for layer in ("standard", "bft") for s in (0, 1)}
    got = dict(pair.split(":") for pair in row["seed_gains"].split())
    assert sorted(got) == ["0", "1"]
    for s in (0, 1):
        want = (ndcg[("bft", s)] - ndcg[("standard", s)]) / ndcg[("standard", s)]
        assert float(got[str(s)]) == pytest.approx(want, abs=6e-5)  # printed to 4 decimals


@pytest.mark.parametrize("gain, gains, want", [
    (0.02, [0.0182, 0.0306, 0.0220], True),
    (0.10, [-0.11, 0.12, 0.31], False),   # Sports SASRec Q0: pooled +10%, one seed negative
    (-0.05, [-0.04, -0.06], True),
    (0.02, [0.03, None], False),          # a seed whose baseline has no hit has no sign
    (0.02, [0.03, 0.0], False),           # zero is no gain
    (0.02, [0.03, 3e-5], True),           # positive though its text rounds to +0.0000
    (0.02, [0.0182], None),               # one seed: no seed-level check
    (None, [0.01, 0.02], None),
])
def test_same_sign_is_every_seed_agreeing_with_the_pooled_gain(gain, gains, want):
    assert _make_tables().same_sign(gain, gains) is want


def test_comparisons_mark_seed_agreement(runs):
    mt = _make_tables()
    comp = mt.comparisons(rr.cells(rr.load_runs(runs / "runs")))
    for _, row in comp.iterrows():
        vals = [float(t.split(":")[1]) for t in row["seed_gains"].split()]
        if row["gain"] is None or pd.isna(row["gain"]):
            assert row["seeds_same_sign"] is None
        else:
            assert row["seeds_same_sign"] == all(np.sign(v) == np.sign(row["gain"]) != 0 for v in vals)


@pytest.mark.parametrize("gains, want", [
    ([0.02, 0.03, 0.025], None),            # filled below from scipy's formula written out
    ([0.02], None), ([0.02, None], None), ([0.01, 0.01, 0.01], None),
])
def test_seed_t_p_is_a_one_sample_t_test_over_seeds(gains, want):
    got = _make_tables().seed_t_p(gains)
    if len(gains) == 3 and len(set(gains)) == 3:
        g = np.array(gains)
        t = g.mean() / (g.std(ddof=1) / np.sqrt(3))
        from scipy.stats import t as student_t
        assert got == pytest.approx(2 * student_t.sf(abs(t), df=2), rel=1e-9)
        assert got < 0.05  # three seeds agreeing closely: significant over seeds
        assert _make_tables().seed_t_p([0.10, -0.12, 0.31]) > 0.3  # one seed against the others: not
    else:
        assert got is want


def test_comparisons_give_p_over_seeds(runs):
    mt = _make_tables()
    comp = mt.comparisons(rr.cells(rr.load_runs(runs / "runs")))
    assert "p_seeds" in comp.columns and len(comp)
    checked = 0
    for _, row in comp.iterrows():
        vals = [float(t.split(":")[1]) for t in row["seed_gains"].split()]
        if row["test_note"]:  # too few hits or seeds: no p value at all, of either kind
            assert all(pd.isna(row[c]) for c in ("p_seeds", "p_holm_seeds", "ci_lo_seeds"))
            assert pd.isna(row["p_fixed_seeds"]) or row["test_note"] != mt.TOO_FEW_HITS
            continue
        if len(vals) >= 2 and not np.isnan(vals).any() and np.ptp(vals) > 1e-3:
            checked += 1
            assert row["gain_seeds"] == pytest.approx(np.mean(vals), abs=1e-4)
            assert 0 < row["p_seeds"] <= 1
            from scipy.stats import ttest_1samp
            assert row["p_seeds"] == pytest.approx(ttest_1samp(vals, 0.0).pvalue, rel=0.05, abs=1e-3)
    assert checked  # the fixture has two seeds per cell: some rows must carry a p over seeds


def test_no_shared_seed_warns(runs, tmp_path, caplog):
    import shutil

    mt = _make_tables()
    root = _copy(runs, tmp_path)
    shutil.rmtree(root / "bft" / "seed1")
    shutil.rmtree(root / "standard" / "seed0")
    groups = rr.cells(rr.load_runs(root))
    with caplog.at_level("WARNING"):
        a, b = mt.matched_seeds(groups[("synthetic", "sasrec", "", "bft")],
                                groups[("synthetic", "sasrec", "", "standard")])
    assert (len(a), len(b)) == (1, 1) and "share no seed ([0] vs [1])" in caplog.text


def test_empty_folder_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.json"):
        rr.load_runs(tmp_path)


def test_several_run_folders_table_their_union_only(runs, tmp_path):
    """A subset of a folder (here: the seed-0 runs of both layers, without the seed-1 runs beside
    them) gives complete tables; a run reached through two of the folders counts once."""
    mt = _make_tables()
    both0 = [runs / "runs" / layer / "seed0" for layer in ("standard", "bft")]
    loaded = rr.load_runs(both0 + [runs / "runs" / "bft" / "seed0"])
    assert sorted((r["layer"], r["seed"]) for r in loaded) == [("bft", 0), ("standard", 0)]
    mt.main(["--runs", *map(str, both0), "--out", str(tmp_path / "t")])
    head = (tmp_path / "t" / "protocol.md").read_text()
    assert "runs: 2;" in head and "PARTIAL" not in head
    with pytest.raises(SystemExit, match="cells missing"):  # the whole folder with seed 1 of bft taken out
        mt.main(["--runs", str(runs / "runs" / "standard"), str(both0[1]), "--out", str(tmp_path / "u")])
    with pytest.raises(SystemExit, match=r"no such folder: .*nowhere; check the run folder paths"):
        rr.load_runs([both0[0], tmp_path / "nowhere"])


def test_grid_cells_are_the_sweep_product():
    _make_tables()
    cells = rr.grid_cells(REPO / "configs" / "experiment" / "paper" / "cpu.yaml")
    assert len(cells) == 108 and ("office", "hstu", "", "bft_h", 2) in cells
    assert len(rr.grid_cells(REPO / "configs" / "experiment" / "paper" / "main.yaml")) == 108
    both = rr.grid_cells([REPO / "configs" / "experiment" / "paper" / f"{g}.yaml" for g in ("main", "main_units")])
    assert len(both) == 117 and ("sports", "hstu", "", "bft_h", 2) in both
    assert ("toys", "hstu", "", "bft_h", 0) not in both


def test_partial_folder_names_missing_cells(runs, tmp_path):
    mt = _make_tables()
    grid = tmp_path / "grid.yaml"
    grid.write_text("hydra:\n  sweeper:\n    params:\n      dataset: synthetic\n      model: sasrec,hstu\n"
                    "      layer: standard,bft\n      seed: 0,1\n")
    args = ["--runs", str(runs / "runs"), "--grid", str(grid), "--out", str(tmp_path / "t")]
    with pytest.raises(SystemExit, match="4 cells missing .*: synthetic: hstu bft, standard seeds 0, 1"):
        mt.main(args)
    assert not (tmp_path / "t").exists()  # no misleading table
    mt.main(args + ["--allow-partial"])
    head = (tmp_path / "t" / "protocol.md").read_text()
    assert "PARTIAL: 4 of 8 cells missing" in head and "\n  - synthetic: hstu bft, standard seeds 0, 1\n" in head
    assert "PARTIAL: 4 of 8 cells missing" in (tmp_path / "t" / "overall.md").read_text()  # the short header too


def test_missing_cells_are_listed_compactly_per_dataset():
    describe = rr.describe_missing
    missing = [("lastfm", m, "", layer, s) for m in ("hstu", "sasrec") for layer in ("bft", "bft_h") for s in (1, 2)]
    missing += [("office", "sasrec", "", "standard", 0)]
    assert describe(missing) == ["lastfm: hstu, sasrec bft, bft_h seeds 1, 2", "office: sasrec standard seed 0"]
    # a backbone whose layers miss different seeds reads as one entry, not as a second backbone
    mixed = [("ml-1m", "hstu", "", "standard", 0), ("ml-1m", "sasrec", "", "bft", 1),
             ("ml-1m", "sasrec", "", "standard", 0)]
    assert describe(mixed) == ["ml-1m: hstu standard seed 0; sasrec bft seed 1 and standard seed 0"]


def test_missing_seed_and_duplicate_run_are_found_without_grid(runs):
    _make_tables()
    loaded = rr.load_runs(runs / "runs")
    assert rr.missing_cells(loaded) == []
    drop = [r for r in loaded if not (r["layer"] == "bft" and r["seed"] == 1)]
    assert rr.missing_cells(drop) == [("synthetic", "sasrec", "", "bft", 1)]
    no_std = [r for r in loaded if not (r["layer"] == "standard" and r["seed"] == 1)]
    assert rr.missing_cells(no_std) == [("synthetic", "sasrec", "", "standard", 1)]
    assert rr.missing_cells([r for r in loaded if r["layer"] == "bft"]) == []  # no standard run: nothing to pair
    with pytest.raises(SystemExit, match="more than one run"):
        rr.missing_cells(loaded + loaded[:1])


def test_runs_of_another_protocol_are_not_compared(runs, tmp_path):
    import shutil

    mt = _make_tables()
    shutil.copytree(runs / "runs", tmp_path / "runs")
    m = tmp_path / "runs" / "bft" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    d["protocol"]["candidates"] = "target + 20 sampled negatives"
    m.write_text(json.dumps(d))
    with pytest.raises(SystemExit, match="differ at candidates"):
        mt.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])


def test_runs_outside_the_grid_are_left_out_and_named(runs, tmp_path):
    mt = _make_tables()
    grid = tmp_path / "grid.yaml"
    grid.write_text("hydra:\n  sweeper:\n    params:\n      dataset: synthetic\n      model: sasrec\n"
                    "      layer: standard,bft\n      seed: range(0,1)\n")
    mt.main(["--runs", str(runs / "runs"), "--grid", str(grid), "--out", str(tmp_path / "t")])
    overall = (tmp_path / "t" / "protocol.md").read_text()
    assert "left out: 2 runs outside the grid" in overall and "runs: 2;" in overall


def test_header_names_overrides_beyond_the_grid_axes(runs, tmp_path):
    import shutil

    mt = _make_tables()
    shutil.copytree(runs / "runs", tmp_path / "runs")
    hydra = tmp_path / "runs" / "bft" / "seed0" / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- layer=bft\n- seed=0\n- trainer.num_threads=1\n- trainer.epochs=2\n")
    mt.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
    head = (tmp_path / "t" / "protocol.md").read_text().split("\n\n")[1]
    assert "overrides beyond dataset, model, layer, seed: trainer.epochs=2 (1 runs)" in head
    assert "num_threads" not in head


def test_same_results_finds_identical_and_changed_cells(runs, tmp_path, capsys):
    import shutil

    shutil.copytree(runs / "runs", tmp_path / "runs")
    assert same.main([str(runs / "runs"), str(tmp_path / "runs")]) == 0
    m = tmp_path / "runs" / "bft" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    d["test"]["overall"]["HR@10"] += 0.01
    m.write_text(json.dumps(d))
    assert same.main([str(runs / "runs"), str(tmp_path / "runs")]) == 1
    assert "synthetic/sasrec/bft/1: differs at test.overall.HR@10" in capsys.readouterr().out
    assert same.main([str(runs / "runs"), str(runs / "runs" / "bft")]) == 0  # a subset matches too


def test_same_results_calls_a_last_bit_difference_the_same(runs, tmp_path, capsys):
    """issue 47: an exact rerun whose MRR differs by 3.7e-8 relative is the same result, not 'differ'."""
    import shutil

    shutil.copytree(runs / "runs", tmp_path / "runs")
    m = tmp_path / "runs" / "bft" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    d["test"]["overall"]["MRR"] *= 1 + 3.7e-8
    m.write_text(json.dumps(d))
    assert same.main([str(runs / "runs"), str(tmp_path / "runs")]) == 0
    assert "same within rtol 1e-06 (largest relative difference 3.7e-08)" in capsys.readouterr().out
    assert same.main([str(runs / "runs"), str(tmp_path / "runs"), "--rtol", "1e-9"]) == 1


def test_every_layer_is_compared_with_standard_side_by_side(runs, tmp_path):
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    for seed in (0, 1):
        _as_layer(root / "bft" / f"seed{seed}", root / "bft_h" / f"seed{seed}", "bft_h")
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])
    overall = pd.read_csv(tmp_path / "t" / "overall.csv")
    for layer in ("bft", "bft_h"):
        assert overall[f"HR@10 gain {layer} (p_seeds, p_Holm, 95% CI)"].str.match(r"[+-]\d").all()
    assert len(overall) == 1  # one row per (dataset, model, tag), the layers side by side
    comp = pd.read_csv(tmp_path / "t" / "comparisons.csv")
    both = comp[(comp["stratum"] == "overall") & (comp["metric"] == "NDCG@10")]
    assert sorted(both["layer"]) == ["bft", "bft_h"]
    # one Holm family per layer: with one comparison each, adjusted p = raw p (bft_h leaves bft's p alone)
    assert np.allclose(both["p_holm_fixed_seeds"].astype(float), both["p_fixed_seeds"].astype(float))
    mech = (tmp_path / "t" / "mechanism.md").read_text()
    assert "K bft_h" in mech and "λ0 bft_h" in mech and "K at init bft_h" in mech


def test_a_key_absent_from_an_older_run_counts_as_its_default(runs, tmp_path):
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    _edit_config(root / "bft" / "seed1", lambda c: c["trainer"].pop("length_bucketing"))
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])  # absent = today's default: comparable
    _edit_config(root / "bft" / "seed0", lambda c: c["trainer"].update(length_bucketing=False))
    with pytest.raises(SystemExit, match="differ at trainer.length_bucketing"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])


def test_a_protocol_key_absent_from_an_older_run_counts_as_its_default(runs, tmp_path):
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    m = root / "bft" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    assert d["protocol"]["exclude_history"] and d["protocol"].pop("exclude_scope") == "all"  # as before the key
    m.write_text(json.dumps(d))
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])  # absent = all: comparable with the others
    m0 = root / "bft" / "seed0" / "metrics.json"
    d0 = json.loads(m0.read_text())
    d0["protocol"]["exclude_scope"] = "window"
    m0.write_text(json.dumps(d0))
    with pytest.raises(SystemExit, match="differ at exclude_scope"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])


@pytest.mark.parametrize("dataset, model, key, old, tuned", [
    ("ml-1m", "hstu", "model.negatives_per", "batch", "position"),
    ("ml-100k", "sasrec", "trainer.train_windows", "last", "sliding"),
])
def test_a_key_absent_from_an_older_run_is_its_schema_default_not_the_tuned_value(dataset, model, key, old, tuned):
    """A run written before ``key`` existed ran with its schema default, though a tuned config sets
    another value today: it must not compare equal to a run with the tuned value."""
    _make_tables()
    assert rr.default_config(dataset, model, "standard")[key] == tuned  # the premise: tuned differs
    assert rr.absent_value({"dataset": dataset, "model": model, "layer": "standard"}, key) == old


def test_normalise_config_is_applied_before_comparing(runs, tmp_path):
    """A v1 config without ``bft.units`` (legacy) compares equal to units=h, and unequal to count."""
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    _edit_config(root / "bft" / "seed0", lambda c: c["layer"]["bft"].update(units="h"))
    _edit_config(root / "bft" / "seed1", lambda c: c["layer"]["bft"].pop("units"))
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])  # legacy == units=h: one cell
    _edit_config(root / "bft" / "seed1", lambda c: c["layer"]["bft"].update(units="count"))
    with pytest.raises(SystemExit, match="differ at layer.bft.units"):  # seeds of one cell: layer.* counts
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t2")])


def test_one_run_folder_gives_tables(runs, tmp_path):
    mt = _make_tables()
    mt.main(["--runs", str(runs / "runs" / "bft" / "seed0"), "--out", str(tmp_path / "t")])
    overall = pd.read_csv(tmp_path / "t" / "overall.csv")
    assert len(overall) == 1 and overall["HR@10 bft"].str.endswith("(1 seed)").all()
    assert (tmp_path / "t" / "mechanism.md").exists() and not (tmp_path / "t" / "summary.md").exists()


def test_a_multirun_sweep_gives_one_row_per_swept_value(runs, tmp_path):
    """A Hydra multirun folder of a sweep over trainer.lr: the swept override names the cells."""
    import shutil

    mt = _make_tables()
    sweep = tmp_path / "multirun" / "2026-01-01"
    job = 0
    for lr in (0.001, 0.002):
        for layer in ("standard", "bft"):
            for seed in (0,):
                d = sweep / "synthetic" / "sasrec" / layer / f"seed{seed}_job{job}"
                shutil.copytree(runs / "runs" / layer / f"seed{seed}", d)
                _edit_config(d, lambda c, lr=lr: c["trainer"].update(lr=lr))
                (d / ".hydra").mkdir()
                (d / ".hydra" / "overrides.yaml").write_text(f"- layer={layer}\n- seed={seed}\n- trainer.lr={lr}\n")
                job += 1
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    mt.main(["--runs", str(tmp_path / "multirun"), "--out", str(tmp_path / "t")])
    overall = pd.read_csv(tmp_path / "t" / "overall.csv", keep_default_na=False)
    assert list(overall["tag"]) == ["trainer.lr=0.001", "trainer.lr=0.002"]
    assert overall["HR@10 gain bft (p_seeds, p_Holm, 95% CI)"].str.match(r"[+-]\d").all()
    assert "TRIAL" not in rr.run_note(rr.load_runs(tmp_path / "multirun"), [])  # a sweep key is no trial override


def test_header_says_which_runs_ran_at_which_commit_when_they_differ(runs, tmp_path):
    """A table mixing commits lists each commit's cells (one commit: the single sha, no list)."""
    mt = _make_tables()
    _copy(runs, tmp_path)
    for layer, sha in (("standard", "a" * 40), ("bft", "b" * 40)):
        for seed in (0, 1):
            env = tmp_path / "runs" / layer / f"seed{seed}" / "env.json"
            env.write_text(json.dumps({**json.loads(env.read_text()), "git_sha": sha, "git_dirty": seed == 1}))
    mt.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
    head = (tmp_path / "t" / "protocol.md").read_text().split("\n\n")[1]
    assert "commit(s): aaaaaaaaaa, aaaaaaaaaa+dirty, bbbbbbbbbb, bbbbbbbbbb+dirty;" in head
    assert "\n  - at aaaaaaaaaa: synthetic: sasrec standard seed 0\n" in head, head
    assert "\n  - at bbbbbbbbbb+dirty: synthetic: sasrec bft seed 1\n" in head, head
    mt.main(["--runs", str(runs / "runs"), "--out", str(tmp_path / "one")])
    assert "  - at " not in (tmp_path / "one" / "overall.md").read_text()


def test_amp_counts_only_where_it_took_effect(runs, tmp_path):
    """bf16 autocast runs on CUDA only: a CPU run's trainer.amp=true is float32, the same computation as
    a GPU run's amp=false (the main grid mixes both), but not as a GPU run's amp=true."""
    mt = _make_tables()
    root = _copy(runs, tmp_path)

    def set_run(seed: int, amp: bool, *devices: str) -> None:
        cell = root / "bft" / f"seed{seed}"
        _edit_config(cell, lambda c: c["trainer"].update(amp=amp))
        env = cell / "env.json"
        env.write_text(json.dumps({**json.loads(env.read_text()), "device": devices[-1]}))
        (cell / "train.log").write_text("".join(f"[x][bftrec][INFO] - sasrec/bft on d: 1 parameters, 9 users, "
                                                f"9 items, device {d}\n" for d in devices))

    set_run(0, True, "cpu")
    set_run(1, False, "cuda")
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])  # both float32: one cell
    set_run(1, True, "cuda")
    with pytest.raises(SystemExit, match="differ at trainer.amp"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t2")])
    set_run(1, True, "cuda", "cpu")  # started on a GPU in bf16, resumed on the CPU: env.json says cpu
    with pytest.raises(SystemExit, match="differ at trainer.amp"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t3")])


def _git(cwd, *args, date=None):
    import os
    import subprocess

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def _registered_study(runs: Path, study: Path, runs_dir: Path, edit_date: str) -> None:
    """The fixture's runs copied to ``runs_dir`` inside a git repository ``study`` (started 2026-12-06 07:00 UTC),
    whose preregistration.md was committed the evening before and edited at ``edit_date``."""
    import shutil

    shutil.copytree(runs / "runs", runs_dir)
    for env in runs_dir.rglob("env.json"):
        env.write_text(json.dumps({**json.loads(env.read_text()), "started": "2026-12-06T07:00:00"}))
    _git(study, "init", "-q")
    (study / "preregistration.md").write_text("primary endpoint: cold users\n")
    _git(study, "add", "preregistration.md")
    _git(study, "commit", "-qm", "register", date="2026-12-05T20:00:00+00:00")
    (study / "preregistration.md").write_text("primary endpoint: overall\n")
    _git(study, "commit", "-qam", "edit", date=edit_date)


@pytest.mark.parametrize("edit_date, reported", [("2026-12-05T23:00:00+00:00", False),
                                                 ("2026-12-06T12:00:00+00:00", True)])
def test_a_preregistration_changed_after_the_first_run_is_reported(runs, tmp_path, edit_date, reported):
    """issue 46: a pre-registration committed before the runs, then edited before (allowed) or after the first
    run started (reported in the tables' header, short and full)."""

    study = tmp_path / "study"
    _registered_study(runs, study, study / "runs", edit_date)
    _make_tables().main(["--runs", str(study / "runs"), "--out", str(tmp_path / "t")])
    short = (tmp_path / "t" / "overall.md").read_text().split("\n|")[0]
    full = (tmp_path / "t" / "protocol.md").read_text()
    for text in (short, full):
        assert ("pre-registration changed after the first registered run" in text) == reported
    if reported:
        assert "later commits: 2026-12-06T12:00:00" in full


def test_runs_with_different_injection_rates_are_never_pooled(runs, tmp_path):
    """issue 46 item 3: seeds of one cell trained at different dataset.inject_rate are refused, not averaged."""
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    _edit_config(root / "bft" / "seed1", lambda c: c["dataset"].update(inject_rate=0.3))
    with pytest.raises(SystemExit, match="inject_rate"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])


def test_noise_injected_per_seed_pools_over_seeds_but_a_layer_and_its_baseline_share_the_data(runs, tmp_path):
    """issue 46 item 3: with dataset.inject_seed null each training seed injects its own noise, so the processed
    data differ between seeds by design and the seeds pool; a layer and its baseline at one seed must have the
    same processed data, and every seed the same raw file."""
    mt = _make_tables()
    root = _copy(runs, tmp_path)

    def inject(run_dir, fingerprint, sha="a" * 64):
        m = run_dir / "metrics.json"
        d = json.loads(m.read_text())
        seed = d["seed"]
        d["data"].update(fingerprint=fingerprint, injection={"rate": 0.1, "seed": seed, "injected": 7})
        d["data"]["source"] = {"sha256": sha}
        m.write_text(json.dumps(d))

    for layer in ("standard", "bft"):
        for seed in (0, 1):
            inject(root / layer / f"seed{seed}", f"{seed}" * 64)
    mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])  # seeds differ, pairs agree: pooled
    inject(root / "bft" / "seed1", "f" * 64)  # the layer saw other noise than its baseline at that seed
    with pytest.raises(SystemExit, match="bft/seed1 and .*standard/seed1 are compared .* trained on different data"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t2")])
    inject(root / "bft" / "seed1", "1" * 64)
    inject(root / "standard" / "seed1", "1" * 64, sha="b" * 64)  # another raw file
    inject(root / "bft" / "seed1", "1" * 64, sha="b" * 64)
    with pytest.raises(SystemExit, match="different data \\(data sha256"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t3")])


def test_a_truncated_metrics_json_is_named_in_one_line(runs, tmp_path):
    """issue 50: make_tables on a torn metrics.json names the file, instead of a 22-line traceback."""
    mt = _make_tables()
    root = _copy(runs, tmp_path)
    bad = root / "bft" / "seed1" / "metrics.json"
    bad.write_text(bad.read_text()[:100])
    with pytest.raises(SystemExit, match=f"bftrec-report: {re.escape(str(bad))} is not valid JSON") as e:
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t")])
    assert "\n" not in str(e.value)


def test_a_tagged_group_variant_is_no_trial_but_debug_and_key_overrides_are():
    _make_tables()
    assert not rr.is_trial_override("+tau_variant=mlp (5 runs)") and not rr.is_trial_override("trainer.amp=false")
    assert rr.is_trial_override("trainer.epochs=2 (1 runs)") and rr.is_trial_override("debug=smoke")


def test_tables_take_rescored_runs_with_their_beyond_accuracy(runs, tmp_path):
    """issue 48: old checkpoints re-scored by bftrec-eval (no validation block) table like runs, with beyond.csv."""
    from bftrec.evaluate import rescore

    for layer in ("standard", "bft"):
        for seed in (0, 1):
            rescore(runs / "runs" / layer / f"seed{seed}", [], tmp_path / "re" / layer / f"seed{seed}")
    _make_tables().main(["--runs", str(tmp_path / "re"), "--out", str(tmp_path / "t")])
    assert (tmp_path / "t" / "beyond.csv").exists()
    overall = pd.read_csv(tmp_path / "t" / "overall.csv", keep_default_na=False)
    assert overall["valid NDCG@10 bft"].iloc[0] == "–"


def test_a_preregistration_is_found_from_a_layers_own_folder(runs, tmp_path):
    """The replication's tables are made from each layer's folder, five levels below the study's
    preregistration.md (<study>/replication/runs/<dataset>/<model>/<layer>): the check must still find it."""

    study = tmp_path / "study"
    deep = study / "replication" / "runs" / "sports" / "hstu"
    _registered_study(runs, study, deep, "2026-12-06T12:00:00+00:00")
    _make_tables().main(["--runs", str(deep / "standard"), str(deep / "bft"), "--out", str(tmp_path / "t")])
    assert "pre-registration changed after the first registered run" in (tmp_path / "t" / "protocol.md").read_text()


def _old_run(runs, tmp_path, layer="bft", seed=0) -> Path:
    """A copy of a fixture run as if written before beyond-accuracy existed (no ``beyond_accuracy``)."""
    import shutil

    dst = tmp_path / "old" / layer / f"seed{seed}"
    shutil.copytree(runs / "runs" / layer / f"seed{seed}", dst)
    m = json.loads((dst / "metrics.json").read_text())
    del m["beyond_accuracy"]
    (dst / "metrics.json").write_text(json.dumps(m))
    return dst


def test_an_old_run_takes_beyond_accuracy_from_its_own_rescore(runs, tmp_path):
    """issue 48 item 2: a run older than the metric, re-scored into <run>/eval_beyond, tables with the re-score's
    block (marked), and the re-score is not an extra seed; a re-score with other item bins is passed over."""
    from bftrec.evaluate import rescore

    old = _old_run(runs, tmp_path)
    assert "beyond_accuracy" not in rr.load_runs(old)[0]
    rescore(old, ["eval.n_bins=3"], old / "eval_bins3")  # scored otherwise: its tail is another set of items
    assert "beyond_accuracy" not in rr.load_runs(old)[0]
    (old / "eval_torn").mkdir()
    (old / "eval_torn" / "metrics.json").write_text('{"beyond_accuracy": {"k": 10')  # a torn write: passed over
    (old / "eval_odd").mkdir()
    (old / "eval_odd" / "metrics.json").write_text('{"beyond_accuracy": {"k": 10}, "test": null}')
    assert "beyond_accuracy" not in rr.load_runs(old)[0]
    rescore(old, [], old / "eval_beyond")
    other = json.loads((old / "eval_beyond" / "metrics.json").read_text())
    other["other_data"] = "data sha256 0123 here, 4567 in the run"  # a --allow-other-data re-score
    (old / "eval_zz").mkdir()
    (old / "eval_zz" / "metrics.json").write_text(json.dumps(other))  # last by name: tried first, passed over
    (r,) = rr.load_runs(old)  # one run, not six
    want = json.loads((runs / "runs" / "bft" / "seed0" / "metrics.json").read_text())["beyond_accuracy"]["overall"]
    assert r["beyond_accuracy"]["from"] == "eval_beyond"
    assert r["beyond_accuracy"]["overall"] == pytest.approx(want)
    from bftrec.report.beyond import beyond_table

    assert beyond_table({("d", "m", "", "bft"): [r]})["lists from"].iloc[0] == "re-score (1 of 1)"
    no_lists = {k: v for k, v in r.items() if k != "beyond_accuracy"}  # a seed whose re-score was passed over
    assert beyond_table({("d", "m", "", "bft"): [r, no_lists]})["lists from"].iloc[0] == \
        "re-score (1 of 1); 1 of 2 runs without lists"

    # a re-score whose block is malformed (no overall values, a missing metric, a NaN) is passed over, named
    good = json.loads((old / "eval_beyond" / "metrics.json").read_text())
    shutil.rmtree(old / "eval_zz")
    bad = {"no overall": {"k": 10}, "missing gini": {"k": 10, "overall": {
        x: v for x, v in good["beyond_accuracy"]["overall"].items() if not x.startswith("gini")}},
        "nan": {"k": 10, "overall": {**good["beyond_accuracy"]["overall"], "tail_share@10": float("nan")}}}
    for name, block in bad.items():
        assert rr.beyond_problem(block)
        (old / "eval_zz").mkdir(exist_ok=True)
        (old / "eval_zz" / "metrics.json").write_text(json.dumps({**good, "beyond_accuracy": block}))
        assert rr.load_runs(old)[0]["beyond_accuracy"]["from"] == "eval_beyond", name  # the next one, valid
    assert rr.beyond_problem(good["beyond_accuracy"]) is None
    own = json.loads((old / "metrics.json").read_text())
    (old / "metrics.json").write_text(json.dumps({**own, "beyond_accuracy": bad["nan"]}))  # the run's own block
    assert rr.load_runs(old)[0]["beyond_accuracy"]["from"] == "eval_beyond"  # left out, the re-score's instead


def test_two_rescores_that_disagree_are_named(runs, tmp_path, caplog):
    """Two qualifying re-scores of one run: the last by name is taken; a warning names both when they differ."""
    from bftrec.evaluate import rescore

    old = _old_run(runs, tmp_path)
    rescore(old, [], old / "eval_a")
    shutil.copytree(old / "eval_a", old / "eval_b")
    with caplog.at_level(logging.WARNING, logger="bftrec"):
        assert rr.load_runs(old)[0]["beyond_accuracy"]["from"] == "eval_b"
    assert "two re-scores" not in caplog.text  # the same block twice: nothing to say
    m = json.loads((old / "eval_a" / "metrics.json").read_text())
    m["beyond_accuracy"]["overall"]["coverage@10"] += 0.01
    (old / "eval_a" / "metrics.json").write_text(json.dumps(m))
    with caplog.at_level(logging.WARNING, logger="bftrec"):
        assert rr.load_runs(old)[0]["beyond_accuracy"]["from"] == "eval_b"
    assert "two re-scores give different beyond-accuracy blocks" in caplog.text
    assert "the tables take eval_b, last by name, not eval_a" in caplog.text


def test_beyond_tests_pair_seeds_and_test_over_them_hand_computed():
    """Per-seed differences 0.01, 0.02, 0.03 (seed 3 of bft has no baseline: left out): mean 0.02, SD 0.01, 95% t
    half-width t(0.975, 2) · 0.01 / √3 = 4.3027 · 0.005774 = 0.0248, t = 3.464 on 2 df: p = 0.0742."""
    from bftrec.report.beyond import beyond_tests

    def run(layer, seed, tail):
        block = {"coverage@10": 0.5, "tail_share@10": tail, "popularity@10": 100.0 + seed, "gini@10": 0.9}
        return {"seed": seed, "layer": layer, "beyond_accuracy": {"k": 10, "overall": block}}

    groups = {("d", "m", "", "standard"): [run("standard", s, 0.10) for s in (0, 1, 2)],
              ("d", "m", "", "bft"): [run("bft", s, 0.10 + d) for s, d in ((0, 0.01), (1, 0.02), (2, 0.03), (3, 0.5))]}
    row = beyond_tests(groups).iloc[0]
    assert row["layer"] == "bft" and row["paired seeds"] == 3
    assert row["Δ tail_share@10 (95% CI, p_seeds)"] == "+0.0200 [-0.0048, +0.0448], p 0.0742"
    assert row["Δ coverage@10 (95% CI, p_seeds)"] == "+0.0000 [+0.0000, +0.0000], p –"  # no spread: no test
    groups[("d", "m", "", "bft")] = groups[("d", "m", "", "bft")][:1]
    assert beyond_tests(groups).iloc[0]["Δ tail_share@10 (95% CI, p_seeds)"] == "+0.0100 (1 seed: no test)"


def test_an_override_equal_to_todays_grid_config_is_no_trial(runs, tmp_path):
    """A rerun started with ``trainer.train_windows=<v>`` before its tuned config said ``<v>`` (issue 46 item 6) is a
    trial only while the grid composes something else: an override equal to today's composed config of the cell is
    listed in the header but flags nothing; one that differs (or an unknown key, or a deletion) stays a trial."""
    import shutil

    shutil.copytree(runs / "runs", tmp_path / "runs")
    run = rr.load_runs(tmp_path / "runs" / "bft" / "seed0")[0]
    now = rr.default_config(run["dataset"], run["model"], run["layer"])["trainer.train_windows"]
    other = "prefixes" if now != "prefixes" else "last"
    assert rr.agrees_with_grid(run, f"trainer.train_windows={now}")
    assert not rr.agrees_with_grid(run, f"trainer.train_windows={other}")
    assert not rr.agrees_with_grid(run, "trainer.no_such_key=1") and not rr.agrees_with_grid(run, "~trainer.lr")
    hydra = tmp_path / "runs" / "bft" / "seed0" / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text(f"- layer=bft\n- seed=0\n- trainer.train_windows={now}\n")
    _make_tables().main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
    head = (tmp_path / "t" / "protocol.md").read_text()
    assert f"trainer.train_windows={now} (1 runs)" in head  # still listed
    assert "TRIAL" not in (tmp_path / "t" / "overall.md").read_text()
    assert "TRIAL" not in "".join(pd.read_csv(tmp_path / "t" / "comparisons.csv")["flags"].fillna(""))
    (hydra / "overrides.yaml").write_text("- layer=bft\n- seed=0\n- trainer.epochs=2\n")
    _make_tables().main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t2")])
    assert "TRIAL: trainer.epochs=2" in "".join(pd.read_csv(tmp_path / "t2" / "comparisons.csv")["flags"].fillna(""))


def test_an_override_is_read_as_hydra_reads_it_and_against_its_experiment(runs, tmp_path):
    """``trainer.lr=1e-3`` is the float 0.001, as Hydra reads it (YAML would read a string); a run started with
    ``experiment=<name>`` is compared with that experiment's composition of its cell, not train.yaml's alone."""
    run = rr.load_runs(runs / "runs" / "bft" / "seed0")[0]
    now = rr.default_config(run["dataset"], run["model"], run["layer"])
    assert rr.agrees_with_grid(run, f"trainer.lr={now['trainer.lr']:e}")  # e.g. 1.000000e-03
    assert not rr.agrees_with_grid(run, f"trainer.lr={now['trainer.lr'] * 2:e}")
    snr = rr.default_config(run["dataset"], run["model"], run["layer"], "snr")
    assert snr["trainer.min_epochs"] != now["trainer.min_epochs"]  # what makes this check able to fail
    with_exp = {**run, "_overrides": ["experiment=snr", *run["_overrides"]]}
    assert rr.agrees_with_grid(with_exp, f"trainer.min_epochs={snr['trainer.min_epochs']}")
    assert not rr.agrees_with_grid(run, f"trainer.min_epochs={snr['trainer.min_epochs']}")
    assert not rr.agrees_with_grid(with_exp, f"trainer.min_epochs={now['trainer.min_epochs']}")


def test_cells_that_no_longer_match_their_grid_are_named(tmp_path):
    """A finished grid cell whose saved config differs from what its grid composes today (a tuned config changed
    since: Beauty SASRec's windows) is named in the tables' header (``grid_drift``); its own overrides are not
    drift (they are TRIAL flags), and a matching cell gives nothing."""
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bftrec.report.runs import CONFIGS, _flat, grid_drift

    grid = CONFIGS / "experiment" / "paper" / "main.yaml"
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        nested = OmegaConf.to_container(compose("train", overrides=[
            "experiment=paper/main", "dataset=beauty", "model=sasrec", "layer=standard"]), resolve=True)
    assert nested["trainer"]["train_windows"] == "prefixes"  # configs/tuned/beauty_sasrec.yaml

    def run(seed, windows, overrides=()):
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        cfg = {**nested, "seed": seed, "trainer": {**nested["trainer"], "train_windows": windows}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        return {"dataset": "beauty", "model": "sasrec", "tag": "", "layer": "standard", "seed": seed,
                "_overrides": list(overrides), "_dir": d, "_env": {"device": "cpu"}}

    assert _flat(nested)["trainer.train_windows"] == "prefixes"
    assert grid_drift([run(0, "prefixes")], grid) == {}
    lines = grid_drift([run(1, "last"), run(2, "last", ["trainer.train_windows=last"])], [grid])
    assert lines == {"trainer.train_windows": "grid config since changed at trainer.train_windows for 1 runs (beauty: "
                     "sasrec standard seed 1): they ran with the earlier value; a grid rerun refuses them until they "
                     "are moved away and rerun"}
    assert grid_drift([run(3, "last")], tmp_path / "elsewhere.yaml") == {}  # not a grid of configs/experiment


def test_a_rescore_kept_inside_a_run_under_any_name_is_no_run(runs, tmp_path):
    """``bftrec-eval standard/seed0 --out bft/seed1/rescore`` leaves a metrics.json inside another run's folder:
    it must not become a run (here it would be a second standard seed 0 and a baseline for bft)."""
    import shutil

    root = _copy(runs, tmp_path)
    n = len(rr.load_runs(root))
    shutil.copytree(root / "standard" / "seed0", root / "bft" / "seed1" / "rescore")
    m = json.loads((root / "bft" / "seed1" / "rescore" / "metrics.json").read_text())
    (root / "bft" / "seed1" / "rescore" / "metrics.json").write_text(json.dumps({**m, "rescored_from": "x"}))
    found = rr.load_runs(root)
    assert len(found) == n and all(r["_dir"].name != "rescore" for r in found)
    assert len(rr.load_runs(root / "bft" / "seed1" / "rescore")) == 1  # named as the root, it is read


def test_layers_tuned_on_their_own_are_compared_only_when_asked(runs, tmp_path):
    """The equal-budget comparison (issue 48 item 3): each layer at its own tuned trainer.lr. Without --own-values
    the tables refuse (the configs differ); with it they compare and name each layer's value; the seeds of one
    cell must still agree."""
    root = _copy(runs, tmp_path)
    for seed in (0, 1):
        _edit_config(root / "bft" / f"seed{seed}", lambda c: c["trainer"].update(lr=0.0123))
    mt = _make_tables()
    with pytest.raises(SystemExit, match="differ at trainer.lr"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t0")])
    assert mt.main(["--runs", str(root), "--out", str(tmp_path / "t"), "--own-values", "trainer.lr"]) in (0, None)
    head = (tmp_path / "t" / "protocol.md").read_text()
    import yaml

    lr = yaml.safe_load((root / "standard" / "seed0" / "config.yaml").read_text())["trainer"]["lr"]
    assert "each layer at its own values of trainer.lr" in head
    assert f"bft trainer.lr=0.0123; standard trainer.lr={lr}" in head
    assert "each layer at its own tuned trainer.lr" in (tmp_path / "t" / "overall.md").read_text()
    assert len(pd.read_csv(tmp_path / "t" / "comparisons.csv")) > 0
    with pytest.raises(SystemExit, match="--own-values trainer.lrr: no run's config.yaml has this key"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t1"), "--own-values", "trainer.lr,trainer.lrr"])
    _edit_config(root / "bft" / "seed1", lambda c: c["trainer"].update(lr=0.0456))  # seeds of a cell disagree
    with pytest.raises(SystemExit, match="differ at trainer.lr"):
        mt.main(["--runs", str(root), "--out", str(tmp_path / "t2"), "--own-values", "trainer.lr"])


def test_runs_of_two_models_get_the_floor_table(runs, tmp_path):
    src = _copy(runs, tmp_path)
    for seed in (0, 1):  # a counted model beside the trained one: the standard runs relabelled as pop
        dst = src / "pop" / f"seed{seed}"
        shutil.copytree(src / "standard" / f"seed{seed}", dst)
        m = json.loads((dst / "metrics.json").read_text())
        m.update(model="pop", n_parameters=0)
        m["test"]["overall"]["HR@10"] = 0.009
        (dst / "metrics.json").write_text(json.dumps(m))
        _edit_config(dst, lambda c: c["model"].update(name="pop"))
    tables.main(["--runs", str(src), "--out", str(tmp_path / "t")])
    floor = (tmp_path / "t" / "floor.md").read_text()
    assert "best HR@10" in floor and "each model's `standard` layer" in floor
    row = pd.read_csv(tmp_path / "t" / "floor.csv", dtype=str).set_index("stratum").loc["overall"]
    assert row["HR@10 pop"] == "0.0090"  # as written, four decimals
    assert "| 0.0090 " in floor  # the markdown keeps the text (no number parsing: 0.009 would lose a digit)
    cols = list(row.index)
    assert cols.index("HR@10 pop") < cols.index("HR@10 sasrec")  # the counted models' columns come first
