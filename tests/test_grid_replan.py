"""scripts/grid_replan.py: a grid's finished cells against the estimate, and the rest projected again (no runs)."""
import json

import pandas as pd
import pytest

from tests.scripts import load_script


def _estimate(path, cells):
    rows = [{"dataset": d, "model": m, "layer": lay, "seed": s, "s_per_epoch": spe, "overhead_s": 10.0,
             "epochs_expected": 40, "epochs_cap": 200, "expected_s": 40 * spe + 10.0, "cap_s": 200 * spe + 10.0}
            for d, m, lay, s, spe in cells]
    path.write_text(json.dumps({"grid": "main", "date": "2026-12-01T00:00:00", "device": "cpu x2", "threads": 1,
                                "cpu_overrides": ["trainer.device=cpu"], "cells": rows}))


def _finish(runs, cell, seconds, best):
    d = runs.joinpath(*cell.split("/"))
    d.mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, len(seconds) + 1), "train_seconds": [s - 1.0 for s in seconds],
                  "eval_seconds": [1.0] * len(seconds)}).to_csv(d / "history.csv", index=False)
    (d / "metrics.json").write_text(json.dumps({"best_epoch": best}))


def test_replan_measures_finished_cells_and_projects_the_rest(tmp_path):
    rp = load_script("grid_replan")
    est = tmp_path / "est.json"
    _estimate(est, [("sports", "sasrec", "standard", 0, 10.0), ("sports", "sasrec", "standard", 1, 10.0),
                    ("toys", "sasrec", "standard", 0, 5.0), ("toys", "hstu", "bft", 0, 4.0)])
    runs = tmp_path / "runs"
    _finish(runs, "sports/sasrec/standard/seed0", [20.0, 20.0, 26.0, 20.0], best=2)  # median 20: ratio 2
    (runs / "sports/sasrec/standard/seed1").mkdir(parents=True)  # started, unfinished: a missing cell
    out = tmp_path / "replan.json"
    rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out), "--slices-md", str(tmp_path / "s.md")])
    r = json.loads(out.read_text())
    (done,) = r["finished_cells"]
    assert done["epochs_run"] == 4 and done["best_epoch"] == 2 and done["s_per_epoch"] == 20.0
    assert done["ratio_s_per_epoch"] == 2.0 and done["run_s"] == 86.0 and done["ratio_run_s"] == round(86 / 410, 3)
    left = {(c["dataset"], c["model"], c["seed"]): c for c in r["missing_cells"]}
    assert set(left) == {("sports", "sasrec", 1), ("toys", "sasrec", 0), ("toys", "hstu", 0)}
    same = left[("sports", "sasrec", 1)]  # its own (dataset, backbone, layer) was measured
    assert same["s_per_epoch"] == 20.0 and same["epochs"] == 4 and same["expected_s"] == 4 * 20.0 + 10.0 * 2.0
    other = left[("toys", "sasrec", 0)]  # the estimate scaled by its backbone and layer's ratio
    assert other["s_per_epoch"] == 10.0 and "backbone and layer" in other["s_per_epoch_rule"]
    assert other["epochs"] == 4  # epochs of the same backbone and layer elsewhere
    hstu = left[("toys", "hstu", 0)]  # nothing of its backbone finished: all cells' ratio, the estimate's epochs
    assert hstu["s_per_epoch"] == 8.0 and "all" in hstu["s_per_epoch_rule"] and hstu["epochs"] == 40
    assert r["totals"]["cells"] == 3 and sum(s["cells"] for s in r["slices"]) == 3
    assert "missing cells" in (tmp_path / "s.md").read_text()


def test_replan_scales_the_other_layer_of_the_same_dataset_and_backbone(tmp_path):
    rp = load_script("grid_replan")
    est = tmp_path / "est.json"
    _estimate(est, [("sports", "sasrec", "standard", 0, 10.0), ("sports", "sasrec", "bft", 0, 8.0),
                    ("toys", "sasrec", "standard", 0, 5.0), ("toys", "sasrec", "bft", 0, 5.0)])
    runs = tmp_path / "runs"  # the backbone-and-layer rule would give 8 x 3 = 24 s/epoch
    _finish(runs, "sports/sasrec/standard/seed0", [20.0] * 4, best=3)
    _finish(runs, "toys/sasrec/standard/seed0", [10.0] * 3, best=2)
    _finish(runs, "toys/sasrec/bft/seed0", [15.0] * 5, best=4)  # bft/standard s/epoch 1.5 on toys
    out = tmp_path / "replan.json"
    rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out)])
    (cell,) = json.loads(out.read_text())["missing_cells"]
    assert (cell["dataset"], cell["layer"]) == ("sports", "bft")
    assert cell["s_per_epoch"] == 30.0 and "measured standard on the same dataset" in cell["s_per_epoch_rule"]
    assert cell["epochs"] == 4 and "same dataset and backbone" in cell["epochs_rule"]  # not bft's 5 on toys
    assert cell["expected_s"] == 4 * 30.0 + 10.0 * 30.0 / 8.0  # overhead scaled by 30 / 8


