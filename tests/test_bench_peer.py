"""scripts/bench_peer.py without RecBole: the export to RecBole atomic files, the id layout of the score
adapter, and the one-line error when RecBole is missing."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bftrec.data.batches import train_windows
from bftrec.data.datasets import dataset_config, load_dataset
from tests.scripts import load_script

L = 6  # max_len: small, so that many synthetic users are longer than the window


@pytest.fixture(scope="module")
def data():
    cfg = dataset_config("synthetic")
    cfg.synthetic.n_users, cfg.synthetic.n_items = 150, 80
    return load_dataset(cfg)


def _read(path):
    return pd.read_csv(path, sep="\t")


@pytest.mark.parametrize("targets", ["window", "all"])
def test_export_round_trips_users_items_and_order(tmp_path, data, targets):
    bench = load_script("bench_peer")
    info = bench.export_atomic(data, tmp_path, "bench", L, targets)
    inter = _read(tmp_path / "bench" / "bench.inter")
    assert list(inter.columns) == ["user_id:token", "item_id:token", "timestamp:float"]
    assert _read(tmp_path / "bench" / "bench.item")["item_id:token"].tolist() == list(range(1, data.n_items + 1))
    assert info["rows"] == len(inter) and sorted(inter["user_id:token"].unique()) == list(range(data.n_users))
    for u, g in inter.groupby("user_id:token", sort=True):
        seq = data.sequence(u)
        keep = seq if targets == "all" else seq[-(L + 3):]
        assert g["item_id:token"].tolist() == keep.tolist()  # same items, same order
        # timestamps: the positions in the full sequence, strictly increasing (RecBole's time order)
        assert g["timestamp:float"].tolist() == list(range(len(seq) - len(keep), len(seq)))
    assert info["train_targets"] == bench.bftrec_train_targets(data, L, targets)


def test_window_export_gives_recbole_exactly_bftrecs_training_targets(tmp_path, data):
    """RecBole's augmentation (every prefix, history cut to max_len) and leave-one-out split (last two rows
    out) on the exported rows give the (history, target) pairs bftrec trains on from its windows."""
    bench = load_script("bench_peer")
    bench.export_atomic(data, tmp_path, "bench", L, "window")
    inter = _read(tmp_path / "bench" / "bench.inter")
    recbole, bftrec = set(), set()
    win = train_windows(data.items, data.offsets, L + 1)  # (U, L + 1) what bftrec's trainer sees
    for u, g in inter.groupby("user_id:token", sort=True):
        s = g["item_id:token"].tolist()
        rows = [(tuple(s[max(0, t - L):t]), s[t]) for t in range(1, len(s))]  # RecBole's augmentation
        recbole.update((u, h, y) for h, y in rows[:-2])  # minus the validation and test rows
        w = [int(x) for x in win[u] if x]
        bftrec.update((u, tuple(w[:t]), w[t]) for t in range(1, len(w)))  # causal: target t sees w[:t]
    assert len(recbole) == bench.bftrec_train_targets(data, L, "window") and recbole == bftrec



def test_all_targets_gives_bftrec_recboles_samples_one_each(tmp_path, data):
    """``--targets all``: bftrec trains with ``prefixes``, whose samples (history, target) are RecBole's
    every-prefix rows of the full export (minus validation and test), each exactly once."""
    from collections import Counter

    from bftrec.trainer import train_window_set

    bench = load_script("bench_peer")
    bench.export_atomic(data, tmp_path, "bench", L, "all")
    inter = _read(tmp_path / "bench" / "bench.inter")
    recbole = Counter()
    for u, g in inter.groupby("user_id:token", sort=True):
        s = g["item_id:token"].tolist()
        rows = [(tuple(s[max(0, t - L):t]), s[t]) for t in range(1, len(s))]
        recbole.update((u, h, y) for h, y in rows[:-2])
    tw = train_window_set(data, L, torch.device("cpu"), "prefixes")
    seqs = tw.batch(np.arange(len(tw)))["seq"].numpy()  # (W, L + 1): context, then the target
    owner = np.searchsorted(data.offsets, tw.end - 1, side="right") - 1  # (W,) user of each window
    ours = Counter((int(u), tuple(int(x) for x in w[:-1] if x), int(w[-1])) for u, w in zip(owner, seqs)
                   if w[-2] != 0)  # a window with no context has no target (t_0)
    assert sum(ours.values()) == sum(recbole.values()) == bench.bftrec_train_targets(data, L, "all")
    assert ours == recbole
    peer = bench.Bftrec(data, {**bench.hyperparameters("sports", [f"max_len={L}"]), "max_len": L}, 0, "all",
                        tmp_path / "b")
    assert peer.tc.train_windows == "prefixes"

def test_right_aligned_moves_padding_to_the_end():
    bench = load_script("bench_peer")
    left = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4], [0, 0, 0, 9]])
    seq, lengths = bench.right_aligned(left)
    assert seq.tolist() == [[5, 6, 0, 0], [1, 2, 3, 4], [9, 0, 0, 0]] and lengths.tolist() == [2, 4, 1]


def test_hyperparameters_from_tuned_config_and_overrides():
    bench = load_script("bench_peer")
    hp = bench.hyperparameters("sports", ["max_len=20"])
    assert hp["dropout"] == 0.5 and hp["max_len"] == 20 and hp["batch_size"] == 256
    with pytest.raises(SystemExit, match="max_lenn=20"):
        bench.hyperparameters("sports", ["max_lenn=20"])


def test_without_recbole_one_line_how_to_install_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "recbole", None)  # unimportable even where it is installed
    with pytest.raises(SystemExit) as e:
        load_script("bench_peer").main(["--datasets", "synthetic", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench_peer: error: RecBole")
    assert "pip install -e '.[peer]'" in lines[0] and not (tmp_path / "x.json").exists()


def test_export_rejects_unknown_targets(tmp_path, data):
    with pytest.raises(ValueError, match="targets='every'"):
        load_script("bench_peer").export_atomic(data, tmp_path, "bench", L, "every")


def test_ratio_and_quality_summary_over_seeds():
    bench = load_script("bench_peer")

    def run(b, p):
        sel = {c: {"test": {"NDCG@10": v}} for c, v in zip(bench.CONVENTIONS, (b, b))}
        sel_p = {c: {"test": {"NDCG@10": v}} for c, v in zip(bench.CONVENTIONS, (p, p))}
        return {"same_train_targets": True,
                "bftrec": {"train_targets_per_s": 600.0, "eval_users_per_s": 90.0, "selected": sel},
                "recbole": {"train_targets_per_s": 100.0, "eval_users_per_s": 30.0, "selected": sel_p}}

    out = bench.summarize_runs([run(0.10, 0.11), run(0.12, 0.13)])
    assert out["bftrec_over_recbole"] == {"train_targets_per_s": 6.0, "eval_users_per_s": 3.0}
    with_cpu = [run(0.10, 0.11), run(0.12, 0.13)]
    for r, (b, p) in zip(with_cpu, ((800.0, 100.0), (400.0, 100.0))):  # per-CPU-second ratios 8 and 4: mean 6
        r["bftrec"].update(train_targets_per_cpu_s=b, eval_users_per_cpu_s=b / 10)
        r["recbole"].update(train_targets_per_cpu_s=p, eval_users_per_cpu_s=p / 10)
    ratio = bench.summarize_runs(with_cpu)["bftrec_over_recbole"]
    assert ratio["train_targets_per_cpu_s"] == ratio["eval_users_per_cpu_s"] == 6.0
    del with_cpu[1]["recbole"]["eval_users_per_cpu_s"]  # one run without it: no CPU ratio for that column
    assert "eval_users_per_cpu_s" not in bench.summarize_runs(with_cpu)["bftrec_over_recbole"]
    q = out["quality"]["masked"]
    assert np.isclose(q["difference"], -0.01) and np.isclose(q["seed_noise_2se"], 2 * np.sqrt(2e-4 / 2 + 2e-4 / 2))
    assert q["within_seed_noise"] is True


def test_eval_speed_times_both_frameworks_interleaved(monkeypatch, data):
    """--eval-speed: a warm-up plus REPS timed native validations per framework, the order alternating;
    the ratio is bftrec's median users/s over RecBole's (a stand-in peer here: RecBole is optional)."""
    bench = load_script("bench_peer")
    calls = []

    class FakePeer:
        def __init__(self, rb, data, hp, seed, targets, workdir, eval_batch_size):
            self.model, self.valid_users = torch.nn.Linear(1, 1), 40

        def validate(self):
            calls.append("recbole")
            return {"HR@10": 0.0, "NDCG@10": 0.0}

    real = bench.Bftrec.validate

    def validate(self):
        calls.append("bftrec")
        return real(self)

    monkeypatch.setattr(bench, "Peer", FakePeer)
    monkeypatch.setattr(bench.Bftrec, "validate", validate)
    monkeypatch.setattr(bench, "load_dataset", lambda cfg: data)
    hp = {**bench.hyperparameters("synthetic", []), "max_len": L}
    out = bench.eval_speed(None, "synthetic", 0, hp, reps=3, eval_batch_size=64)
    assert calls == ["bftrec", "recbole"] + ["bftrec", "recbole", "recbole", "bftrec", "bftrec", "recbole"]
    assert len(out["bftrec"]["seconds"]) == len(out["recbole"]["seconds"]) == 3
    assert len(out["bftrec"]["cpu_seconds"]) == 3 and all(c > 0 for c in out["bftrec"]["cpu_seconds"])
    assert out["bftrec"]["users_per_cpu_s_median"] == pytest.approx(
        data.n_users / float(np.median(out["bftrec"]["cpu_seconds"])))
    assert out["bftrec"]["valid_users"] == data.n_users and out["recbole"]["valid_users"] == 40
    want = out["bftrec"]["users_per_s_median"] / out["recbole"]["users_per_s_median"]
    assert out["bftrec_over_recbole"] == pytest.approx(want)
    assert out["eval_users_per_s_at_least_3x"] == (want >= 3)


def test_eval_speed_rejects_negative_reps(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # before RecBole's import: the same line with or without it
        load_script("bench_peer").main(["--eval-speed", "-2", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "--eval-speed -2 must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _stand_in_peer(bench, fail_at=None):
    """A peer for run_pair without RecBole: a second bftrec SASRec (its own folder, seed + 1), which can
    be made to fail at one epoch, as a killed process would."""

    class StandIn(bench.Bftrec):
        name, native_convention, export = "recbole", None, {"users": 0}

        def __init__(self, rb, data, hp, seed, targets, workdir, eval_batch_size):
            super().__init__(data, hp, seed + 1, targets, workdir)

        def train_epoch(self):
            if fail_at is not None and self.epoch + 1 == fail_at:
                raise KeyboardInterrupt("stopped")
            return super().train_epoch()

        def native_test(self):
            return {"HR@10": 0.0, "NDCG@10": 0.0}

    return StandIn


def test_run_pair_resumes_from_its_workdir_as_if_never_stopped(tmp_path, monkeypatch, data):
    """--workdir: a run stopped during epoch 3 and started again gives the rows, the selected epochs and
    the test figures of a run that was never stopped (the peer is a stand-in; RecBole is optional)."""
    bench = load_script("bench_peer")
    monkeypatch.setattr(bench, "load_dataset", lambda cfg: data)
    hp = {**bench.hyperparameters("synthetic", []), "max_len": L, "batch_size": 32}
    args = dict(rb=None, dataset="synthetic", seed=0, epochs=4, patience=10, hp=hp, targets="window",
                eval_batch_size=64)
    monkeypatch.setattr(bench, "Peer", _stand_in_peer(bench))
    whole = bench.run_pair(**args, workdir=tmp_path / "whole")
    monkeypatch.setattr(bench, "Peer", _stand_in_peer(bench, fail_at=3))
    with pytest.raises(KeyboardInterrupt):
        bench.run_pair(**args, workdir=tmp_path / "resumed")
    assert torch.load(tmp_path / "resumed" / "synthetic-seed0" / "state.pt", weights_only=False)["epoch"] == 2
    monkeypatch.setattr(bench, "Peer", _stand_in_peer(bench))
    resumed = bench.run_pair(**args, workdir=tmp_path / "resumed")
    for k in ("bftrec", "recbole"):
        assert [r["epoch"] for r in resumed[k]["epochs"]] == [1, 2, 3, 4]
        assert resumed[k]["train_targets_per_cpu_s"] > 0 and resumed[k]["eval_users_per_cpu_s"] > 0
        assert all(r["train_cpu_s"] > 0 and r["eval_cpu_s"] > 0 for r in resumed[k]["epochs"])
        for a, b in zip(whole[k]["epochs"], resumed[k]["epochs"]):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-6), (k, a["epoch"])
            for c in bench.CONVENTIONS:
                assert a["valid"][c] == pytest.approx(b["valid"][c], rel=1e-6, abs=1e-9), (k, a["epoch"], c)
        for c in bench.CONVENTIONS:
            sw, sr = whole[k]["selected"][c], resumed[k]["selected"][c]
            assert sw["best_epoch"] == sr["best_epoch"] and sw["test"] == pytest.approx(sr["test"], rel=1e-6)
    for change in ({"targets": "all"}, {"epochs": 5}, {"patience": 3}):
        key, value = next(iter(change.items()))
        with pytest.raises(SystemExit, match=rf"other settings \(was, now: .*'{key}': \({args[key]!r}, {value!r}\)"):
            bench.run_pair(**{**args, **change}, workdir=tmp_path / "resumed")


def test_run_pair_workdir_may_be_relative(tmp_path, monkeypatch, data):
    """RecBole reads its files after changing directory, so the run folder is made absolute."""
    bench = load_script("bench_peer")
    seen = []

    class Peer:
        def __init__(self, rb, data, hp, seed, targets, workdir, eval_batch_size):
            seen.append(workdir)
            raise KeyboardInterrupt

    monkeypatch.setattr(bench, "Peer", Peer)
    monkeypatch.setattr(bench, "load_dataset", lambda cfg: data)
    monkeypatch.chdir(tmp_path)
    hp = {**bench.hyperparameters("synthetic", []), "max_len": L}
    with pytest.raises(KeyboardInterrupt):
        bench.run_pair(None, "synthetic", 0, 1, 1, hp, "window", 64, workdir=Path("rel"))
    assert seen == [tmp_path.resolve() / "rel" / "synthetic-seed0" / "recbole"]


@pytest.mark.parametrize("flags", [["--epochs", "0"], ["--patience", "0"]])
def test_epochs_and_patience_below_one_are_refused(tmp_path, capsys, flags):
    with pytest.raises(SystemExit) as e:
        load_script("bench_peer").main([*flags, "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and f"argument {flags[0]}: 0: give an integer >= 1" in capsys.readouterr().err


def test_progress_reports_a_stopped_run_without_recbole(tmp_path, monkeypatch, data):
    """--progress reads a --workdir run's state after its last finished epoch: the rows and best-so-far
    it holds, no test, marked unfinished; a missing state is refused in one line."""
    bench = load_script("bench_peer")
    monkeypatch.setattr(bench, "load_dataset", lambda cfg: data)
    monkeypatch.setattr(bench, "Peer", _stand_in_peer(bench, fail_at=3))
    hp = {**bench.hyperparameters("synthetic", []), "max_len": L, "batch_size": 32}
    with pytest.raises(KeyboardInterrupt):
        bench.run_pair(None, "synthetic", 0, 4, 10, hp, "window", 64, workdir=tmp_path / "w")
    monkeypatch.setattr(bench, "import_recbole", lambda: pytest.fail("--progress must not need RecBole"))
    out = tmp_path / "progress.json"
    bench.main(["--datasets", "synthetic", "--workdir", str(tmp_path / "w"), "--progress", "--out", str(out)])
    got = json.loads(out.read_text())
    run = got["runs"]["synthetic-seed0"]
    assert got["finished"] is False and run["last_epoch"] == 2 and run["settings"]["epochs"] == 4
    for k in ("bftrec", "recbole"):
        fw = run["frameworks"][k]
        assert [r["epoch"] for r in fw["epochs"]] == [1, 2] and "test" not in json.dumps(fw)
        for c in bench.CONVENTIONS:
            best = max(fw["epochs"], key=lambda r: r["valid"][c]["NDCG@10"])
            assert fw["best_so_far"][c] == {"valid_NDCG@10": best["valid"][c]["NDCG@10"], "epoch": best["epoch"]}
    with pytest.raises(SystemExit, match="no .*synthetic-seed1.*state.pt; --progress reads a --workdir run"):
        bench.main(["--datasets", "synthetic", "--seeds", "1", "--workdir", str(tmp_path / "w"), "--progress",
                    "--out", str(out)])
    torn = tmp_path / "w" / "synthetic-seed2" / "state.pt"
    torn.parent.mkdir()
    torn.write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match="synthetic-seed2/state.pt is not a bench_peer state") as e:
        bench.main(["--datasets", "synthetic", "--seeds", "2", "--workdir", str(tmp_path / "w"), "--progress",
                    "--out", str(out)])
    assert "\n" not in str(e.value)


def test_fast_paths_reach_bftrecs_trainer_and_are_part_of_the_settings(tmp_path, monkeypatch, data, capsys):
    """issue 49 item 2: --fast sets bftrec's trainer fast paths (the model is unchanged), a workdir state written
    without them is not resumed with them, and last_position_only without --targets all is refused in one line."""
    bench = load_script("bench_peer")
    hp = {**bench.hyperparameters("synthetic", []), "max_len": L, "batch_size": 32}
    fw = bench.Bftrec(data, hp, 0, "all", tmp_path / "b", ("last_position_only", "mask_dropout", "fused_optimizer"))
    assert (fw.tc.train_windows, fw.tc.last_position_only, fw.tc.dropout, fw.tc.fused_optimizer) == (
        "prefixes", True, "mask", True)
    plain = bench.Bftrec(data, hp, 0, "all", tmp_path / "p")
    assert (plain.tc.last_position_only, plain.tc.dropout, plain.tc.fused_optimizer) == (False, "torch", False)
    monkeypatch.setattr(bench, "load_dataset", lambda cfg: data)
    monkeypatch.setattr(bench, "Peer", _stand_in_peer(bench, fail_at=2))
    args = (None, "synthetic", 0, 3, 10, hp, "all", 64)
    with pytest.raises(KeyboardInterrupt):
        bench.run_pair(*args, workdir=tmp_path / "w")
    with pytest.raises(SystemExit, match=r"other settings .*'bftrec_fast_paths': \(None, \['mask_dropout'\]\)"):
        bench.run_pair(*args, workdir=tmp_path / "w", fast=("mask_dropout",))
    with pytest.raises(SystemExit) as e:
        bench.main(["--fast", "last_position_only", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and "needs --targets all" in capsys.readouterr().err
