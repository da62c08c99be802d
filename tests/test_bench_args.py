"""The benches refuse bad numbers, devices and hyperparameters in one line before any timing (scripts/_cli.py),
and never overwrite a committed result with an empty or another backbone's one."""
import re
import sys

import pytest

from tests.scripts import load_script


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "argument --steps: 0: give an integer >= 1"),
    (["--warmup", "-1"], "argument --warmup: -1: give an integer >= 0"),
    (["--threads", "two"], "argument --threads: 'two': give an integer >= 0"),
    (["--device", "foo"], "argument --device: 'foo': give auto, cpu, cuda or cuda:N"),
    (["--loss", "foo"], "argument --loss: invalid choice: 'foo'"),
])
def test_bench_layer_refuses_bad_numbers_in_one_line(monkeypatch, capsys, args, message):
    bench = load_script("bench_layer")
    monkeypatch.setattr(sys, "argv", ["bench_layer.py", *args])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_layer_never_writes_an_empty_trainer_result(monkeypatch, tmp_path):
    """``--only trainer`` without the real data has nothing to measure: refused, no JSON written."""
    bench = load_script("bench_layer")
    monkeypatch.setattr(bench, "sports_windows", lambda: None)  # the data root has no Sports
    out = tmp_path / "layer.json"
    monkeypatch.setattr(sys, "argv", ["bench_layer.py", "--only", "trainer", "--model", "bert4rec", "--out", str(out)])
    with pytest.raises(SystemExit, match="--only trainer needs the real Sports data; set BFTREC_DATA_ROOT"):
        bench.main()
    assert not out.exists()


@pytest.mark.parametrize("args, message", [(["--threads", "0"], "argument --threads: 0: give an integer >= 1"),
                                           (["--steps", "0"], "argument --steps: 0: give an integer >= 1")])
def test_bench_train_refuses_bad_numbers_in_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        load_script("bench_train").main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_peer_refuses_bad_seeds_and_hyperparameters(capsys):
    bench = load_script("bench_peer")
    with pytest.raises(SystemExit) as e:
        bench.main(["--seeds", "x"])
    assert e.value.code == 2 and "argument --seeds: 'x': give comma-separated integers" in capsys.readouterr().err
    for hp, message in (("max_len=abc", "max_len takes a int"), ("max_len=-5", "out of range (give a positive"),
                        ("dropout=2", "out of range (a rate in [0, 1))"), ("attn_dropout=1", "a rate in [0, 1)")):
        with pytest.raises(SystemExit, match=rf"--hp '{re.escape(hp)}': .*{re.escape(message)}"):
            bench.hyperparameters("ml-100k", [hp])
    assert bench.hyperparameters("ml-100k", ["max_len=20", "dropout=0.3"])["max_len"] == 20
