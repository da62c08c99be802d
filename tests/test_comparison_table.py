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
                                     (0.00999, "0.010")])
def test_p_values_print_as_the_readmes_do(p, want):
    assert cmp.p_text(p) == want


def _tables(root):
    """A tables folder: sports/sasrec with a tested Q0 loss, sports/hstu whose Q0 has too few hits."""
    rows = []
    for model, q0 in (("sasrec", dict(gain=-0.056, p_holm_fixed_seeds=0.024, p_seeds=0.2, test_note=None,
                                      baseline_hits=148.7)),
                      ("hstu", dict(gain=-0.083, p_holm_fixed_seeds=None, p_seeds=None, test_note="n/a (too few hits)",
                                    baseline_hits=16.0))):
        base = dict(dataset="sports", model=model, tag=None, layer="bft", metric="HR@10",
                    seed_gains="0:+0.01 1:-0.02 2:+0.03")
        rows.append({**base, "stratum": "overall", "gain": 0.002, "p_holm_fixed_seeds": 1.0, "p_seeds": 0.78,
                     "test_note": None, "baseline_hits": 1984.7})
        rows.append({**base, "stratum": "Q0", **q0})
        rows.append({**base, "stratum": "cold", "gain": float("nan"), "p_holm_fixed_seeds": None, "p_seeds": None,
                     "test_note": "n/a (too few hits)", "baseline_hits": 0.0})
    root.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(root / "comparisons.csv", index=False)
    pd.DataFrame([{"dataset": "sports", "model": m, "tag": "", "HR@10 standard": f"{v:.4f} ± 0.0010",
                   "HR@10 bft": f"{v + 0.001:.4f} ± 0.0020"} for m, v in (("sasrec", 0.0558), ("hstu", 0.0435))]
                 ).to_csv(root / "overall.csv", index=False)
    pd.DataFrame([{"dataset": "sports", "model": m, "tag": "", "K Q0 / Q4 bft": "0.6812 / 0.6543 (by token)"}
                  for m in ("sasrec", "hstu")]).to_csv(root / "summary.csv", index=False)
    return root


def test_rows_in_the_order_asked_with_bold_na_and_seed_tests(tmp_path):
    t = _tables(tmp_path / "t")
    lines = cmp.table(t, "bft", ["sports"], ["sasrec", "hstu"], k=True).splitlines()
    assert lines[0].startswith("| dataset | backbone | seeds | HR@10 standard | HR@10 bft | gain (p_Holm) | Q0 (rarest")
    assert lines[2] == ("| Sports | SASRec | 0, 1, 2 | 0.0558 | 0.0568 | +0.2% (1) | **−5.6% (0.024)** | "
                        "– (n/a: 0 hits) | 0.68 / 0.65 (by token) | 0.78, 0.20, n/a |")
    assert lines[3].startswith("| Sports | HSTU |") and "| −8.3% (n/a: 16 hits) |" in lines[3]
    assert len(lines) == 4


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


def test_check_tables_reruns_a_quoted_verdict_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t = _tables(tmp_path / "results" / "g" / "tables")
    cmd = "python scripts/comparison_table.py --tables results/g/tables --layer bft --model sasrec --model hstu"
    made = cmp.table(t.relative_to(tmp_path), "bft", None, ["sasrec", "hstu"])
    readme = tmp_path / "results" / "g" / "README.md"
    readme.write_text(f"On Sports (`{cmd}`):\n\n{made}\n")
    assert ct.main(["--json", "out.json"]) == 0
    readme.write_text(f"On Sports (`{cmd}`):\n\n{made.replace('(0.024)', '(0.036)')}\n")  # a stale hand edit
    assert ct.main(["--json", "out.json"]) == 1
    (res,) = json.loads((tmp_path / "out.json").read_text())["commands"]
    assert res["result"] == "differs" and res["files"] == ["Sports SASRec"]
