"""The ``bftrec-data`` command line."""
from __future__ import annotations

from bftrec.data.cli import main


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "sports" in out and "ml-1m" in out and "synthetic" in out


def test_stats_and_prepare_synthetic(capsys):
    assert main(["stats", "synthetic"]) == 0
    out = capsys.readouterr().out
    for word in ("users", "items", "interactions", "mean length", "tie rate", "report"):
        assert word in out
    assert main(["prepare", "synthetic"]) == 0
    assert "not cached" in capsys.readouterr().out


def test_errors_are_one_line_with_status_2(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("BFTREC_DATA_ROOT", raising=False)
    for argv, text in [(["stats", "nope"], "unknown dataset 'nope'"),
                       (["prepare", "toys"], "BFTREC_DATA_ROOT"),
                       (["stats", "toys", "--data-root", str(tmp_path)], "not found"),
                       (["download", "synthetic"], "nothing to download"),
                       (["download", "sports", "--data-root", str(tmp_path)], "no direct download url")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("bftrec-data: error:") and text in err, err
        assert err.count("\n") == 1 and "Traceback" not in err
