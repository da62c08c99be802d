"""bftrec-report sweep: the pre-registered endpoints laid out against a swept setting, from comparisons.csv."""
import pandas as pd
import pytest

from bftrec.report.cli import main as report
from bftrec.report.sweep import sweep_rows, trend


def _comparisons(tmp_path, tags=("dataset.inject_rate=0.0", "dataset.inject_rate=0.3", "dataset.inject_rate=0.1")):
    rows = []
    for i, tag in enumerate(tags):
        try:  # seed s gains 0.01 s + 0.1 (s + 1) r at value r: slopes 0.1, 0.2, 0.3 (mean 0.2); seed 3 at one value
            r = float(tag.split("=")[1])
            gains = " ".join(f"{s}:{0.01 * s + 0.1 * (s + 1) * r:+.4f}" for s in range(3))
            gains += " 3:+0.5000" if i == 0 else ""
        except ValueError:
            gains = ""
        for stratum in ("overall", "Q0", "cold", "Q1"):
            for metric in ("HR@10", "NDCG@10"):
                rows.append({"dataset": "ml-100k", "model": "sasrec", "tag": tag, "layer": "bft", "stratum": stratum,
                             "metric": metric, "endpoint": "x", "flags": "", "seeds": 5, "gain_seeds": 0.01 * i,
                             "ci_lo_seeds": 0.01 * i - 0.05, "ci_hi_seeds": 0.01 * i + 0.05, "p_seeds": 0.5,
                             "p_holm_seeds": 1.0, "mde_seeds": 0.08, "test_note": "", "seed_gains": gains})
    path = tmp_path / "comparisons.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_one_row_per_layer_endpoint_and_value_sorted_by_value(tmp_path):
    rows = sweep_rows(pd.read_csv(_comparisons(tmp_path)), "dataset.inject_rate")
    assert len(rows) == 9 and set(rows["stratum"]) == {"overall", "Q0", "cold"}  # Q1 and NDCG@10 left out
    overall = rows[rows["stratum"] == "overall"]
    assert list(overall["value"]) == [0.0, 0.1, 0.3] and list(overall["gain_seeds"]) == pytest.approx([0, 0.02, 0.01])


def test_the_trend_is_a_test_over_per_seed_slopes(tmp_path):
    """Hand-computed: slopes 0.1, 0.2, 0.3 over the three seeds present at every value (seed 3 is at one value
    only and is left out): mean 0.2, 95% t interval 0.2 ± t(0.975, 2) · 0.1/√3 = ± 0.2484, p 0.0742."""
    rows = sweep_rows(pd.read_csv(_comparisons(tmp_path)), "dataset.inject_rate")
    t = trend(rows).set_index("stratum").loc["overall"]
    assert t["seeds"] == 3 and t["values"] == 3 and t["seed_slopes"] == "0:+0.1000 1:+0.2000 2:+0.3000"
    assert t["slope_per_unit"] == pytest.approx(0.2, abs=1e-3)
    assert (t["ci_hi"] - t["ci_lo"]) / 2 == pytest.approx(0.2484, abs=1e-3)
    assert t["p_seeds"] == pytest.approx(0.0742, abs=1e-3)
    rows["test_note"] = rows["test_note"].astype(object)
    rows.loc[rows["stratum"] == "cold", "test_note"] = ["", "n/a (too few hits)", ""]  # one value untested
    assert trend(rows).set_index("stratum").loc["cold", "seeds"] == 0


def test_writes_table_and_figure_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    comp = _comparisons(tmp_path)
    assert report(["sweep", "--comparisons", str(comp), "--key", "dataset.inject_rate", "--out",
                   str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "sweep.md").read_text()
    assert "| bft | overall | 0.1 | 5 | +2.0% | [-3.0%, +7.0%] | 0.5 | 1 | +8.0% |" in md
    assert (tmp_path / "out" / "sweep.png").stat().st_size > 0
    assert len(pd.read_csv(tmp_path / "out" / "sweep.csv")) == 9
    assert len(pd.read_csv(tmp_path / "out" / "trend.csv")) == 3
    assert "| bft | overall | 3 | 3 | +20.0% |" in md  # the trend table, per +1 of the value by default
    assert report(["sweep", "--comparisons", str(comp), "--key", "seed", "--out", str(tmp_path / "o2")]) == 2
    assert "no HR@10 row tagged seed=<value>; tags set: dataset.inject_rate" in capsys.readouterr().err
    bad = _comparisons(tmp_path, tags=("windows=last", "windows=prefixes"))
    assert report(["sweep", "--comparisons", str(bad), "--key", "windows", "--out", str(tmp_path / "o3")]) == 2
    assert "are not all numbers" in capsys.readouterr().err
    assert report(["sweep", "--comparisons", str(tmp_path / "nope.csv"), "--key", "k", "--out", "o"]) == 2
    assert "nope.csv: no such file" in capsys.readouterr().err
    assert report(["sweep", "--comparisons", str(comp), "--key", "dataset.inject_rate", "--per", "0",
                   "--out", str(tmp_path / "o4")]) == 2
    assert "--per 0.0: must be > 0" in capsys.readouterr().err
    other = tmp_path / "overall.csv"
    other.write_text("dataset,model\nml-100k,sasrec\n")
    assert report(["sweep", "--comparisons", str(other), "--key", "k", "--out", str(tmp_path / "o5")]) == 2
    assert "overall.csv lacks tag, metric, stratum, layer" in capsys.readouterr().err
