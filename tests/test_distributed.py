"""Under torch.distributed each user is scored exactly once and metrics equal the 1-process ones."""
import os
import socket

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bftrec.config import EvalConfig
from bftrec.evaluation import rank_users
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
