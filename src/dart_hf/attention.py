"""How the verify forward attends on a CPU: sdpa over the tree mask, the key/value head groups handled inside sdpa.

Transformers' "sdpa" attention, given a mask and more than one query row, copies every cached key and value once
per query head of its group (`repeat_kv`) before calling sdpa. A one-token decoding step skips that copy, but a
tree forward pays it in every layer, more the longer the context (measured with `benchmarks/bench_tree_forward.py`:
`docs/decoding.md`, "Measurements behind the code"). torch's sdpa takes grouped key/value heads itself
(`enable_gqa=True`) and its CPU kernel reads them in place, mask included: the path of one sequence. For a batch,
sdpa's `enable_gqa` with a mask is slow (several times a one-token step's attention at 16 rows), so there each key/value
head's group of query heads is folded into one block of query rows (`[B, H_kv, groups * q, D]`, the mask repeated
per group), as Transformers does for one-token steps: every cached key and value is read once, in place.

`grouped_query_sdpa(target)` routes the attention of the forwards run inside it through that call instead, for a
target whose attention implementation is "sdpa" on a device where `reads_grouped_heads_in_place`. On CUDA, sdpa
with a mask and `enable_gqa` falls back to its math kernel (Transformers copies for that reason), so there nothing
changes; the Triton tree attention (`attn_implementation="dart_tree"`) is the path for GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_QUERY_SDPA = "dart_grouped_query_sdpa"


def reads_grouped_heads_in_place(device: torch.device) -> bool:
    """Whether masked sdpa with `enable_gqa` beats copying the key/value heads per query head on `device`: on a
    CPU, yes; on CUDA it would fall back to the math kernel."""
    return device.type == "cpu"


def grouped_query_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """`AttentionInterface` entry. query `[B, H, q, D]`, key / value `[B, H_kv, kv, D]` (H a multiple of H_kv),
    attention_mask: additive or bool `[B, 1, q, kv]`, or None for causal attention -> (`[B, q, H, D]`, None)."""
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise ValueError(
            "DART's grouped-query sdpa does not handle softcapping, attention sinks or position biases; load the "
            "target with attn_implementation='eager'."
        )
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = is_causal and attention_mask is None and query.shape[2] > 1
    batch, heads, rows, head_dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1 and batch > 1 and not is_causal and (attention_mask is None or attention_mask.shape[1] == 1):
        # a batch: each key/value head's query heads as one block of rows, so sdpa reads every key once with one
        # small matmul per key/value head, instead of broadcasting over the groups (its slow path with a mask)
        folded = query.reshape(batch, key.shape[1], groups * rows, head_dim)
        mask = attention_mask.repeat(1, 1, groups, 1) if attention_mask is not None else None
        output = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return output.view(batch, heads, rows, head_dim).transpose(1, 2).contiguous(), None
    output = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=groups > 1,
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make the attention above (and sdpa's mask) available to Transformers under `GROUPED_QUERY_SDPA`."""
    AttentionInterface.register(GROUPED_QUERY_SDPA, grouped_query_sdpa_attention)
    AttentionMaskInterface.register(GROUPED_QUERY_SDPA, sdpa_mask)


@contextmanager
def grouped_query_sdpa(target: PreTrainedModel) -> Iterator[None]:
    """Within this block, the forwards of a `target` whose configs name "sdpa" attend through
    `grouped_query_sdpa_attention` (where `reads_grouped_heads_in_place`); every config gets its own implementation
    back on exit, also on an error."""
    configs = [config for config in _configs(target.config) if config._attn_implementation == "sdpa"]
    if not reads_grouped_heads_in_place(target.device) or not configs:
        yield
        return
    for config in configs:
        config._attn_implementation_internal = GROUPED_QUERY_SDPA  # the internal field: no recursion into sub-configs
    try:
        yield
    finally:
        for config in configs:
            config._attn_implementation_internal = "sdpa"


def _configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    """`config` and its sub-configs, recursively (a multimodal model's text config is where its decoder reads)."""
    found = [config]
    for name in getattr(config, "sub_configs", {}):
        sub_config = getattr(config, name, None)
        if isinstance(sub_config, PretrainedConfig):
            found += _configs(sub_config)
    return found


register()
