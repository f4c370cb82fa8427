"""Kernels for the tree step: each Triton kernel beside its torch reference, and a dispatcher.

`DART_HF_KERNELS=auto` (default) uses Triton for CUDA tensors when triton imports, torch otherwise;
`triton` forces Triton (on CPU tensors too, with `TRITON_INTERPRET=1`: how the tests run them without a GPU);
`torch` forces the torch references.

Importing this package registers `attn_implementation="dart_tree"` (tree attention from a packed ancestor
bitmask, no dense mask) with Transformers.
"""

from .dispatch import compact_kv, tree_mask, use_triton
from .tree_attention import TreeAttentionMetadata, register

register()

__all__ = ["TreeAttentionMetadata", "compact_kv", "tree_mask", "use_triton"]
