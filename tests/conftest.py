"""Test session setup: Triton kernels run in Triton's interpreter on machines without a GPU, and the forward
costs calibrated for the tests' tiny models go to a temporary folder, never to the user's dart-hf cache."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def private_cost_cache(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.getbasetemp() / "forward_costs"
    monkeypatch.setattr("dart_hf.costs.cache_root", lambda: folder)
    return folder
