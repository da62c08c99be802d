"""scripts/comparison_table.py: a README's verdict table printed from a tables folder, and checked by
scripts/check_tables.py against the table below its quoted command."""
import json

import pandas as pd
import pytest

from tests.scripts import load_script

cmp = load_script("comparison_table")
ct = load_script("check_tables")


@pytest.mark.parametrize("p, want", [(0.0497, "0.0497"), (0.0049, "0.0049"), (0.7, "0.70"), (0.054, "0.054"),
                                     (0.9949, "0.99"), (0.996, "1"), (2.26e-4, "2.3e-4"), (6.04e-7, "6.0e-7"),
                                     (0.00999, "0.010"), (0.04996, "0.04996"), (0.05, "0.050"), (0.0, "0"),
                                     (float("nan"), "–")])
def test_p_values_print_as_the_readmes_do(p, want):
    assert cmp.p_text(p) == want


def _comparison(ds, model, stratum, gain, p_holm, p_seeds=0.5, note=None, hits=500.0, seeds=3, base_seeds=3):
    return dict(dataset=ds, model=model, tag=None, layer="bft", metric="HR@10", stratum=stratum, gain=gain,
                p_holm_fixed_seeds=p_holm, p_seeds=p_seeds, test_note=note, baseline_hits=hits, seeds=seeds,
                baseline_seeds=base_seeds, seed_gains=" ".join(f"{s}:+0.01" for s in range(seeds)))


def _tables(root, extra=()):
    """Two datasets x two backbones, each value distinct, so that a row or column mix-up shows."""
    rows, overall, summary = [], [], []
    for i, (ds, model) in enumerate([("sports", "sasrec"), ("sports", "hstu"), ("beauty", "sasrec"),
                                     ("beauty", "hstu")]):
        rows += [_comparison(ds, model, "overall", 0.01 * (i + 1), 0.5 + 0.1 * i, p_seeds=0.3 + 0.1 * i),
                 _comparison(ds, model, "Q0", -0.05 * (i + 1), 0.01 * (i + 1), p_seeds=0.11 * (i + 1)),
                 _comparison(ds, model, "cold", 0.02, None, p_seeds=None, note="n/a (too few hits)", hits=4.0 + i)]
        overall.append({"dataset": ds, "model": model, "tag": "", "seeds": 3,
                        "HR@10 standard": f"0.0{i + 1}00 ± 0.0010", "HR@10 bft": f"0.0{i + 1}50 ± 0.0020"})
        summary.append({"dataset": ds, "model": model, "tag": "", "K Q0 / Q4 bft": f"0.6{i}12 / 0.7{i}43 (by token)"})
    root.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows + list(extra)).to_csv(root / "comparisons.csv", index=False)
    pd.DataFrame(overall).to_csv(root / "overall.csv", index=False)
    pd.DataFrame(summary).to_csv(root / "summary.csv", index=False)
    return root


def test_rows_in_the_order_asked_each_from_its_own_row(tmp_path):
    t = _tables(tmp_path / "t")
    lines = cmp.table(t, "bft", ["sports", "beauty"], ["hstu", "sasrec"], k=True).splitlines()
    assert lines[0].startswith("| dataset | backbone | seeds | HR@10 standard | HR@10 bft | gain (p_Holm) | Q0 (rarest")
    assert lines[2:] == [
        "| Sports | HSTU | 0, 1, 2 | 0.0200 | 0.0250 | +2.0% (0.60) | **−10.0% (0.020)** | +2.0% (n/a: 5 hits) | "
        "0.61 / 0.71 (by token) | 0.40, 0.22, n/a |",
        "| Sports | SASRec | 0, 1, 2 | 0.0100 | 0.0150 | +1.0% (0.50) | **−5.0% (0.010)** | +2.0% (n/a: 4 hits) | "
        "0.60 / 0.70 (by token) | 0.30, 0.11, n/a |",
        "| Beauty | HSTU | 0, 1, 2 | 0.0400 | 0.0450 | +4.0% (0.80) | **−20.0% (0.040)** | +2.0% (n/a: 7 hits) | "
        "0.63 / 0.73 (by token) | 0.60, 0.44, n/a |",
        "| Beauty | SASRec | 0, 1, 2 | 0.0300 | 0.0350 | +3.0% (0.70) | **−15.0% (0.030)** | +2.0% (n/a: 6 hits) | "
        "0.62 / 0.72 (by token) | 0.50, 0.33, n/a |"]


def test_other_notes_and_unequal_seeds_are_said(tmp_path):
    # as bftrec-report tables writes a partial grid: bft at seed 0 only, compared on that seed (matched_seeds)
    extra = [_comparison("toys", "sasrec", s, 0.01, None, p_seeds=None, note="n/a (too few seeds)", seeds=1,
                         base_seeds=1) for s in ("overall", "Q0")]
    extra.append(_comparison("toys", "sasrec", "cold", 0.01, None, p_seeds=None, note="n/a (too few hits)",
                             hits=19.67, seeds=1, base_seeds=1))
    t = _tables(tmp_path / "t", extra)
    o = pd.read_csv(t / "overall.csv", dtype=str)
    o.loc[len(o)] = {"dataset": "toys", "model": "sasrec", "tag": "", "seeds": "standard 3, bft 1",
                     "HR@10 standard": "0.1000 ± 0.0100", "HR@10 bft": "0.2000 (1 seed)"}
    o.to_csv(t / "overall.csv", index=False)
    (line,) = cmp.table(t, "bft", ["toys"], ["sasrec"]).splitlines()[2:]
    assert line == ("| Toys | SASRec | 0 | 0.1000 (3 seeds) | 0.2000 | +1.0% (n/a: too few seeds) | "
                    "+1.0% (n/a: too few seeds) | +1.0% (n/a: 19.7 hits) | n/a, n/a, n/a |")


