"""scripts/make_tables.py reads only metrics.json and ranks.csv.gz and pairs users across seeds."""
import json
from pathlib import Path

import pytest

from bftrec.train import run
from tests.scripts import load_script
from tests.test_train_e2e import smoke_cfg

REPO = Path(__file__).resolve().parent.parent


def _make_tables():
    return load_script("make_tables")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for layer in ("standard", "bft"):
        for seed in (0, 1):
            run(smoke_cfg(root, f"layer={layer}", f"seed={seed}"), root / "runs" / layer / f"seed{seed}")
    return root


def test_tables_written_with_header_gain_and_p(runs):
    mt = _make_tables()
    mt.main(["--runs", str(runs / "runs"), "--out", str(runs / "tables")])
    overall = (runs / "tables" / "overall.md").read_text()
    assert "protocol: leave-one-out" in overall and "commit(s):" in overall
    assert "HR@10 gain" in overall and "HR@10 p" in overall
    strata = (runs / "tables" / "strata.md").read_text()
    for name in ("Q0", "Q4", "cold", "warm"):
        assert name in strata
    mech = (runs / "tables" / "mechanism.md").read_text()
    assert "mean K" in mech and "layer 0" in mech
    summary = (runs / "tables" / "summary.csv").read_text().splitlines()
    assert len(summary) == 2 and "Q0 HR@10 gain (p)" in summary[0] and "K Q0 / Q4" in summary[0]


def test_seed_mean_matches_metrics_json(runs):
    mt = _make_tables()
    groups = mt.cells(mt.load_runs(runs / "runs"))
    std = groups[("synthetic", "sasrec", "", "standard")]
    paths = [runs / "runs" / "standard" / f"seed{s}" / "metrics.json" for s in (0, 1)]
    vals = [json.loads(p.read_text())["test"]["overall"]["HR@10"] for p in paths]
    assert mt.fmt(vals) == mt.overall_table(groups).query("layer == 'standard'")["HR@10"].iloc[0]
    assert len(std) == 2


def test_paired_test_averages_users_over_seeds(runs):
    mt = _make_tables()
    groups = mt.cells(mt.load_runs(runs / "runs"))
    std = groups[("synthetic", "sasrec", "", "standard")]
    assert mt.paired_p(std, std, "HR@10") is None  # identical runs: no difference to test
    p = mt.paired_p(groups[("synthetic", "sasrec", "", "bft")], std, "NDCG@10")
    assert p is None or 0.0 <= p <= 1.0


def test_empty_folder_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.json"):
        _make_tables().load_runs(tmp_path)


def test_grid_cells_are_the_sweep_product():
    mt = _make_tables()
    cells = mt.grid_cells(REPO / "configs" / "experiment" / "paper" / "cpu.yaml")
    assert len(cells) == 108 and ("office", "hstu", "", "bft_h", 2) in cells
    assert len(mt.grid_cells(REPO / "configs" / "experiment" / "paper" / "main.yaml")) == 108


def test_partial_folder_names_missing_cells(runs, tmp_path):
    mt = _make_tables()
    grid = tmp_path / "grid.yaml"
    grid.write_text("hydra:\n  sweeper:\n    params:\n      dataset: synthetic\n      model: sasrec,hstu\n"
                    "      layer: standard,bft\n      seed: 0,1\n")
    args = ["--runs", str(runs / "runs"), "--grid", str(grid), "--out", str(tmp_path / "t")]
    with pytest.raises(SystemExit, match="synthetic/hstu/bft: seeds 0, 1; synthetic/hstu/standard: seeds 0, 1"):
        mt.main(args)
    assert not (tmp_path / "t").exists()  # no misleading table
    mt.main(args + ["--allow-partial"])
    assert "PARTIAL: 2 cell groups missing" in (tmp_path / "t" / "overall.md").read_text()


def test_missing_seed_and_duplicate_run_are_found_without_grid(runs):
    mt = _make_tables()
    loaded = mt.load_runs(runs / "runs")
    assert mt.missing_cells(loaded) == []
    drop = [r for r in loaded if not (r["layer"] == "bft" and r["seed"] == 1)]
    assert mt.missing_cells(drop) == ["synthetic/sasrec/bft: seeds 1"]
    no_std = [r for r in loaded if r["layer"] == "bft"]
    assert mt.missing_cells(no_std) == ["synthetic/sasrec/standard: seeds 0, 1"]
    with pytest.raises(SystemExit, match="more than one run"):
        mt.missing_cells(loaded + loaded[:1])


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
    overall = (tmp_path / "t" / "overall.md").read_text()
    assert "left out: 2 runs outside the grid" in overall and "runs: 2;" in overall


def test_header_names_overrides_beyond_the_grid_axes(runs, tmp_path):
    import shutil

    mt = _make_tables()
    shutil.copytree(runs / "runs", tmp_path / "runs")
    hydra = tmp_path / "runs" / "bft" / "seed0" / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- layer=bft\n- seed=0\n- trainer.num_threads=1\n- trainer.epochs=2\n")
    mt.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "t")])
    head = (tmp_path / "t" / "overall.md").read_text().split("\n\n")[1]
    assert "overrides beyond dataset, model, layer, seed: trainer.epochs=2 (1 runs)" in head
    assert "num_threads" not in head


def test_same_results_finds_identical_and_changed_cells(runs, tmp_path, capsys):
    import shutil

    same = load_script("same_results")
    shutil.copytree(runs / "runs", tmp_path / "runs")
    assert same.main([str(runs / "runs"), str(tmp_path / "runs")]) == 0
    m = tmp_path / "runs" / "bft" / "seed1" / "metrics.json"
    d = json.loads(m.read_text())
    d["test"]["overall"]["HR@10"] += 0.01
    m.write_text(json.dumps(d))
    assert same.main([str(runs / "runs"), str(tmp_path / "runs")]) == 1
    assert "synthetic/sasrec/bft/1: differs at test.overall.HR@10" in capsys.readouterr().out
    assert same.main([str(runs / "runs"), str(runs / "runs" / "bft")]) == 0  # a subset matches too
