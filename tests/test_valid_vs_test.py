"""bftrec-report valid-test (bftrec.report.valid_test): the selected epoch's validation value, the best
per-epoch one, and test, per run."""
import json

import pandas as pd
import pytest

from bftrec.report import valid_test


def _run(root, seed, valid_hr, best_epoch, test_hr):
    """A run folder with a history.csv of len(valid_hr) epochs and a metrics.json selecting best_epoch."""
    d = root / "ml-1m" / "hstu" / "standard" / f"seed{seed}"
    d.mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, len(valid_hr) + 1), "loss": 1.0, "valid_HR@10": valid_hr,
                  "valid_NDCG@10": [v / 2 for v in valid_hr]}).to_csv(d / "history.csv", index=False)
    (d / "metrics.json").write_text(json.dumps({
        "dataset": "ml-1m", "model": "hstu", "layer": "standard", "tag": None, "seed": seed,
        "best_epoch": best_epoch, "test": {"overall": {"HR@10": test_hr, "NDCG@10": test_hr / 2}}}))
    return d


def test_rows_give_the_selected_and_the_best_epoch_and_a_mean(tmp_path):
    vt = valid_test
    _run(tmp_path, 0, [0.1, 0.3, 0.2, 0.35], best_epoch=2, test_hr=0.25)  # selected on NDCG: epoch 2
    _run(tmp_path, 1, [0.2, 0.4, 0.1], best_epoch=2, test_hr=0.29)
    df = vt.table([tmp_path], "HR@10")
    assert list(df["seed"]) == [0, 1, "mean"]
    r0 = df.iloc[0]
    assert (r0["epochs_run"], r0["selected_epoch"], r0["best_valid_epoch"]) == (4, 2, 4)
    assert r0["valid_at_selected"] == pytest.approx(0.3) and r0["best_valid"] == pytest.approx(0.35)
    assert r0["last_valid"] == pytest.approx(0.35) and df.iloc[1]["last_valid"] == pytest.approx(0.1)  # last epoch's
    mean = df.iloc[2]
    assert mean["best_valid"] == pytest.approx((0.35 + 0.4) / 2) and mean["test"] == pytest.approx(0.27)
    assert mean["last_valid"] == pytest.approx((0.35 + 0.1) / 2)
    assert len(vt.table([tmp_path, tmp_path / "ml-1m"], "HR@10")) == 3  # the same runs twice count once
    out = tmp_path / "t.md"
    assert vt.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "Made by `bftrec-report valid-test" in text and "| mean " in text and "0.3750" in text
    assert "valid HR@10 at last validated epoch" in text and "0.2250" in text
    # eval_every 2: epoch 5 trained, not validated; epochs run counts it, the last validated value is epoch 4's
    _run(tmp_path / "e2", 2, [float("nan"), 0.2, float("nan"), 0.3, float("nan")], best_epoch=4, test_hr=0.3)
    r = vt.table([tmp_path / "e2"], "HR@10").iloc[0]
    assert (r["epochs_run"], r["best_valid_epoch"], r["last_valid"]) == (5, 4, pytest.approx(0.3))


def test_bad_metric_and_no_runs_fail_in_one_line(tmp_path):
    vt = valid_test
    with pytest.raises(SystemExit, match="no run folder"):
        vt.table([tmp_path], "HR@10")
    d = _run(tmp_path, 0, [0.1, 0.2], best_epoch=2, test_hr=0.2)
    with pytest.raises(SystemExit, match="has no valid_MRR; pick --metric from: HR@10, NDCG@10"):
        vt.table([tmp_path], "MRR")
    m = json.loads((d / "metrics.json").read_text())
    del m["test"]["overall"]["NDCG@10"]
    (d / "metrics.json").write_text(json.dumps(m))
    with pytest.raises(SystemExit, match="metrics.json has no test NDCG@10; pick --metric from: HR@10"):
        vt.table([tmp_path], "NDCG@10")
    with pytest.raises(SystemExit, match="no run folder .* below .*typo"):  # a wrong second root is not ignored
        vt.table([tmp_path, tmp_path / "typo"], "HR@10")
