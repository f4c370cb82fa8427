"""Kernels for the tree step: each Triton kernel beside its torch reference, and a dispatcher.

`DART_HF_KERNELS=auto` (default) uses Triton for CUDA tensors when triton imports, torch otherwise;
`triton` forces Triton (on CPU tensors too, with `TRITON_INTERPRET=1`: how the tests run them without a GPU);
`torch` forces the torch references.
"""

from .dispatch import compact_kv, tree_mask, use_triton

__all__ = ["compact_kv", "tree_mask", "use_triton"]
