"""scripts/bench_grid_cost.py: projection and breadth-first slicing of a grid's cost (no runs)."""
import pandas as pd
import pytest

from tests.scripts import load_script


def _cost():
    return load_script("bench_grid_cost")


def _timed(rows):
    return pd.DataFrame([{"dataset": d, "model": m, "layer": lay, "s_per_epoch": s, "s_epochs": [s, s],
                          "overhead_s": 10.0} for d, m, lay, s in rows])


def test_projection_uses_proxy_plus_patience_capped():
    cost = _cost()
    timed = _timed([("sports", "sasrec", "standard", 40.0), ("sports", "bert4rec", "bft_h", 60.0)])
    best = {("sasrec", "standard"): 20.0, ("bert4rec", "bft"): 500.0}  # bft_h: the backbone's other layers
    cells = cost.project(timed, [0, 1], best)
    b = cost.tuned_budget("sports", "sasrec")
    sas = cells[(cells["model"] == "sasrec")]
    assert len(cells) == 4 and (sas["epochs_expected"] == min(b["epochs_cap"], 20 + b["patience"])).all()
    assert (sas["expected_s"] == sas["epochs_expected"] * 40.0 + 10.0).all()
    bert = cells[cells["model"] == "bert4rec"]
    cap = cost.tuned_budget("sports", "bert4rec")["epochs_cap"]
    assert (bert["epochs_expected"] == cap).all() and (bert["cap_s"] == cap * 60.0 + 10.0).all()


def test_projection_respects_min_epochs(monkeypatch):
    """A pair with trainer.min_epochs cannot stop before it: the proxy is raised to it, still capped."""
    cost = _cost()
    budget = {"epochs_cap": 101, "patience": 10, "min_epochs": 90, "max_len": 200, "loss": "ce"}
    monkeypatch.setattr(cost, "tuned_budget", lambda d, m, *grid_extra: dict(budget))
    timed = _timed([("ml-1m", "hstu", "standard", 30.0)])
    cells = cost.project(timed, [0], {("hstu", "standard"): 40.0})
    assert cells["epochs_expected"].tolist() == [90]  # not 40 + 10
    budget["min_epochs"] = 500  # above the cap: the cap wins
    assert cost.project(timed, [0], {("hstu", "standard"): 40.0})["epochs_expected"].tolist() == [101]
    budget["min_epochs"] = 0  # off: proxy + patience
    assert cost.project(timed, [0], {("hstu", "standard"): 40.0})["epochs_expected"].tolist() == [50]


def test_timed_runs_switch_min_epochs_off(monkeypatch):
    """The 2-epoch timing must run whatever a tuned config's trainer.min_epochs says (else the config check
    refuses min_epochs > trainer.epochs before anything is timed)."""
    cost = _cost()
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cost.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="stop here"):
        cost.timed_runs("main", ["dataset=sports"], 2, 1, 1)
    assert "trainer.min_epochs=0" in seen[0] and "trainer.epochs=2" in seen[0]


def test_tuned_budget_reads_min_epochs_default_off():
    b = _cost().tuned_budget("sports", "sasrec")
    assert b["min_epochs"] == 0 and b["epochs_cap"] >= b["patience"] > 0


def test_budget_is_the_composed_grid_config(tmp_path, monkeypatch):
    """The budget is what the grid command composes for the cell: a trainer setting in the grid file
    itself wins over the tuned file's (the old reader took configs/tuned/ alone)."""
    import shutil

    cost = _cost()
    tuned = cost.tuned_budget("sports", "sasrec", "bft_h")
    assert tuned == cost.tuned_budget("sports", "sasrec")  # layer files set no budget key today
    repo = tmp_path / "repo"
    shutil.copytree(cost.REPO / "configs", repo / "configs")
    grid = repo / "configs" / "experiment" / "paper" / "main.yaml"
    grid.write_text(grid.read_text().replace("trainer:\n", "trainer:\n  patience: 57\n  epochs: 333\n", 1))
    monkeypatch.setattr(cost, "REPO", repo)
    b = cost.tuned_budget("sports", "sasrec", "standard", "main")
    assert (b["patience"], b["epochs_cap"]) == (57, 333) and tuned["patience"] != 57
    with pytest.raises(SystemExit, match="cannot compose .*layer=nonsense"):
        cost.tuned_budget("sports", "sasrec", "nonsense")


