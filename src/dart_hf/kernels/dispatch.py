"""Choose between the Triton kernels and their torch references."""

from __future__ import annotations

import functools
import os

import torch

from . import kv_compact, tree_mask as tree_mask_module


@functools.cache
def triton_available() -> bool:
    """Whether Triton imports here (the kernels need it for CUDA tensors)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(device: torch.device) -> bool:
    """Whether the Triton kernels run for tensors on `device` (see the module docstring of `dart_hf.kernels`)."""
    mode = os.environ.get("DART_HF_KERNELS", "auto").lower()
    if mode not in ("auto", "triton", "torch"):
        raise ValueError(f"DART_HF_KERNELS must be 'auto', 'triton' or 'torch', got {mode!r}.")
    if mode == "torch":
        return False
    if mode == "triton":
        if not triton_available():
            raise RuntimeError("DART_HF_KERNELS=triton but triton is not installed: pip install 'dart-hf[triton]'.")
        return True
    return device.type == "cuda" and triton_available()


def tree_mask(parents: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask `[1, 1, N, prefix_len + N]` from parent indices `[N]` (see `kernels.tree_mask`)."""
    if use_triton(parents.device):
        return tree_mask_module.tree_mask_triton(parents, prefix_len, dtype)
    return tree_mask_module.tree_mask_torch(parents, prefix_len, dtype)


def compact_kv(tensors: list[torch.Tensor], past_len: int, path: torch.Tensor) -> None:
    """Move the accepted rows of each `[B, H, T, D]` tensor into place, in place (see `kernels.kv_compact`)."""
    if tensors and use_triton(tensors[0].device):
        kv_compact.compact_kv_triton(tensors, past_len, path)
    else:
        kv_compact.compact_kv_torch(tensors, past_len, path)
