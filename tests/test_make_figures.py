"""bftrec-report figures (bftrec.report.figures) draws from metrics.json and history.csv only, deterministically,
and skips figures it has nothing for. Fake run directories, no training."""
import json
import re
from pathlib import Path

import pytest

from bftrec.report import figures, tables
from bftrec.report import runs as rr

FIGS = ("gain_by_bin.png", "gain_by_bin_ndcg.png", "k_by_bin.png", "training_curves.png")


def _make_figures():
    return figures


def _fake_run(d: Path, layer: str, seed: int, epochs: int = 4, q0_hit: bool = True) -> None:
    """A run directory with the keys the figures read; bft runs score a little higher and have K.
    ``q0_hit=False``: the standard layer has no hit in Q0 (the gain there is undefined)."""
    up = 0.01 * (layer != "standard") + 0.001 * seed
    strat = {"HR@10": 0.1 + up, "NDCG@10": 0.05 + up}
    bins = [{"bin": f"Q{i}", "lo": 3 * i, "hi": 3 * i + 2, "n_users": 10, "HR@10": 0.05 * (i + 1) + up,
             "NDCG@10": 0.02 * (i + 1) + up} for i in range(3)]
    if not q0_hit and layer == "standard":
        bins[0].update({"HR@10": 0.0, "NDCG@10": 0.0})
    m = {"dataset": "toy", "model": "sasrec", "layer": layer, "seed": seed, "tag": "",
         "protocol": {"split": "leave-one-out", "candidates": "all items"},
         "test": {"by_item_freq": bins, "cold_users": {"max_history": 4, "n_users": 12, **strat},
                  "warm_users": {"n_users": 18, **strat}}}
    if layer != "standard":
        m["mechanism"] = {"by_item_freq": [{"bin": b["bin"], "lo": b["lo"], "hi": b["hi"], "K": 0.7 + 0.01 * i,
                                            "lam0": 40.0} for i, b in enumerate(bins)],
                          "cold_users": {"K": 0.68, "lam0": 39.0}, "warm_users": {"K": 0.75, "lam0": 40.0}}
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(m))
    rows = [f"{e},{5 - 0.1 * e},{0.01 * e + up}" for e in range(1, epochs + seed + 1)]
    (d / "history.csv").write_text("epoch,loss,valid_NDCG@10\n" + "\n".join(rows) + "\n")


@pytest.fixture
def runs(tmp_path):
    for layer in ("standard", "bft"):
        for seed in (0, 1):
            _fake_run(tmp_path / "runs" / layer / f"seed{seed}", layer, seed)
    (tmp_path / "runs" / "bft" / "seed2").mkdir()  # unfinished run: no metrics.json, ignored
    return tmp_path / "runs"


def test_figures_written_and_reproducible(runs, tmp_path):
    mf = _make_figures()
    mf.main(["--runs", str(runs), "--out", str(tmp_path / "a")])
    mf.main(["--runs", str(runs), "--out", str(tmp_path / "b")])
    for name in FIGS:
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert len(a) > 1000 and a == b, name


def test_only_standard_runs_skip_gain_and_k(runs, tmp_path, caplog):
    for seed in (0, 1):
        (runs / "bft" / f"seed{seed}" / "metrics.json").unlink()
    with caplog.at_level("INFO"):
        _make_figures().main(["--runs", str(runs), "--out", str(tmp_path / "figs")])
    assert (tmp_path / "figs" / "training_curves.png").stat().st_size > 0
    for name in FIGS[:3]:
        assert not (tmp_path / "figs" / name).exists()
        assert f"skipped {name}" in caplog.text


def test_no_runs_exits_naming_the_folder(tmp_path):
    with pytest.raises(SystemExit, match=re.escape(str(tmp_path))):
        _make_figures().main(["--runs", str(tmp_path), "--out", str(tmp_path / "figs")])


def _groups(runs):
    mt = tables
    return mt, rr.cells(rr.load_runs(runs))


def test_undefined_gain_is_marked_not_drawn_as_zero(tmp_path):
    for layer in ("standard", "bft"):
        _fake_run(tmp_path / "runs" / layer / "seed0", layer, 0, q0_hit=False)
    _, groups = _groups(tmp_path / "runs")
    fig = _make_figures().gain_figure(groups, "HR@10", tmp_path / "g.png")
    ax = fig.axes[0]
    marks = list(ax.texts)
    assert [t.get_text() for t in marks] == ["n/a"] and marks[0].get_position() == (0, 0)  # Q0 only


def test_gain_bars_carry_seed_unit_intervals_on_a_readable_scale(runs, tmp_path):
    """issue 47: error bars (a t interval over seeds without rank tables), the significance legend, and a
    symmetric-log axis so that one tiny stratum's huge gain does not flatten the rest."""
    _, groups = _groups(runs)
    fig = _make_figures().gain_figure(groups, "HR@10", tmp_path / "g.png")
    ax = fig.axes[0]
    assert ax.get_yscale() == "symlog" and ax.containers  # bars and error bars
    assert any(c.__class__.__name__ == "ErrorbarContainer" for c in ax.containers)
    assert fig.get_supxlabel().startswith("bars: 95% CI with the training seed as the unit")


def test_every_layer_gets_its_bars(runs, tmp_path):
    for seed in (0, 1):
        _fake_run(runs / "bft_h" / f"seed{seed}", "bft_h", seed)
    _, groups = _groups(runs)
    mf = _make_figures()
    labels = mf.gain_figure(groups, "HR@10", tmp_path / "g.png").axes[0].get_legend_handles_labels()[1]
    assert labels == ["sasrec bft (2 vs 2 seeds)", "sasrec bft_h (2 vs 2 seeds)"]
    k_labels = mf.k_figure(groups, tmp_path / "k.png").axes[0].get_legend_handles_labels()[1]
    assert len(k_labels) == 2


def test_amp_override_is_no_trial_in_the_title(runs, tmp_path):
    hydra = runs / "standard" / "seed0" / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- layer=standard\n- trainer.amp=false\n")
    loaded = rr.load_runs(runs)
    assert rr.extra_overrides(loaded) == ["trainer.amp=false (1 runs)"]  # the header still lists it
    assert rr.run_note(loaded, []) == ""  # float32 as every CPU cell: not a trial
    (hydra / "overrides.yaml").write_text("- layer=standard\n- trainer.amp=false\n- trainer.epochs=2\n")
    assert rr.run_note(rr.load_runs(runs), []) == "TRIAL: trainer.epochs=2 (1 runs)"


def test_partial_and_trial_runs_say_so_in_the_title(runs, tmp_path):
    (runs / "bft" / "seed1" / "metrics.json").unlink()
    hydra = runs / "standard" / "seed0" / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- layer=standard\n- trainer.epochs=2\n")
    mt, groups = _groups(runs)
    loaded = rr.load_runs(runs)
    note = rr.run_note(loaded, rr.missing_cells(loaded))
    assert note == "PARTIAL: 1 of 4 cells missing; TRIAL: trainer.epochs=2 (1 runs)"
    mf = _make_figures()
    for fig in (mf.gain_figure(groups, "HR@10", tmp_path / "g.png", note),
                mf.k_figure(groups, tmp_path / "k.png", note), mf.curves_figure(groups, tmp_path / "c.png", note)):
        assert fig.get_suptitle() == note
    assert mf.gain_figure(groups, "HR@10", tmp_path / "g.png").get_suptitle() == ""
