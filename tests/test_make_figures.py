"""scripts/make_figures.py draws from metrics.json and history.csv only, deterministically, and skips
figures it has nothing for. Fake run directories, no training."""
import json
import re
from pathlib import Path

import pytest

from tests.scripts import load_script

FIGS = ("gain_by_bin.png", "gain_by_bin_ndcg.png", "k_by_bin.png", "training_curves.png")


def _make_figures():
    return load_script("make_figures")


def _fake_run(d: Path, layer: str, seed: int, epochs: int = 4) -> None:
    """A run directory with the keys the figures read; bft runs score a little higher and have K."""
    up = 0.01 * (layer == "bft") + 0.001 * seed
    strat = {"HR@10": 0.1 + up, "NDCG@10": 0.05 + up}
    bins = [{"bin": f"Q{i}", "lo": 3 * i, "hi": 3 * i + 2, "n_users": 10, "HR@10": 0.05 * (i + 1) + up,
             "NDCG@10": 0.02 * (i + 1) + up} for i in range(3)]
    m = {"dataset": "toy", "model": "sasrec", "layer": layer, "seed": seed, "tag": "",
         "protocol": {"split": "leave-one-out", "candidates": "all items"},
         "test": {"by_item_freq": bins, "cold_users": {"max_history": 4, "n_users": 12, **strat},
                  "warm_users": {"n_users": 18, **strat}}}
    if layer == "bft":
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
