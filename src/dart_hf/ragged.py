"""A batch's KV cache when its rows accept different numbers of tokens: one cache, holes masked per row.

Every row of a batch appends the same number of columns to the cache per forward (a tree padded to the batch's
largest, or one token), then keeps only its own accepted nodes: they move to the front of the step's columns and
the columns after them become holes of that row. `valid` `[B, L]` says which columns hold a row's tokens; the
attention mask blocks the rest, and each row's positions count its own valid columns, so a row attends to exactly
the tokens it would alone. Nothing is realigned per step (no copy of the whole cache); holes cost only attention
over masked columns. Columns that no row uses any more (after rows leave the batch) are dropped.

Sliding-window layers keep every key for the whole call (their window is enforced by position in their mask),
since with holes "the last window - 1 columns" is not a row's window.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from .attention import grouped_query_sdpa
from .features import forward_with_features
from .kernels.tree_mask import ancestor_matrix
from .tree import Tree


def padded_trees(trees: list[Tree]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids `[B, N]` and ancestor matrices `[B, N, N]` of `trees`, each padded to the largest tree's N nodes
    with extra children of its root (they carry the root's token and nobody attends to them)."""
    size = max(len(tree) for tree in trees)
    tokens, ancestors = [], []
    for tree in trees:
        extra = size - len(tree)
        tokens.append(torch.cat([tree.tokens, tree.tokens[:1].expand(extra)]))
        parents = torch.cat([tree.parents, torch.zeros(extra, dtype=torch.long)])
        ancestors.append(ancestor_matrix(parents))
    return torch.stack(tokens), torch.stack(ancestors)


def padded_depths(trees: list[Tree]) -> torch.Tensor:
    """Node depths `[B, N]` of `trees` padded as `padded_trees` pads them (extra nodes at depth 1)."""
    size = max(len(tree) for tree in trees)
    return torch.stack([torch.cat([tree.depths, torch.ones(size - len(tree), dtype=torch.long)]) for tree in trees])


def key_positions(valid: torch.Tensor) -> torch.Tensor:
    """The position of each valid column in its row `[B, L]` (holes get their row's last position before them)."""
    return valid.long().cumsum(-1) - 1


def rows_mask(valid: torch.Tensor, ancestors: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive float mask `[B, 1, N, L + N]`: node i of row b sees row b's valid columns and its own ancestors."""
    visible = torch.cat([valid[:, None, :].expand(-1, ancestors.shape[1], -1), ancestors], dim=-1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=valid.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min).unsqueeze(1)


def window_mask(
    mask: torch.Tensor, valid: torch.Tensor, query_positions: torch.Tensor, node_positions: torch.Tensor, window: int
) -> torch.Tensor:
    """`mask` `[B, 1, N, L + N]` with every key `window` or more positions behind its query blocked, as a sliding
    window attends (a query at position q sees keys at positions k with q - k < window). query_positions and
    node_positions `[B, N]`: the positions of the new rows (the same tensor for a tree forward)."""
    keys = torch.cat([key_positions(valid), node_positions], dim=-1)  # [B, L + N]
    too_far = (query_positions[:, :, None] - keys[:, None, :]) >= window
    return mask.masked_fill(too_far.unsqueeze(1), torch.finfo(mask.dtype).min)


def sliding_windows(cache: Cache) -> tuple[int | None, bool]:
    """(the window of the cache's sliding-window layers or None, whether every layer is windowed), read before
    `sliding_window.keeping_every_key` lifts their windows."""
    windows = {layer.sliding_window for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)}
    if len(windows) > 1:
        raise ValueError(f"DART supports one sliding-window size per model, got {sorted(windows)}.")
    every = all(isinstance(layer, DynamicSlidingWindowLayer) for layer in cache.layers)
    return (windows.pop() if windows else None), every


def attention_masks(
    mask: torch.Tensor, valid: torch.Tensor, positions: torch.Tensor, windows: tuple[int | None, bool]
) -> torch.Tensor | dict[str, torch.Tensor]:
    """The attention mask argument of a forward over new rows at `positions` `[B, N]`: `mask` for a model without
    sliding-window layers; with them (`windows`, from `sliding_windows`), the windowed mask alone when every layer
    is windowed, else both by layer type."""
    window, every_layer = windows
    if window is None:
        return mask
    sliding = window_mask(mask, valid, positions, positions, window)
    return sliding if every_layer else {"full_attention": mask, "sliding_attention": sliding}


@torch.no_grad()
def forward_rows(
    target: PreTrainedModel,
    tokens: torch.Tensor,
    ancestors: torch.Tensor,
    depths: torch.Tensor,
    valid: torch.Tensor,
    cache: Cache,
    windows: tuple[int | None, bool],
    feature_layers: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over each row's tree (tokens `[B, N]`, ancestors `[B, N, N]`, depths `[B, N]`) after its
    valid cache columns `[B, L]`, appending N columns to `cache` (`windows`: `sliding_windows(cache)`). Returns
    logits `[B, N, V]` and features `[B, N, 3H]`."""
    device = target.device
    positions = (valid.sum(-1, keepdim=True) + depths.to(device)).to(device)
    mask = rows_mask(valid, ancestors.to(device), target.dtype)
    with grouped_query_sdpa(target):
        outputs, features = forward_with_features(
            target, feature_layers, input_ids=tokens.to(device), position_ids=positions, cache=cache,
            use_cache=True, attention_mask=attention_masks(mask, valid, positions, windows),
        )
    return outputs.logits, features


def keep_paths(cache: Cache, past_len: int, paths: list[list[int]]) -> torch.Tensor:
    """After a forward that appended N columns to `past_len` ones: move each row's accepted nodes (`paths[b]`,
    increasing node indices) to the front of those columns and cut the columns after the longest path. Returns
    which of the kept new columns hold a row's token `[B, K]`."""
    longest = max(len(path) for path in paths)
    device = cache.layers[0].keys.device
    index = torch.tensor([path + [path[-1]] * (longest - len(path)) for path in paths], device=device)  # [B, K]
    if any(path != list(range(len(path))) for path in paths):
        for layer in cache.layers:
            for name in ("keys", "values"):
                states = getattr(layer, name)
                gather_index = index[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
                states[:, :, past_len : past_len + longest] = states[:, :, past_len:].gather(2, gather_index)
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, : past_len + longest]
        layer.values = layer.values[:, :, : past_len + longest]
        _set_length(layer)
    lengths = torch.tensor([len(path) for path in paths], device=device)
    return torch.arange(longest, device=device)[None, :] < lengths[:, None]


def select(cache: Cache, valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep only `rows` (indices into the batch) of `cache`, then only the columns that one of them uses. Returns
    their `valid` `[B', L']`."""
    valid = valid.index_select(0, rows)
    columns = valid.any(0).nonzero().squeeze(-1)
    every_column = columns.numel() == valid.shape[1]
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        for name in ("keys", "values"):
            states = getattr(layer, name).index_select(0, rows.to(layer.keys.device))
            setattr(layer, name, states if every_column else states.index_select(2, columns.to(states.device)))
        _set_length(layer)
    return valid if every_column else valid[:, columns]


def truncate(cache: Cache, length: int) -> None:
    """Cut every layer of `cache` back to its first `length` columns."""
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]
        _set_length(layer)


def _set_length(layer) -> None:
    if isinstance(layer, DynamicSlidingWindowLayer):
        layer.cumulative_length = layer.keys.shape[-2]
