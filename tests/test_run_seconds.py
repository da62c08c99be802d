"""bftrec-report seconds (bftrec.report.seconds): training and validation seconds per run, from history.csv,
whole or from an epoch on."""
import json

import pandas as pd
import pytest

from bftrec.report import seconds


def _run(root, seed, train_s, eval_s, best_epoch=1, layer="bft", name=None):
    """A run folder (``name``, default ``seed<seed>``) whose history.csv has len(train_s) epochs with these seconds."""
    d = root / "ml-1m" / "bert4rec" / layer / (name or f"seed{seed}")
    d.mkdir(parents=True)
    pd.DataFrame({"epoch": range(1, len(train_s) + 1), "loss": 1.0, "train_seconds": train_s,
                  "valid_NDCG@10": 0.1, "eval_seconds": eval_s}).to_csv(d / "history.csv", index=False)
    (d / "metrics.json").write_text(json.dumps({
        "dataset": "ml-1m", "model": "bert4rec", "layer": layer, "tag": None, "seed": seed,
        "best_epoch": best_epoch, "test": {"overall": {"HR@10": 0.2}}}))
    return d


def test_sums_medians_and_from_epoch(tmp_path):
    rs = seconds
    _run(tmp_path, 1, [10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0], best_epoch=3)
    _run(tmp_path, 0, [5.0, 5.0], [float("nan"), 1.0], layer="standard")  # epoch 1 not validated
    df = rs.table([tmp_path])
    assert list(df["layer"]) == ["bft", "standard"]  # sorted
    assert list(df["run"]) == ["seed1", "seed0"]  # the folder's name tells runs of one tag and seed apart
    r = df.iloc[0]
    assert (r["epochs_run"], r["best_epoch"], r["epochs_counted"]) == (4, 3, 4)
    assert r["train_s"] == pytest.approx(100.0) and r["eval_s"] == pytest.approx(10.0)
    assert r["total_s"] == pytest.approx(110.0) and r["median_s_per_epoch"] == pytest.approx((22 + 33) / 2)
    s = df.iloc[1]
    assert s["eval_s"] == pytest.approx(1.0) and s["median_s_per_epoch"] == pytest.approx(5.5)  # NaN counts 0 s
    part = rs.table([tmp_path / "ml-1m" / "bert4rec" / "bft"], from_epoch=3).iloc[0]
    assert (part["epochs_run"], part["epochs_counted"]) == (4, 2)  # the run's length, the counted part
    assert part["total_s"] == pytest.approx(77.0) and part["median_s_per_epoch"] == pytest.approx(38.5)
    assert len(rs.table([tmp_path, tmp_path / "ml-1m"])) == 2  # the same runs twice count once
    _run(tmp_path, 1, [10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0], best_epoch=3, name="seed1_variant")
    assert list(rs.table([tmp_path])["run"]) == ["seed1", "seed1_variant", "seed0"]  # one tag and seed, told apart
    out = tmp_path / "s.md"
    assert rs.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "Made by `bftrec-report seconds" in text and "| 110 " in text and "27.5" in text
    assert rs.main(["--runs", str(tmp_path), "--out", str(tmp_path / "r.md")]) == 0  # as tables takes them
    assert (tmp_path / "r.md").read_text().split("\n", 1)[1] == text.split("\n", 1)[1]


def test_no_folder_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        seconds.main([])
    assert e.value.code == 2 and "positionally or with --runs" in capsys.readouterr().err


def test_bad_input_fails_in_one_line(tmp_path):
    rs = seconds
    with pytest.raises(SystemExit, match="no run folder"):
        rs.table([tmp_path])
    d = _run(tmp_path, 0, [1.0, 2.0], [1.0, 1.0])
    with pytest.raises(SystemExit, match=r"--from-epoch 3 is past the last epoch \(2\).*pick an epoch from 1 to 2"):
        rs.table([tmp_path], from_epoch=3)
    with pytest.raises(SystemExit, match="2"):  # argparse: exit status 2 with its one line
        rs.main([str(tmp_path), "--from-epoch", "0"])
    with pytest.raises(SystemExit, match="no run folder .* below .*typo"):  # a wrong second root is not ignored
        rs.table([tmp_path, tmp_path / "typo"])
    pd.read_csv(d / "history.csv").drop(columns="eval_seconds").to_csv(d / "history.csv", index=False)
    with pytest.raises(SystemExit, match="has no column eval_seconds"):
        rs.table([tmp_path])
