"""Suite-wide settings: tiny models run fastest on one thread, and one thread per process keeps
the suite from oversubscribing a small or shared CI machine (torch's threads spin-wait)."""
import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Never write the processed-data cache into the user's home during tests."""
    if "BFTREC_CACHE_DIR" not in os.environ:
        os.environ["BFTREC_CACHE_DIR"] = str(tmp_path_factory.mktemp("bftrec-cache"))
    yield
