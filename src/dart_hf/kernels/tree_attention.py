"""Tree attention for the verify forward: N tree-node queries against [prefix keys, tree keys], where a node sees
the whole prefix and its own ancestors (and itself), given as a packed ancestor bitmask instead of a dense
`[N, prefix + N]` float mask.

Registered in Transformers' `AttentionInterface` as "dart_tree": load a stock model with
`attn_implementation="dart_tree"` and DART's verify step passes the tree (`dart_tree=TreeAttentionMetadata`);
every other forward (prefill, plain decoding) runs causal sdpa. The implementation assumes no padding (DART
strips left padding; do not use it for padded batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tree_mask import ancestor_matrix

BITS_PER_WORD = 32


@dataclass
class TreeAttentionMetadata:
    """past_len: cached positions before the tree; ancestor_bits: `[N, ceil(N / 32)]` int64, bit (j % 32) of word
    j // 32 of row i set when node j is node i or one of its ancestors."""

    past_len: int
    ancestor_bits: torch.Tensor

    @classmethod
    def from_parents(cls, parents: torch.Tensor, past_len: int) -> TreeAttentionMetadata:
        """Packed ancestor bits of the tree given by `parents` `[N]`, after `past_len` cached positions."""
        return cls(past_len, pack_bits(ancestor_matrix(parents)))


def pack_bits(matrix: torch.Tensor) -> torch.Tensor:
    """`[N, M]` bool -> `[N, ceil(M / 32)]` int64 words of 32 bits."""
    rows, columns = matrix.shape
    words = -(-columns // BITS_PER_WORD)
    padded = torch.zeros(rows, words * BITS_PER_WORD, dtype=torch.int64, device=matrix.device)
    padded[:, :columns] = matrix.to(torch.int64)
    weights = torch.ones(BITS_PER_WORD, dtype=torch.int64, device=matrix.device) << torch.arange(
        BITS_PER_WORD, device=matrix.device
    )
    return (padded.view(rows, words, BITS_PER_WORD) * weights).sum(dim=-1)


def unpack_bits(bits: torch.Tensor, columns: int) -> torch.Tensor:
    """Inverse of `pack_bits`: `[R, ceil(C / 32)]` int64 words of 32 bits -> `[R, C]` bool."""
    shifts = torch.arange(BITS_PER_WORD, device=bits.device)
    return ((bits[..., None] >> shifts) & 1).bool().flatten(-2)[..., :columns]


def tree_attention_torch(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree: TreeAttentionMetadata, scaling: float
) -> torch.Tensor:
    """Reference. query `[B, H, N, D]`, key / value `[B, H_kv, P + N, D]` -> `[B, H, N, D]`."""
    num_nodes = query.shape[2]
    allowed = torch.ones(num_nodes, tree.past_len + num_nodes, dtype=torch.bool, device=query.device)
    allowed[:, tree.past_len :] = unpack_bits(tree.ancestor_bits, num_nodes)
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling)


def tree_attention_triton(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree: TreeAttentionMetadata, scaling: float
) -> torch.Tensor:
    """The same in one Triton launch: flash-attention style online softmax over key blocks, the tree part masked
    with the packed bits, grouped-query attention without repeating keys."""
    import triton

    batch, heads, num_nodes, head_dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    output = torch.empty_like(query)
    bits = tree.ancestor_bits.to(query.device).contiguous()
    block_m, block_n = 16, 32
    grid = (triton.cdiv(num_nodes, block_m), batch * heads)
    # float32 inputs: full-precision products, as sdpa computes float32 (Triton's default on NVIDIA GPUs is TF32,
    # 10 mantissa bits, which would let the tree's logits drift from vanilla's); 16-bit keys and values are exact
    # in TF32, and the probabilities are rounded more finely than the 16-bit rounding sdpa gives them
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    _tree_attention_kernel()[grid](
        query, key, value, output, bits, tree.past_len, num_nodes, kv_len, scaling,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *output.stride()[:3],
        bits.stride(0), heads, heads // kv_heads, head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PRECISION=precision,
    )
    return output


_KERNEL = None


def _tree_attention_kernel():
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def kernel(
            q_ptr, k_ptr, v_ptr, o_ptr, bits_ptr, past_len, num_nodes, kv_len, scaling,
            stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
            stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
            bits_stride, heads, groups, head_dim,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
        ):
            block = tl.program_id(0)
            batch_head = tl.program_id(1)
            b = batch_head // heads
            h = batch_head % heads
            kv_h = h // groups
            rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
            dims = tl.arange(0, BLOCK_D)
            row_ok = rows < num_nodes
            dim_ok = dims < head_dim
            q = tl.load(
                q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
            ).to(tl.float32)
            running_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
            running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
            accumulator = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
            for start in range(0, kv_len, BLOCK_N):
                columns = start + tl.arange(0, BLOCK_N)
                column_ok = columns < kv_len
                k = tl.load(
                    k_ptr + b * stride_kb + kv_h * stride_kh + columns[None, :] * stride_kn + dims[:, None],
                    mask=column_ok[None, :] & dim_ok[:, None], other=0.0,
                ).to(tl.float32)
                scores = tl.dot(q, k, input_precision=PRECISION) * scaling  # [M, N]
                node = columns - past_len
                in_tree = node >= 0
                word = tl.load(
                    bits_ptr + rows[:, None] * bits_stride + tl.maximum(node, 0)[None, :] // 32,
                    mask=row_ok[:, None] & in_tree[None, :] & column_ok[None, :], other=0,
                )
                is_ancestor = ((word >> (tl.maximum(node, 0)[None, :] % 32)) & 1) == 1
                allowed = column_ok[None, :] & ((node < 0)[None, :] | is_ancestor)
                scores = tl.where(allowed, scores, float("-inf"))
                new_max = tl.maximum(running_max, tl.max(scores, axis=1))
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                probabilities = tl.exp(scores - safe_max[:, None])
                correction = tl.exp(running_max - safe_max)
                v = tl.load(
                    v_ptr + b * stride_vb + kv_h * stride_vh + columns[:, None] * stride_vn + dims[None, :],
                    mask=column_ok[:, None] & dim_ok[None, :], other=0.0,
                ).to(tl.float32)
                running_sum = running_sum * correction + tl.sum(probabilities, axis=1)
                accumulator = accumulator * correction[:, None] + tl.dot(probabilities, v, input_precision=PRECISION)
                running_max = new_max
            output = accumulator / tl.where(running_sum == 0, 1.0, running_sum)[:, None]
            tl.store(
                o_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + dims[None, :],
                output.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :],
            )

        _KERNEL = kernel
    return _KERNEL


def dart_tree_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """`AttentionInterface` entry ("dart_tree"). query `[B, H, q, D]`, key / value `[B, H_kv, kv, D]` ->
    (`[B, q, H, D]`, None). With `dart_tree` metadata: tree attention; otherwise causal sdpa."""
    from .dispatch import use_triton

    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    tree = kwargs.get("dart_tree")
    if tree is not None:
        attend = tree_attention_triton if use_triton(query.device) else tree_attention_torch
        output = attend(query, key, value, tree, scaling)
    else:
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
        q_len, kv_len = query.shape[2], key.shape[2]
        causal = None
        if attention_mask is not None:
            causal = attention_mask
        elif q_len > 1:
            causal = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=causal, scale=scaling)
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make `attn_implementation="dart_tree"` available to every Transformers model."""
    from transformers import AttentionInterface

    AttentionInterface.register("dart_tree", dart_tree_attention)