def test_add_takes_grid_axes_only():
    """An --add override of another key would share the grid's run folders and be lost from the slice
    commands: refused in one line before anything is timed."""
    cost = _cost()
    assert cost.check_add("dataset=sports layer=bft_h") == ["dataset=sports", "layer=bft_h"]
    with pytest.raises(SystemExit, match=r"sets trainer.patience=50; --add takes grid axes only"):
        cost.check_add("dataset=sports trainer.patience=50")
    with pytest.raises(SystemExit, match=r"sets \+model.foo=1"):
        cost.check_add("+model.foo=1")


def test_slices_breadth_first_within_limit_and_long_cells_alone():
    cost = _cost()
    rows = []
    for d in ("sports", "yelp"):
        for m in ("sasrec", "hstu"):
            for lay in ("standard", "bft"):
                for s in (0, 1, 2):
                    rows.append({"dataset": d, "model": m, "layer": lay, "seed": s,
                                 "expected_s": 3000.0 if m == "sasrec" else 20000.0})
    cells = pd.DataFrame(rows)
    sl = cost.slices(cells, ["sports"], n_jobs=2, limit_s=9000)
    seeds = [next(o for o in s["overrides"] if o.startswith("seed=")) for s in sl]
    datasets = [s["overrides"][0] for s in sl]
    # seed 0 of every dataset comes first, then sports' seeds 1-2, then yelp's
    # (per dataset and seed: sasrec's two layers in one slice, each hstu cell alone: 3 slices)
    assert seeds[:6] == ["seed=0"] * 6 and datasets[:6] == ["dataset=sports"] * 3 + ["dataset=yelp"] * 3
    assert datasets[6:12] == ["dataset=sports"] * 6 and seeds[6:12] == ["seed=1"] * 3 + ["seed=2"] * 3
    assert sum(s["cells"] for s in sl) == len(cells)
    for s in sl:  # a slice within the limit, or a single long cell marked as such
        assert s["expected_wall_h"] * 3600 <= 9000 or (s["cells"] == 1 and s["over_limit"])
    hstu = [s for s in sl if "model=hstu" in s["overrides"]]
    assert len(hstu) == 12 and all(s["cells"] == 1 and s["over_limit"] for s in hstu)


def test_makespan_is_the_schedule_not_a_lower_bound():
    cost = _cost()
    assert cost.makespan([1.6, 1.6, 1.6], 2) == 3.2  # sum / n_jobs would say 2.4
    assert cost.makespan([3.0, 1.0, 1.0, 1.0], 2) == 3.0


def test_three_layer_cells_over_the_limit_are_split_and_every_cell_is_sliced():
    cost = _cost()
    rows = [{"dataset": "sports", "model": m, "layer": lay, "seed": s, "expected_s": 1.6 * 3600}
            for m in ("sasrec", "hstu") for lay in ("standard", "bft", "bft_h") for s in range(5)]
    rows += [{"dataset": "yelp", "model": "sasrec", "layer": lay, "seed": s, "expected_s": 600.0}
             for lay in ("standard", "bft") for s in range(5)]
    cells = pd.DataFrame(rows)
    sl = cost.slices(cells, ["sports"], n_jobs=2, limit_s=2.5 * 3600)
    assert sum(s["cells"] for s in sl) == len(cells)  # seeds 3 and 4 too
    assert all(s["expected_wall_h"] <= 2.5 or s["cells"] == 1 for s in sl)
    # three 1.6 h cells take 3.2 h on two workers: never one slice
    assert not any(s["cells"] == 3 and "dataset=sports" in s["overrides"] for s in sl)
    # yelp's two layers are not packed with a backbone of another layer set; every slice's product is its cells
    for s in sl:
        n = 1
        for o in s["overrides"]:
            if o.split("=")[0] in ("model", "layer"):
                n *= len(o.split("=")[1].split(","))
        assert n == s["cells"], s


def test_a_backbone_without_reference_epochs_is_named():
    cost = _cost()
    timed = _timed([("sports", "hstu", "standard", 10.0)])
    with pytest.raises(SystemExit, match="no finished hstu cell"):
        cost.project(timed, [0], {("sasrec", "standard"): 10.0})
    nan = _timed([("sports", "sasrec", "standard", float("nan"))])
    with pytest.raises(SystemExit, match="timed no epoch"):
        cost.project(nan, [0], {("sasrec", "standard"): 10.0})
