"""Tree verification: one forward over a tree equals running each root-to-node path; compaction; acceptance."""

import copy

import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList

from _helpers import tiny_target
from dart_hf.tree import Tree
from dart_hf.verify import accept, compact_cache, forward_tree, tree_attention_mask

FEATURE_LAYERS = [2, 3, 5]


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def random_tree(size: int, generator: torch.Generator) -> Tree:
    parents = [-1] + [int(torch.randint(0, node, (1,), generator=generator)) for node in range(1, size)]
    return Tree.from_parents(torch.randint(0, 128, (size,), generator=generator), parents)


def prefilled(target, prompt):
    cache = DynamicCache(config=target.config)
    target(input_ids=prompt, cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("seed", range(4))
def test_tree_node_logits_equal_sequential_path(arch, attn, seed):
    generator = torch.Generator().manual_seed(seed)
    target = tiny_target(arch, attn=attn, seed=seed)
    prompt = torch.randint(0, 128, (1, int(torch.randint(1, 30, (1,), generator=generator))), generator=generator)
    tree = random_tree(int(torch.randint(2, 61, (1,), generator=generator)), generator)
    cache = prefilled(target, prompt)
    base_cache = copy.deepcopy(cache)
    logits, features = forward_tree(target, tree, cache, FEATURE_LAYERS)
    assert logits.shape == (len(tree), 128) and features.shape == (len(tree), 3 * 32)
    for node in range(len(tree)):
        path = tree.path_to(node)
        path_cache = copy.deepcopy(base_cache)
        out = target(
            input_ids=tree.tokens[path].unsqueeze(0), cache=path_cache, use_cache=True,
            output_hidden_states=FEATURE_LAYERS,
        )
        torch.testing.assert_close(logits[node], out.logits[0, -1], rtol=0, atol=1e-5)
        path_features = torch.cat([out.hidden_states[i][0, -1] for i in FEATURE_LAYERS])
        torch.testing.assert_close(features[node], path_features, rtol=0, atol=1e-5)


# a chain's path and a path that leaves the node order after two nodes: rows already in place are not copied
ORDERED_TREE = Tree.from_parents([5, 6, 7, 8, 9, 10], [-1, 0, 1, 2, 1, 4])


@pytest.mark.parametrize("seed, path", [*((seed, None) for seed in range(4)), (0, [0, 1, 2, 3]), (1, [0, 1, 4, 5])])
def test_compaction_keeps_exactly_the_accepted_path(seed, path):
    generator = torch.Generator().manual_seed(seed)
    target = tiny_target("llama", dtype=torch.float64, seed=seed)
    prompt = torch.randint(0, 128, (1, 9), generator=generator)
    tree = random_tree(40, generator) if path is None else ORDERED_TREE
    cache = prefilled(target, prompt)
    reference = copy.deepcopy(cache)
    forward_tree(target, tree, cache, FEATURE_LAYERS)
    if path is None:
        path = tree.path_to(int(torch.randint(0, len(tree), (1,), generator=generator)))
    compact_cache(cache, prompt.shape[1], path)
    target(input_ids=tree.tokens[path].unsqueeze(0), cache=reference, use_cache=True)
    assert cache.get_seq_length() == reference.get_seq_length() == prompt.shape[1] + len(path)
    for ours, theirs in zip(cache.layers, reference.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=1e-12)


def test_tree_mask_is_float_in_model_dtype():
    tree = Tree.from_parents([1, 2, 3], [-1, 0, 0])
    mask = tree_attention_mask(tree, past_len=4, dtype=torch.float16, device=torch.device("cpu"))
    assert mask.dtype == torch.float16 and mask.shape == (1, 1, 3, 7)
    assert (mask[0, 0, :, :4] == 0).all()
    blocked = mask[0, 0, :, 4:] != 0
    assert blocked.tolist() == [[False, True, True], [False, False, True], [False, True, False]]


def test_greedy_acceptance_walks_the_matching_branch():
    # root -> {a=5: node1, b=6: node2}; node2 -> {7: node3}. Target argmax: root 6, node2 7, node3 9 (bonus).
    tree = Tree.from_parents([1, 5, 6, 7], [-1, 0, 0, 2])
    logits = torch.zeros(4, 10)
    logits[0, 6] = logits[2, 7] = logits[3, 9] = logits[1, 3] = 1.0
    result = accept(tree, logits, torch.tensor([[1]]), LogitsProcessorList())
    assert result.path == [0, 2, 3] and result.tokens == [6, 7, 9]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_weight_major_forward_gives_the_same_logits_features_and_cache(arch):
    """`forward_tree(..., weight_major=True)` (`dart_hf.weight_major`) takes the same products in another order:
    the nodes' logits and features and the cache rows agree up to rounding, and the greedy picks are the same."""
    generator = torch.Generator().manual_seed(5)
    target = tiny_target(arch, seed=5)
    tree = random_tree(6, generator)
    cache = prefilled(target, torch.randint(0, 128, (1, 10), generator=generator))
    other_cache = copy.deepcopy(cache)
    logits, features = forward_tree(target, tree, cache, FEATURE_LAYERS)
    major_logits, major_features = forward_tree(target, tree, other_cache, FEATURE_LAYERS, weight_major=True)
    torch.testing.assert_close(major_logits, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(major_features, features, rtol=0, atol=1e-5)
    assert torch.equal(major_logits.argmax(-1), logits.argmax(-1))
    for layer, other_layer in zip(cache.layers, other_cache.layers):
        torch.testing.assert_close(other_layer.keys, layer.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(other_layer.values, layer.values, rtol=0, atol=1e-5)


def test_padding_rows_change_neither_the_nodes_outputs_nor_the_compacted_cache():
    """A forward padded to more rows (where a larger matmul is faster) gives the nodes the same logits and
    features, and after compaction the cache holds exactly what the unpadded forward's does."""
    generator = torch.Generator().manual_seed(3)
    target = tiny_target("llama", seed=3)
    tree = random_tree(4, generator)
    cache = prefilled(target, torch.randint(0, 128, (1, 12), generator=generator))
    padded_cache = copy.deepcopy(cache)
    logits, features = forward_tree(target, tree, cache, FEATURE_LAYERS)
    padded_logits, padded_features = forward_tree(target, tree, padded_cache, FEATURE_LAYERS, rows=9)
    assert padded_logits.shape == logits.shape and padded_features.shape == features.shape
    torch.testing.assert_close(padded_logits, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(padded_features, features, rtol=0, atol=1e-5)
    assert padded_cache.get_seq_length() == 12 + 9
    path = tree.path_to(len(tree) - 1)
    compact_cache(cache, 12, path)
    compact_cache(padded_cache, 12, path)
    for layer, padded_layer in zip(cache.layers, padded_cache.layers):
        torch.testing.assert_close(padded_layer.keys, layer.keys, rtol=0, atol=1e-5)
        torch.testing.assert_close(padded_layer.values, layer.values, rtol=0, atol=1e-5)
