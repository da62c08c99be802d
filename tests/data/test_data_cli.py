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


def test_list_shows_which_raw_files_are_present(capsys, tmp_path):
    """Issue 9.13: `list` says, per dataset, whether its raw file is under the data root."""
    from bftrec.data.datasets import dataset_config

    path = tmp_path / dataset_config("lastfm").path
    path.parent.mkdir(parents=True)
    path.write_text("1 1 2\n")
    assert main(["list", "--data-root", str(tmp_path)]) == 0
    rows = {ln.split()[0]: ln.split(maxsplit=4)[4] for ln in capsys.readouterr().out.splitlines()[3:]}
    assert rows["lastfm"] == "yes" and rows["office"].startswith("no") and rows["synthetic"] == "built in"


def test_stats_report_is_a_table_not_a_dict(capsys, caplog):
    """Issue 9.13: the preprocessing report (printed and logged) is a readable table."""
    import logging

    with caplog.at_level(logging.INFO, logger="bftrec.data.preprocess"):
        assert main(["stats", "synthetic"]) == 0
    out = capsys.readouterr().out
    assert "{" not in out and "duplicates dropped" in out
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "{" not in logged and "k-core" in logged


def test_config_dir_finds_a_users_own_dataset_config(tmp_path, capsys):
    """issue 47: bftrec-data takes --config-dir as the trainer does: DIR/dataset/<name>.yaml first."""
    from bftrec.data.cli import main
    from bftrec.data.datasets import CONFIG_DIR

    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    text = (CONFIG_DIR / "synthetic.yaml").read_text().replace("name: synthetic", "name: mysynth")
    (tmp_path / "conf" / "dataset" / "mysynth.yaml").write_text(text.replace("n_users: 2000", "n_users: 300"))
    assert main(["--config-dir", str(tmp_path / "conf"), "prepare", "mysynth"]) == 0
    assert "300 users" in capsys.readouterr().out
    assert main(["--config-dir", str(tmp_path / "conf"), "list"]) == 0
    assert "mysynth" in capsys.readouterr().out
    assert main(["prepare", "mysynth"]) == 2  # without the folder it is unknown, in one line
    assert main(["--config-dir", str(tmp_path / "nope"), "list"]) == 2
    assert "--config-dir" in capsys.readouterr().err
