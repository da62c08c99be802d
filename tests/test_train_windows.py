"""Training windows (``trainer.train_windows``): target coverage, ``last`` unchanged, bad input.

``bftrec.data.batches.train_window_bounds`` states which training targets each mode predicts; these
tests check it against a plain per-user loop, and run every backbone (and BFT) on sliding windows.
"""
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bftrec.config import ConfigError, EvalConfig, TrainerConfig
from bftrec.data.batches import train_window_bounds, train_windows, windows
from bftrec.trainer import check_trainer_config, epoch_batches, train_window_set, train_windows_block, training_tensors
from tests.test_train_e2e import smoke_cfg

LENGTHS = [3, 4, 5, 7, 8, 9, 12, 13, 25, 31]  # interactions per user; training part = length - 2


def _data(lengths=LENGTHS):
    """Sequences whose item ids are their flat positions + 1, so a target id names its interaction."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    items = np.arange(1, offsets[-1] + 1, dtype=np.int64)
    times = 1_600_000_000 + 60 * items
    return SimpleNamespace(items=items, offsets=offsets, timestamps=times)


def _target_counts(seqs: np.ndarray, n_flat: int) -> np.ndarray:
    """(n_flat + 1,) how often each item id is a next-item target (an input precedes it) in ``seqs``."""
    inputs, targets = seqs[:, :-1], seqs[:, 1:]
    hits = targets[(inputs != 0) & (targets != 0)]
    return np.bincount(hits, minlength=n_flat + 1)


def _loop_windows(d, max_len: int, stride: int) -> list[list[int]]:
    """Reference: per user, windows ending at n, n - S, ... while the end is >= 2 (or the one window)."""
    out = []
    for u in range(len(d.offsets) - 1):
        train = list(d.items[d.offsets[u]: d.offsets[u + 1] - 2])
        ends = list(range(len(train), 1, -stride)) or [len(train)]
        out += [[0] * max(0, max_len + 1 - e) + train[max(0, e - max_len - 1): e] for e in ends]
    return out


@pytest.mark.parametrize("max_len, stride", [(4, None), (4, 4), (4, 3), (4, 1), (5, 2), (1, 1), (30, None)])
def test_sliding_predicts_every_training_target(max_len, stride):
    d = _data()
    seqs, _ = training_tensors(d, max_len, torch.device("cpu"), "sliding", stride)
    seqs = seqs.numpy()
    counts = _target_counts(seqs, len(d.items))
    S = stride or max_len
    for u in range(len(LENGTHS)):
        lo, hi = d.offsets[u], d.offsets[u + 1]
        n = hi - lo - 2
        assert counts[d.items[lo]] == 0  # t_0 has no history
        assert counts[d.items[hi - 2]] == 0 and counts[d.items[hi - 1]] == 0  # validation, test targets
        for i in range(1, n):
            c = counts[d.items[lo + i]]
            if i > n - 1 - max_len:  # the most recent max_len targets
                assert c == 1 + (n - 1 - i) // S, (u, i)
            else:
                assert math.floor(max_len / S) <= c <= math.ceil(max_len / S), (u, i)
            if S == max_len:
                assert c == 1
    # every window: left padding only, its last column a real item, the same windows as a plain loop
    nonpad = seqs != 0
    assert nonpad[:, -1].all()
    assert (np.diff(nonpad.astype(int), axis=1) >= 0).all()
    assert sorted(map(list, seqs)) == sorted(_loop_windows(d, max_len, S))


def test_sliding_times_follow_items_and_the_first_rows_are_the_last_windows():
    d = _data()
    L = 4
    last, last_t = training_tensors(d, L, torch.device("cpu"))
    slid, slid_t = training_tensors(d, L, torch.device("cpu"), "sliding", 2)
    U = len(LENGTHS)
    assert len(slid) > U
    assert torch.equal(slid[:U], last) and torch.equal(slid_t[:U], last_t)  # calibration batch unchanged
    real = slid.ne(0)
    assert torch.equal(slid_t[real], torch.from_numpy(d.timestamps)[slid[real] - 1])


def test_last_is_unchanged():
    """``last`` gives exactly the windows (and batches) the trainer used before the option existed."""
    d = _data()
    L = 6
    seqs, times = training_tensors(d, L, torch.device("cpu"), "last", None)
    old = torch.from_numpy(train_windows(d.items, d.offsets, L + 1))
    old_t = torch.from_numpy(train_windows(d.timestamps, d.offsets, L + 1))
    assert torch.equal(seqs, old) and torch.equal(times, old_t)
    users, start, end = train_window_bounds(d.offsets, L + 1)
    assert np.array_equal(users, np.arange(len(LENGTHS))) and np.array_equal(end, d.offsets[1:] - 2)
    assert np.array_equal(windows(d.items, start, end, L + 1), old.numpy())
    lengths = seqs.ne(0).sum(1)
    a = epoch_batches(lengths, 3, torch.Generator().manual_seed(0))
    b = epoch_batches(old.ne(0).sum(1), 3, torch.Generator().manual_seed(0))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def test_ranks_take_disjoint_slices_of_the_windows():
    seqs, _ = training_tensors(_data(), 3, torch.device("cpu"), "sliding", None)
    lengths = seqs.ne(0).sum(1)
    shares = [torch.cat(epoch_batches(lengths, 4, torch.Generator().manual_seed(1), r, 2)) for r in (0, 1)]
    assert len(shares[0]) == len(shares[1]) == len(seqs) // 2
    assert not set(shares[0].tolist()) & set(shares[1].tolist())


@pytest.mark.parametrize("over, message", [
    ({"train_windows": "all"}, "trainer.train_windows='all'"),
    ({"train_windows": "sliding", "train_window_stride": 0}, "train_window_stride=0"),
    ({"train_windows": "sliding", "train_window_stride": 13}, "train_window_stride=13"),
    ({"train_windows": "last", "train_window_stride": 5}, "train_window_stride=5 has no effect"),
])
def test_bad_window_settings_fail_in_one_line(over, message):
    with pytest.raises(ConfigError, match=message) as e:
        check_trainer_config(TrainerConfig(**over), EvalConfig(), max_len=12)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("override", ["trainer.train_windows=all", "trainer.train_window_stride=13"])
def test_bad_window_settings_fail_before_data_is_loaded(tmp_path, monkeypatch, override):
    import bftrec.experiment

    def no_data(*a, **k):
        raise AssertionError("data was loaded")

    monkeypatch.setattr(bftrec.experiment, "load_dataset", no_data)
    with pytest.raises(ConfigError, match="train_window"):
        bftrec.experiment.run(smoke_cfg(tmp_path, override), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model, layer", [("sasrec", "standard"), ("bert4rec", "standard"), ("hstu", "standard"),
                                          ("sasrec", "bft"), ("hstu", "bft")])
def test_every_backbone_trains_on_sliding_windows(tmp_path, model, layer):
    over = [f"model={model}", f"layer={layer}", "trainer.train_windows=sliding", "trainer.train_window_stride=6",
            "trainer.max_steps_per_epoch=3", "eval.mechanism=false", "dataset.synthetic.n_users=120"]
    m = run_cfg(tmp_path, over)
    assert m["train_windows"] == {"mode": "sliding", "window_items": 13, "stride": 6,
                                  "targets": "every training target at least once per epoch"}
    assert np.isfinite(m["test"]["overall"]["NDCG@10"])
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["train_windows"]["mode"] == "sliding"


def run_cfg(tmp_path, over):
    from bftrec.experiment import run

    return run(smoke_cfg(tmp_path, *over), tmp_path / "run")


# --- prefixes: one window per target, the loss at its last column (RecBole's augmentation) ---------------

@pytest.mark.parametrize("max_len", [1, 4, 30])
def test_prefixes_make_one_window_per_target_ending_at_it(max_len):
    d = _data()
    seqs, _ = training_tensors(d, max_len, torch.device("cpu"), "prefixes")
    seqs = seqs.numpy()
    scored = seqs[seqs[:, -2] != 0, -1]  # each window's last column, where an input precedes it
    want = [d.items[d.offsets[u] + i] for u in range(len(LENGTHS)) for i in range(1, LENGTHS[u] - 2)]
    assert sorted(scored.tolist()) == sorted(want)  # every training target t_1 .. t_{n-1} exactly once
    assert sorted(map(list, seqs)) == sorted(_loop_windows(d, max_len, 1))  # = sliding at stride 1
    assert (seqs[:, -2] == 0).sum() == 1  # only the user with one training item: a window without a target
    first, _ = training_tensors(d, max_len, torch.device("cpu"), "last")
    assert np.array_equal(seqs[:len(LENGTHS)], first.numpy())  # calibration batch unchanged


def _logits_ce(model, inputs, target):
    """Reference: full-softmax CE of ``target`` from the last hidden state of ``inputs`` (eval mode)."""
    h = model.encode(inputs)[:, -1]  # (B, D)
    logits = h @ model.item_table()[1:].T if hasattr(model, "item_table") else h @ model.item_emb.weight[1:].T
    if getattr(model.cfg, "temperature", 1.0) != 1.0:
        logits = logits / model.cfg.temperature
    return torch.nn.functional.cross_entropy(logits, target - 1)


@pytest.mark.parametrize("name", ["sasrec", "hstu"])
def test_last_target_only_scores_the_last_column_alone(name):
    from bftrec.layers import StandardLayerConfig
    from bftrec.models import MODELS, DataInfo

    torch.manual_seed(0)
    cls = MODELS.get(name)
    info = DataInfo(n_items=30, train_counts=np.ones(31, dtype=np.int64))
    kw = {"time_bias": False} if name == "hstu" else {}
    model = cls(cls.Config(d_model=16, n_layers=1, n_heads=2, max_len=6, loss="ce", dropout=0.0, attn_dropout=0.0,
                           **kw), StandardLayerConfig(), info).eval()
    seq = torch.tensor([[0, 0, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 9, 2], [1, 2, 3, 4, 5, 6, 8]])  # (B, L + 1)
    with torch.no_grad():
        only = model.training_loss({"seq": seq, "last_target_only": True})
        every = model.training_loss({"seq": seq})
        ref = _logits_ce(model, seq[:, :-1], seq[:, -1])
    assert torch.allclose(only, ref, rtol=1e-5, atol=1e-6), (only, ref)
    assert not torch.allclose(only, every, rtol=1e-3)  # the flag changes which positions count


def test_prefixes_refused_for_bert4rec_before_data_is_loaded(tmp_path, monkeypatch):
    import bftrec.experiment

    monkeypatch.setattr(bftrec.experiment, "load_dataset", lambda *a, **k: pytest.fail("data was loaded"))
    with pytest.raises(ConfigError, match="prefixes needs a next-item backbone") as e:
        bftrec.experiment.run(smoke_cfg(tmp_path, "model=bert4rec", "trainer.train_windows=prefixes"), tmp_path / "run")
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_prefixes_refuse_a_stride():
    with pytest.raises(ConfigError, match="train_window_stride=2 has no effect with trainer.train_windows=prefixes"):
        check_trainer_config(TrainerConfig(train_windows="prefixes", train_window_stride=2), EvalConfig(), 12)


@pytest.mark.parametrize("model, layer", [("sasrec", "standard"), ("hstu", "bft")])
def test_backbones_train_on_prefixes(tmp_path, model, layer):
    over = [f"model={model}", f"layer={layer}", "trainer.train_windows=prefixes",
            "trainer.max_steps_per_epoch=3", "eval.mechanism=false", "dataset.synthetic.n_users=120"]
    m = run_cfg(tmp_path, over)
    assert m["train_windows"]["mode"] == "prefixes" and m["train_windows"]["stride"] is None
    assert "last column of its own window" in m["train_windows"]["targets"]
    assert np.isfinite(m["test"]["overall"]["NDCG@10"])


# --- windows cut per batch: the trainer never holds the (W, L + 1) table ----------------------------------

@pytest.mark.parametrize("mode", ["last", "sliding", "prefixes"])
@pytest.mark.parametrize("with_times", [True, False])
def test_window_set_cuts_the_rows_of_the_table(mode, with_times):
    d = _data()
    if not with_times:
        d.timestamps = None
    L = 4
    tw = train_window_set(d, L, torch.device("cpu"), mode)
    seqs, times = training_tensors(d, L, torch.device("cpu"), mode)
    assert len(tw) == len(seqs) and torch.equal(tw.lengths(), seqs.ne(0).sum(1))
    idx = torch.randperm(len(tw), generator=torch.Generator().manual_seed(0))[:7]
    got = tw.batch(idx)
    assert torch.equal(got["seq"], seqs[idx]) and got["seq"].dtype == torch.int64
    assert ("time" in got) == with_times and (not with_times or torch.equal(got["time"], times[idx]))
    assert torch.equal(tw.batch(np.arange(3))["seq"], seqs[:3])  # numpy rows too (the calibration batch)


def test_fit_cuts_windows_batch_by_batch(tmp_path, monkeypatch):
    """``prefixes`` has ~5x (Amazon) to ~160x (ML-1M, L=200) the rows of ``last``: fit must never cut them all."""
    import bftrec.trainer

    cut = []

    def counting(values, start, end, length):
        cut.append(len(start))
        return windows(values, start, end, length)

    monkeypatch.setattr(bftrec.trainer, "windows", counting)
    over = ["trainer.train_windows=prefixes", "trainer.batch_size=16", "trainer.max_steps_per_epoch=3",
            "eval.mechanism=false", "dataset.synthetic.n_users=120"]
    m = run_cfg(tmp_path, over)
    assert np.isfinite(m["test"]["overall"]["NDCG@10"])
    assert cut and max(cut) <= 16, max(cut)  # batches and the calibration batch only


def test_metrics_say_when_ddp_skips_windows():
    cfg = TrainerConfig(train_windows="prefixes")
    assert train_windows_block(cfg, 50)["targets"] == train_windows_block(cfg, 50, 1)["targets"]
    assert "once per epoch" in train_windows_block(cfg, 50)["targets"]
    four = train_windows_block(cfg, 50, 4)["targets"]
    assert "under DDP (4 processes) up to 3 windows per epoch" in four
    assert "up to 1 window per epoch" in train_windows_block(cfg, 50, 2)["targets"]


def test_window_set_takes_a_mask_as_its_rows():
    tw = train_window_set(_data(), 4, torch.device("cpu"), "prefixes")
    mask = torch.zeros(len(tw), dtype=torch.bool)
    mask[[2, 5]] = True
    assert torch.equal(tw.batch(mask)["seq"], tw.batch(torch.tensor([2, 5]))["seq"])