def test_replan_bad_input_is_one_line(tmp_path):
    rp = load_script("grid_replan")

    def call(runs):
        rp.main(["--runs", str(tmp_path / runs), "--estimate", str(tmp_path / "e.json"), "--out", str(tmp_path / "o")])

    with pytest.raises(SystemExit, match="no runs folder"):
        call("nope")
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="no estimate"):
        call("runs")
    (tmp_path / "e.json").write_text("{}")
    with pytest.raises(SystemExit, match="lists no cells"):
        call("runs")


def test_replan_takes_epochs_from_reference_runs_of_the_same_recipe(tmp_path):
    """ML-1M SASRec with no grid cell finished: the windows study's run (same tuned config) beats the
    other datasets' SASRec epochs; a run at another tuned config is not used."""
    rp = load_script("grid_replan")
    est = tmp_path / "est.json"
    _estimate(est, [("sports", "sasrec", "standard", 0, 10.0), ("ml-1m", "sasrec", "standard", 0, 50.0)])
    runs = tmp_path / "runs"
    _finish(runs, "sports/sasrec/standard/seed0", [20.0] * 4, best=3)
    ref = tmp_path / "windows"
    for sub, tuned, epochs in (("a", "ml-1m_sasrec", 91), ("b", "ml-1m_sasrec", 69), ("c", "ml-1m_other", 7)):
        (ref / sub).mkdir(parents=True)
        (ref / sub / "metrics.json").write_text(json.dumps({"dataset": "ml-1m", "model": "sasrec", "layer": "standard",
                                                            "tuned_config": tuned, "epochs_run": epochs}))
    out = tmp_path / "replan.json"
    rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out), "--epochs-from", str(ref)])
    (cell,) = json.loads(out.read_text())["missing_cells"]
    assert cell["epochs"] == 80.0 and "2 reference runs at the same tuned config" in cell["epochs_rule"]
    rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out)])  # without: other datasets' epochs
    (cell,) = json.loads(out.read_text())["missing_cells"]
    assert cell["epochs"] == 4 and "same backbone and layer" in cell["epochs_rule"]
    with pytest.raises(SystemExit, match="no folder .* for --epochs-from"):
        rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out), "--epochs-from", str(tmp_path / "x")])


def test_epochs_on_another_device_count_for_epochs_not_for_seconds(tmp_path):
    """A cell trained on a GPU (or started there and resumed on the CPU) says nothing about CPU seconds: it
    is not timed, but its epochs still inform the projection."""
    rp = load_script("grid_replan")
    log = ("[x][bftrec][INFO] - sasrec/bft on ml-1m: 1 parameters, 9 users, 9 items, device {dev}\n")
    est = tmp_path / "est.json"
    _estimate(est, [("ml-1m", "sasrec", "standard", s, 10.0) for s in range(4)])
    runs = tmp_path / "runs"
    _finish(runs, "ml-1m/sasrec/standard/seed0", [20.0] * 6, best=3)  # CPU: timed
    (runs / "ml-1m/sasrec/standard/seed0/train.log").write_text(log.format(dev="cpu"))
    _finish(runs, "ml-1m/sasrec/standard/seed1", [2.0] * 10, best=5)  # GPU only
    (runs / "ml-1m/sasrec/standard/seed1/train.log").write_text(log.format(dev="cuda"))
    _finish(runs, "ml-1m/sasrec/standard/seed2", [2.0] * 3 + [20.0] * 5, best=4)  # GPU, resumed on the CPU
    (runs / "ml-1m/sasrec/standard/seed2/train.log").write_text(
        log.format(dev="cuda") + log.format(dev="cpu")
        + "[x][bftrec.trainer][INFO] - resumed from /r/last.pt at epoch 3\n")
    assert rp.epoch_devices(runs / "ml-1m/sasrec/standard/seed2/train.log", 8) == ["cuda"] * 3 + ["cpu"] * 5
    out = tmp_path / "replan.json"
    rp.main(["--runs", str(runs), "--estimate", str(est), "--out", str(out)])
    r = json.loads(out.read_text())
    cells = {c["seed"]: c for c in r["finished_cells"]}
    assert cells[0]["s_per_epoch"] == 20.0 and cells[1]["s_per_epoch"] is None and cells[2]["run_s"] is None
    assert cells[2]["devices"] == "cuda 3 epochs, cpu 5 epochs"
    assert r["finished"]["cells"] == 3 and r["finished"]["cells_timed"] == 1
    assert r["finished"]["run_core_h"] == round(120.0 / 3600, 2)
    (left,) = r["missing_cells"]
    assert left["s_per_epoch"] == 20.0 and left["s_per_epoch_rule"] == "measured (1 cells)"
    assert left["epochs"] == 8.0  # mean epochs of all three: (6 + 10 + 8) / 3
