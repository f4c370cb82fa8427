"""Sliding-window attention layers under tree verification, at any length.

A sliding-window cache layer (Transformers' `DynamicSlidingWindowLayer`) keeps only its last `window - 1` keys and
values. A tree forward appends all N nodes at once, so left alone the layer would drop the N oldest keys, which the
accepted path (usually far shorter than the tree) still needs, and compaction could not bring them back. So during
a tree forward those layers keep every key (`keeping_every_key`), their attention gets a mask that enforces the
window by position (`sliding_tree_mask`), and `compact_sliding_layer` keeps the accepted nodes after the layer's
kept prefix and trims back to the window. Memory for those layers stays within the window plus one tree.

Mask layout: models with both kinds of layers (Gemma 2 and 3, GPT-OSS, EXAONE 4, Cohere 2, Qwen2 / Qwen3 with
some layers windowed) take one mask per layer type, `{"full_attention": ..., "sliding_attention": ...}`, in place of
one mask; models whose layers are all windowed (Mistral, Mixtral, Qwen3-MoE, Phi-3 with `sliding_window` set) take
the sliding mask alone. Transformers' own assisted decoding (`dart_chain=True`) rolls those layers back with
`activate_past_recording` and needs none of this.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from . import kernels
from .tree import Tree

# what a sliding-window layer is told its window is while it keeps every key of a tree forward
WHOLE = 1 << 62


def sliding_layers(cache: Cache) -> list[DynamicSlidingWindowLayer]:
    """The cache's sliding-window layers, in layer order."""
    return [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]


def check_supported(model: PreTrainedModel, cache: Cache) -> None:
    """Raise a ValueError naming the reason where a target's sliding-window layers cannot be verified exactly at any
    length: several window sizes (one sliding mask serves them all), or a model mixing full and windowed layers
    whose forward does not take a mask per layer type."""
    layers = sliding_layers(cache)
    if not layers:
        return
    windows = {layer.sliding_window for layer in layers}
    if len(windows) > 1:
        raise ValueError(
            f"The target's sliding-window layers use several windows ({sorted(windows)}); DART builds one "
            "sliding-window tree mask for all of them, so it supports one window size per model."
        )
    if len(layers) < len(cache.layers) and not takes_mask_per_layer_type(model):
        raise ValueError(
            f"{type(model).__name__} mixes full-attention and sliding-window layers but its forward takes one "
            "attention mask for both, so a tree cannot be given each layer type's mask. DART supports mixed "
            "models whose forward accepts {'full_attention': mask, 'sliding_attention': mask} (Gemma 2 and 3, "
            "Qwen2, Qwen3, GPT-OSS, EXAONE 4, Cohere 2)."
        )


def takes_mask_per_layer_type(model: PreTrainedModel) -> bool:
    """Whether the model's decoder forward accepts a dict of masks keyed by layer type (Transformers 5.x names it
    `causal_mask_mapping` in every model that does)."""
    return _forward_takes_mask_mapping(type(model.base_model))


@functools.cache
def _forward_takes_mask_mapping(model_class: type) -> bool:
    """Read once per class: every `generate` call checks its target."""
    try:
        return "causal_mask_mapping" in inspect.getsource(model_class.forward)
    except (OSError, TypeError):
        return False


@contextlib.contextmanager
def keeping_every_key(cache: Cache) -> Iterator[None]:
    """Within the block, the cache's sliding-window layers keep every key and value appended (a tree's rows
    included) instead of trimming to their window; `compact_sliding_layer` trims them afterwards."""
    layers = sliding_layers(cache)
    windows = [layer.sliding_window for layer in layers]
    for layer in layers:
        layer.sliding_window = WHOLE
    try:
        yield
    finally:
        for layer, window in zip(layers, windows):
            layer.sliding_window = window


def sliding_tree_mask(
    tree: Tree, past_len: int, kept: int, window: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Additive float mask `[1, 1, N, kept + N]` of a tree forward for a sliding-window layer that holds the last
    `kept` of `past_len` cached positions: the tree mask (each node sees the kept prefix, its ancestors and itself)
    with every key `window` or more positions behind the node's own position blocked, as Transformers' sliding
    window does (a query at position q sees keys at positions k with q - k < window)."""
    depths = tree.depths.to(device)
    mask = kernels.tree_mask(tree.parents.to(device), kept, dtype)
    query_positions = past_len + depths
    key_positions = torch.cat([torch.arange(past_len - kept, past_len, device=device), past_len + depths])
    too_far = (query_positions[:, None] - key_positions[None, :]) >= window
    return mask.masked_fill(too_far.view(1, 1, *too_far.shape), torch.finfo(dtype).min)


def attention_masks(
    tree_mask: torch.Tensor, tree: Tree, cache: Cache, past_len: int
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask argument of a tree forward over `cache` (holding `past_len` positions), from the tree's
    mask over the whole prefix `[1, 1, N, past_len + N]`: that mask for a model without sliding-window layers;
    with them, the sliding mask alone when every layer is windowed, else both keyed by layer type."""
    layers = sliding_layers(cache)
    if not layers:
        return tree_mask
    kept = layers[0].keys.shape[-2] if layers[0].is_initialized else 0
    sliding = sliding_tree_mask(tree, past_len, kept, layers[0].sliding_window, tree_mask.dtype, tree_mask.device)
    if len(layers) == len(cache.layers):
        return sliding
    return {"full_attention": tree_mask, "sliding_attention": sliding}


def compact_sliding_layer(layer: DynamicSlidingWindowLayer, past_len: int, path: list[int]) -> None:
    """After a tree forward under `keeping_every_key`: keep the layer's prefix and the tree nodes in `path`
    (increasing indices), then only the last `window - 1` positions, as the layer itself would have."""
    rows = layer.cumulative_length - past_len  # the tree forward's rows, the last ones the layer holds
    kept = layer.keys.shape[-2] - rows
    index = torch.cat([torch.arange(kept), kept + torch.tensor(path, dtype=torch.long)]).to(layer.keys.device)
    start = max(len(index) - (layer.sliding_window - 1), 0)
    index = index[start:]
    layer.keys = layer.keys.index_select(-2, index)
    layer.values = layer.values.index_select(-2, index)
    layer.cumulative_length = past_len + len(path)
