"""KV-cache compaction: keep, after `past_len` cached positions, only the accepted tree nodes.

Row j of the kept block comes from position past_len + path[j]; path is increasing and path[j] >= j, so copying
in increasing j never overwrites a row that is still to be read (that is why the Triton kernel walks j in order
inside one program per (batch, head)).
"""

from __future__ import annotations

import torch


def compact_kv_torch(tensors: list[torch.Tensor], past_len: int, path: torch.Tensor) -> None:
    """tensors: `[B, H, T, D]` keys / values, modified in place (the rows after past_len + len(path) are left)."""
    source = path.to(tensors[0].device) + past_len
    new_len = past_len + path.shape[0]
    for tensor in tensors:
        tensor[:, :, past_len:new_len] = tensor.index_select(2, source)


def compact_kv_triton(tensors: list[torch.Tensor], past_len: int, path: torch.Tensor) -> None:
    """The same copy with Triton: one launch per tensor, one program per (batch, head) row."""
    import triton

    path = path.to(device=tensors[0].device, dtype=torch.int64).contiguous()
    for tensor in tensors:
        batch, heads, _, head_dim = tensor.shape
        if tensor.stride(-1) != 1:
            raise ValueError("compact_kv_triton needs the last dimension of the cache contiguous.")
        _kv_compact_kernel()[(batch * heads,)](
            tensor, path, past_len, path.shape[0], heads, tensor.stride(0), tensor.stride(1), tensor.stride(2),
            head_dim, BLOCK=triton.next_power_of_2(head_dim),
        )


_KERNEL = None


def _kv_compact_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def kernel(cache_ptr, path_ptr, past_len, num_kept, heads, stride_b, stride_h, stride_t, head_dim,
                   BLOCK: tl.constexpr):
            program = tl.program_id(0)
            base = cache_ptr + (program // heads) * stride_b + (program % heads) * stride_h
            columns = tl.arange(0, BLOCK)
            for j in range(0, num_kept):
                source = past_len + tl.load(path_ptr + j)
                row = tl.load(base + source * stride_t + columns, mask=columns < head_dim)
                tl.store(base + (past_len + j) * stride_t + columns, row, mask=columns < head_dim)

        _KERNEL = kernel
    return _KERNEL
