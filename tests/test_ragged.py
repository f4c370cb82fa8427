"""The ragged batch cache on its own: padded trees, per-row masks and positions, keeping each row's path, dropping
rows and the columns nobody uses, the sliding window by position."""

import torch
from transformers import DynamicCache

from dart_hf import ragged
from dart_hf.tree import Tree

MIN = torch.finfo(torch.float32).min


def filled_cache(batch: int, length: int) -> DynamicCache:
    """A one-layer cache whose key at (row b, column c) holds 100 * b + c in every entry."""
    cache = DynamicCache()
    values = (100 * torch.arange(batch)[:, None] + torch.arange(length)[None, :]).float()
    states = values[:, None, :, None].expand(batch, 2, length, 4).contiguous()
    cache.update(states, states.clone(), 0)
    return cache


def test_trees_are_padded_with_children_of_the_root():
    small = Tree.from_parents(torch.tensor([5, 6]), [-1, 0])
    large = Tree.from_parents(torch.tensor([7, 8, 9, 10]), [-1, 0, 1, 1])
    tokens, ancestors = ragged.padded_trees([small, large])
    assert tokens.tolist() == [[5, 6, 5, 5], [7, 8, 9, 10]]
    assert ancestors[0].tolist() == [[True, False, False, False], [True, True, False, False],
                                     [True, False, True, False], [True, False, False, True]]
    assert torch.equal(ancestors[1], large.ancestor_mask())
    assert ragged.padded_depths([small, large]).tolist() == [[0, 1, 1, 1], [0, 1, 2, 2]]


def test_each_row_sees_its_valid_columns_and_its_ancestors():
    valid = torch.tensor([[False, True, True], [True, False, True]])
    ancestors = torch.tensor([[[True, False], [True, True]], [[True, False], [False, True]]])
    mask = ragged.rows_mask(valid, ancestors, torch.float32)
    assert mask.shape == (2, 1, 2, 5)
    assert (mask[0, 0] == 0).tolist() == [[False, True, True, True, False], [False, True, True, True, True]]
    assert (mask[1, 0] == 0).tolist() == [[True, False, True, True, False], [True, False, True, False, True]]
    assert set(mask.unique().tolist()) == {0.0, MIN}


def test_the_window_counts_positions_not_columns():
    """A row with a hole: its keys' positions skip the hole, so the window reaches one column further back."""
    valid = torch.tensor([[True, True, False, True]])  # positions 0, 1, -, 2
    positions = torch.tensor([[3]])
    mask = ragged.rows_mask(valid, torch.ones(1, 1, 1, dtype=torch.bool), torch.float32)
    windowed = ragged.window_mask(mask, valid, positions, positions, window=3)
    assert (windowed[0, 0, 0] == 0).tolist() == [False, True, False, True, True]  # positions 1, 2, 3 seen


def test_keep_paths_moves_each_rows_path_to_the_front_and_cuts_after_the_longest():
    cache = filled_cache(2, 6)  # 2 cached columns, then a 4-node tree per row
    new_valid = ragged.keep_paths(cache, 2, [[0, 2, 3], [0]])
    keys = cache.layers[0].keys[:, 0, :, 0]
    assert keys.tolist() == [[0, 1, 2, 4, 5], [100, 101, 102, 102, 102]]
    assert new_valid.tolist() == [[True, True, True], [True, False, False]]


def test_select_drops_rows_and_the_columns_no_remaining_row_uses():
    cache = filled_cache(3, 4)
    valid = torch.tensor([[True, True, False, False], [False, True, True, True], [True, True, True, False]])
    kept = ragged.select(cache, valid, torch.tensor([0, 2]))
    assert kept.tolist() == [[True, True, False], [True, True, True]]
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[0, 1, 2], [200, 201, 202]]