def test_bad_input_is_one_line(tmp_path, capsys):
    t = _tables(tmp_path / "t")
    for argv, msg in ((["--layer", "bft_h"], "no untagged comparison of layer 'bft_h'"),
                      (["--layer", "bft", "--endpoint", "Q0"], "is not stratum:metric"),
                      (["--layer", "bft", "--endpoint", "Q3:HR@10"], "no Q3 HR@10 comparison"),
                      (["--layer", "bft", "--dataset", "toys"], "for dataset 'toys'")):
        assert cmp.main(["--tables", str(t), *argv]) == 2
        assert msg in capsys.readouterr().err
    assert cmp.main(["--tables", str(tmp_path / "none"), "--layer", "bft"]) == 2
    assert "give a bftrec-report tables folder" in capsys.readouterr().err

    c = pd.read_csv(t / "comparisons.csv")  # an endpoint one backbone lacks
    c[~((c["model"] == "hstu") & (c["stratum"] == "cold"))].to_csv(t / "comparisons.csv", index=False)
    assert cmp.main(["--tables", str(t), "--layer", "bft"]) == 2
    assert "0 rows for beauty/hstu bft cold HR@10" in capsys.readouterr().err
    c[~((c["model"] == "hstu") & (c["dataset"] == "beauty"))].to_csv(t / "comparisons.csv", index=False)
    assert cmp.main(["--tables", str(t), "--layer", "bft", "--dataset", "beauty", "--model", "hstu",
                     "--model", "sasrec"]) == 2  # asked for by name: not silently left out
    assert "no bft comparison of beauty/hstu" in capsys.readouterr().err
    assert len(cmp.table(t, "bft").splitlines()) == 5  # unnamed: the pairs there are
    o = pd.read_csv(t / "overall.csv")
    pd.concat([o, o.iloc[:1]]).to_csv(t / "overall.csv", index=False)  # a duplicated row
    assert cmp.main(["--tables", str(t), "--layer", "bft"]) == 2
    assert "2 untagged rows for sports/sasrec" in capsys.readouterr().err
    o.drop(columns=["HR@10 bft"]).to_csv(t / "overall.csv", index=False)
    assert cmp.main(["--tables", str(t), "--layer", "bft"]) == 2
    assert "no column 'HR@10 bft'" in capsys.readouterr().err


def test_check_tables_reruns_a_quoted_verdict_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _tables(tmp_path / "results" / "g" / "tables")
    cmd = "python scripts/comparison_table.py --tables results/g/tables --layer bft --dataset beauty --model sasrec"
    table = ("| dataset | backbone | seeds | HR@10 standard | HR@10 bft | gain (p_Holm) "
             "| Q0 (rarest items) gain (p_Holm) | cold users gain (p_Holm) | p_seeds (same order) |\n"
             "|---|---|---|---:|---:|---|---|---|---|\n"
             "| Beauty | SASRec | 0, 1, 2 | 0.0300 | 0.0350 | +3.0% (0.70) | **−15.0% (0.030)** | +2.0% (n/a: 6 hits) "
             "| 0.50, 0.33, n/a |")
    readme = tmp_path / "results" / "g" / "README.md"
    readme.write_text(f"On Beauty (`{cmd}`):\n\n{table}\n")
    assert ct.main(["--json", "out.json"]) == 0
    readme.write_text(f"On Beauty (`{cmd}`):\n\n{table.replace('(0.030)', '(0.036)')}\n")  # a stale hand edit
    assert ct.main(["--json", "out.json"]) == 1
    (res,) = json.loads((tmp_path / "out.json").read_text())["commands"]
    assert res["result"] == "differs" and res["files"] == ["Beauty SASRec"]
    readme.write_text(f"On Beauty, unquoted: python scripts/comparison_table.py --tables results/g/tables\n\n{table}\n")
    assert ct.main(["--json", "out.json"]) == 1  # a command the check cannot read fails, not passes


def test_by_endpoint_is_the_seed_unit_view_of_one_pair(tmp_path, capsys):
    t = _tables(tmp_path / "t")
    c = pd.read_csv(t / "comparisons.csv")
    c["gain_seeds"], c["ci_lo_seeds"], c["ci_hi_seeds"], c["mde_seeds"] = c["gain"] * 1.1, -0.034, 0.043, 0.0432
    c["p_holm_seeds"] = c["p_seeds"] * 2
    c["seed_gains"] = "3:+0.0405 4:-0.0126 5:+0.1098"  # stored to 4 decimals: printed as stored, never re-rounded
    c.to_csv(t / "comparisons.csv", index=False)
    lines = cmp.endpoint_table(t, "bft", "beauty", "hstu", ["Q0:HR@10", "cold:HR@10"])
    assert lines.splitlines()[2:] == [
        "| Q0 (rarest items) HR@10 | −22.0% | +4.05%, −1.26%, +10.98% | [−3.4%, +4.3%] | 0.44 | 0.88 | 4.3% |",
        "| cold users HR@10 | +2.2%, n/a (too few hits) | | | | | |"]
    assert cmp.main(["--tables", str(t), "--layer", "bft", "--by-endpoint", "--dataset", "beauty"]) == 2
    assert "--by-endpoint takes one --dataset and one --model" in capsys.readouterr().err
