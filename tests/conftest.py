"""Test session setup: Triton kernels run in Triton's interpreter on machines without a GPU; the forward costs
calibrated for the tests' tiny models go to a temporary folder, never to the user's dart-hf cache; and under
pytest-xdist (`-n auto`, the default in pyproject.toml) the workers share the CPU's cores instead of each taking
them all (OpenMP threads of one worker spinning on cores another worker holds would slow both)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _threads = max(1, len(os.sched_getaffinity(0)) // _workers)
    torch.set_num_threads(_threads)
    os.environ["OMP_NUM_THREADS"] = str(_threads)  # and the subprocesses' (notebook kernels, CLIs, torchrun ranks)


@pytest.fixture(autouse=True)
def private_cost_cache(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.getbasetemp() / "forward_costs"
    monkeypatch.setattr("dart_hf.costs.cache_root", lambda: folder)
    return folder
