"""Under torch.distributed each user is scored exactly once and metrics, mechanism statistics included,
equal the 1-process ones."""
import json
import os
import socket

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bftrec.config import EvalConfig
from bftrec.evaluation import rank_users
from bftrec.mechanism import aggregate_mechanism
from tests.test_evaluation import LastItemScorer, toy_sequences


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    items, offsets = toy_sequences(n_users=101)
    counts = np.bincount(items, minlength=31)
    table = rank_users(LastItemScorer(30), items, offsets, None, "test", 30, 8, counts,
                       EvalConfig(batch_size=16), torch.device("cpu"))
    if rank == 0:
        table.to_csv(out, index=False)
    dist.destroy_process_group()


def _fake_sink(users: np.ndarray, seed: int = 0) -> list:
    """Mechanism chunks of a 2-layer BFT stack for ``users`` (chunks of 8, left padding, D = 4)."""
    out = []
    for lo in range(0, len(users), 8):
        u = users[lo:lo + 8]
        g = np.random.default_rng([seed, lo])
        x = g.integers(1, 31, size=(len(u), 6))
        x[np.arange(6)[None, :] < (u % 6)[:, None]] = 0  # user u has 6 - u % 6 real tokens
        valid = torch.from_numpy(x != 0).float()
        def rand(g=g, x=x, valid=valid):
            return torch.from_numpy(g.random(x.shape)).float() * valid

        layers = [{"K": rand(), "lam_obs": 40 * rand(), "n_eff": 3 * rand(), "Q": torch.full((4,), 0.1 * i + 0.1)}
                  for i in range(2)]
        out.append({"mech": {"lam0": 38 * rand(), "layers": layers}, "item_seq": torch.from_numpy(x), "users": u})
    return out


MECH_ARGS = dict(train_counts=np.arange(31), bins=[{"bin": "Q0", "lo": 0, "hi": 14, "n_items": 15},
                                                        {"bin": "Q1", "lo": 15, "hi": 30, "n_items": 15}],
                 history_len=np.arange(41) % 6 + 1, cold_max_history=2)


def _mech_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    users = np.arange(41)[rank::world]  # as rank_users shards them
    mech = aggregate_mechanism(_fake_sink(users, seed=rank), **MECH_ARGS)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(mech, f)
    dist.destroy_process_group()


def test_mechanism_statistics_cover_the_users_of_every_process(tmp_path):
    out = str(tmp_path / "mech.json")
    mp.spawn(_mech_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    both = [json.load(open(f"{out}.{r}")) for r in (0, 1)]
    single = aggregate_mechanism(_fake_sink(np.arange(41)[0::2], seed=0) + _fake_sink(np.arange(41)[1::2], seed=1),
                                 **MECH_ARGS)
    assert both[0]["cold_users"]["n_tokens"] + both[0]["warm_users"]["n_tokens"] == 41 * 6 - sum(np.arange(41) % 6)
    for got in both:  # every process returns the statistics of all users
        _assert_same_mechanism(got, single)


def _assert_same_mechanism(got: dict, want: dict) -> None:
    """Equal structure and counts; floats equal up to summation order."""
    assert got.keys() == want.keys()
    for key in want:
        a, b = got[key], want[key]
        if isinstance(b, (dict, list)):
            pairs = zip(a, b) if isinstance(b, list) else ((a[k], b[k]) for k in b)
            assert (a.keys() == b.keys()) if isinstance(b, dict) else len(a) == len(b), key
            for x, y in pairs:
                _assert_same_mechanism({"v": x}, {"v": y})
        elif isinstance(b, float):
            assert np.isclose(a, b, rtol=1e-5, atol=1e-7), (key, a, b)
        else:
            assert a == b, (key, a, b)


def test_two_processes_score_each_user_once(tmp_path):
    out = str(tmp_path / "ranks.csv")
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    gathered = pd.read_csv(out)
    items, offsets = toy_sequences(n_users=101)
    single = rank_users(LastItemScorer(30), items, offsets, None, "test", 30, 8,
                        np.bincount(items, minlength=31), EvalConfig(batch_size=1000), torch.device("cpu"))
    assert gathered["user"].is_unique and len(gathered) == 101
    assert (gathered["rank"].to_numpy() == single["rank"].to_numpy()).all()


def test_torchrun_two_processes_bft_smoke(tmp_path):
    """DDP end to end through the real entry point (Gloo on CPU), BFT layer included."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "BFTREC_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        f"--master_port={_free_port()}", "-m", "bftrec.train", "debug=smoke", "layer=bft",
                        "trainer.epochs=2", "trainer.num_threads=1", f"hydra.run.dir={tmp_path}/run"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = pd.read_csv(tmp_path / "run" / "ranks.csv.gz")
    assert ranks["user"].is_unique and len(ranks) == 200  # debug=smoke has 200 users
    # the mechanism block covers every user: it equals one process re-scoring the same checkpoint
    from bftrec.evaluate import rescore

    ddp = json.loads((tmp_path / "run" / "metrics.json").read_text())["mechanism"]
    one = rescore(tmp_path / "run", [f"cache_dir={tmp_path / 'cache'}"], tmp_path / "one")["mechanism"]
    one.pop("gain_first_batch", None), ddp.pop("gain_first_batch", None)
    assert ddp["warm_users"]["K"] is not None and ddp["cold_users"]["n_tokens"] > 0
    _assert_same_mechanism(ddp, one)
