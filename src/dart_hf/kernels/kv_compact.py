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
    """The same copy with Triton, in ONE launch for all tensors (every layer's keys and values): a table of the
    tensors' addresses, one program per (tensor, batch, head) row. The tensors must share shape, strides and dtype
    (a full-attention DynamicCache does); otherwise each group of equal tensors gets its own launch."""
    import triton
    import triton.language as tl

    element = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
               torch.float64: tl.float64}
    device = tensors[0].device
    path = path.to(device=device, dtype=torch.int64).contiguous()
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        if tensor.stride(-1) != 1:
            raise ValueError("compact_kv_triton needs the last dimension of the cache contiguous.")
        groups.setdefault((tuple(tensor.shape), tensor.stride(), tensor.dtype), []).append(tensor)
    for (shape, strides, dtype), group in groups.items():
        batch, heads, _, head_dim = shape
        table = torch.tensor([t.data_ptr() for t in group], dtype=torch.int64, device=device)
        _kv_compact_kernel()[(len(group) * batch * heads,)](
            table, path, past_len, path.shape[0], batch * heads, heads, strides[0], strides[1], strides[2],
            head_dim, ELEMENT=element[dtype], BLOCK=triton.next_power_of_2(head_dim),
        )


_KERNEL = None


def _kv_compact_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def kernel(table_ptr, path_ptr, past_len, num_kept, rows_per_tensor, heads, stride_b, stride_h, stride_t,
                   head_dim, ELEMENT: tl.constexpr, BLOCK: tl.constexpr):
            program = tl.program_id(0)
            tensor = program // rows_per_tensor
            row = program % rows_per_tensor
            cache_ptr = tl.load(table_ptr + tensor).to(tl.pointer_type(ELEMENT))
            base = cache_ptr + (row // heads) * stride_b + (row % heads) * stride_h
            columns = tl.arange(0, BLOCK)
            for j in range(0, num_kept):  # increasing j: a row is read before anything overwrites it
                source = past_len + tl.load(path_ptr + j)
                values = tl.load(base + source * stride_t + columns, mask=columns < head_dim)
                tl.store(base + (past_len + j) * stride_t + columns, values, mask=columns < head_dim)

        _KERNEL = kernel
    return _KERNEL
