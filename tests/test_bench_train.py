"""scripts/bench_train.py's FLOP formula (never its timings): the trainer's own windows and batches, counted with
and without ``trainer.last_position_only``, agree with torch's FlopCounterMode on real batches."""
from dataclasses import replace

import torch

from bftrec.config import TrainerConfig
from bftrec.data.datasets import dataset_config, load_dataset
from bftrec.layers import LAYER_CONFIGS
from bftrec.models import DataInfo
from bftrec.models.sasrec import SASRec, SASRecConfig
from tests.scripts import load_script


def test_flop_formula_matches_the_counter_under_prefixes_with_and_without_last_position_only():
    bench = load_script("bench_train")
    cfg = dataset_config("synthetic")
    cfg.synthetic.n_users, cfg.synthetic.n_items = 120, 60
    data = load_dataset(cfg)
    mc = SASRecConfig(d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=8, loss="ce")
    torch.manual_seed(0)
    info = DataInfo(n_items=data.n_items, train_counts=data.train_counts(), has_timestamps=False)
    model = SASRec(mc, LAYER_CONFIGS["standard"](), info)
    tc = replace(TrainerConfig(), batch_size=32, train_windows="prefixes")
    tw, shapes = bench.epoch_shapes(data, tc, 0, mc.max_len)
    assert len(tw) > len(data.offsets) - 1  # prefixes: more windows than users
    assert all(0 < P <= B for _, B, _, P in shapes)  # at most one loss position per window (none: no input)
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][1] * shapes[i][2])
    rows = bench.flop_check(model, tw, shapes, mc, tc, data.n_items, [order[0], order[-1]])
    assert {r["last_position_only"] for r in rows} == {False, True}
    for r in rows:
        assert r["formula"] == r["counted"], r
    full = bench.flop(32, 8, 32, mc, data.n_items)
    last = bench.flop(32, 8, 32, mc, data.n_items, last_only=True)
    assert last["head"] == full["head"] and last["encoder"] < full["encoder"]
