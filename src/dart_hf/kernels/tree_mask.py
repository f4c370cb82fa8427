"""The tree attention mask: parent indices -> additive float mask over [prefix, tree nodes].

Row i allows every prefix column and the columns of node i's ancestors and itself; everything else holds the
dtype's minimum (a float mask in the model dtype: eager attention would add a bool mask as 0 / 1).
"""

from __future__ import annotations

import torch


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """parents `[N]` long (parents[0] = -1, parents[i] < i) -> `[N, N]` bool: (i, j) when j is i or an ancestor."""
    size = parents.shape[0]
    ancestors = torch.eye(size, dtype=torch.bool, device=parents.device)
    rows = torch.arange(size, device=parents.device)
    current = parents.clone()
    while bool((current >= 0).any()):  # at most the tree depth iterations
        has = current >= 0
        ancestors[rows[has], current[has]] = True
        current = torch.where(has, parents[current.clamp(min=0)], current)
    return ancestors


def tree_mask_torch(parents: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """parents `[N]` long (parents[0] = -1, parents[i] < i) -> `[1, 1, N, prefix_len + N]` in `dtype`."""
    size = parents.shape[0]
    device = parents.device
    ancestors = ancestor_matrix(parents)
    mask = torch.full((size, prefix_len + size), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask[:, :prefix_len] = 0
    mask[:, prefix_len:].masked_fill_(ancestors, 0)
    return mask.view(1, 1, size, prefix_len + size)


def tree_mask_triton(parents: torch.Tensor, prefix_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The same mask in one Triton launch: one program per tree node fills its row and walks its ancestors."""
    import triton

    size = parents.shape[0]
    width = prefix_len + size
    mask = torch.empty((size, width), dtype=dtype, device=parents.device)
    block = min(1024, triton.next_power_of_2(max(width, 16)))
    _tree_mask_kernel()[(size,)](
        parents.contiguous(), mask, prefix_len, width, torch.finfo(dtype).min, BLOCK=block
    )
    return mask.view(1, 1, size, width)


_KERNEL = None


def _tree_mask_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def kernel(parents_ptr, mask_ptr, prefix_len, width, min_value, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            row_ptr = mask_ptr + row * width
            for start in range(0, width, BLOCK):
                columns = start + tl.arange(0, BLOCK)
                values = tl.where(columns < prefix_len, 0.0, min_value)
                tl.store(row_ptr + columns, values.to(mask_ptr.dtype.element_ty), mask=columns < width)
            node = row.to(tl.int64)
            while node >= 0:
                tl.store(row_ptr + prefix_len + node, tl.zeros((), dtype=mask_ptr.dtype.element_ty))
                node = tl.load(parents_ptr + node)

        _KERNEL = kernel
    return _KERNEL
