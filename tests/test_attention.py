"""The verify forward's attention on a CPU: sdpa reads grouped key/value heads in place, with the same logits."""

import contextlib
import copy

import pytest
import torch
import transformers.integrations.sdpa_attention as transformers_sdpa
from transformers import DynamicCache

from _helpers import tiny_target
import dart_hf.verify as verify
from dart_hf.attention import GROUPED_QUERY_SDPA, grouped_query_sdpa
from dart_hf.tree import Tree
from dart_hf.verify import forward_tree

FEATURE_LAYERS = [2, 3, 5]
TREE = Tree.from_parents([5, 6, 7, 8, 9, 10, 11], [-1, 0, 1, 0, 3, 3, 5])


def prefilled(target, length: int = 40) -> DynamicCache:
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=torch.arange(1, length + 1).unsqueeze(0), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tree_forward_never_copies_the_cache_per_query_head(arch, monkeypatch):
    """The tiny targets have 4 query heads over 2 key/value heads: Transformers' sdpa would repeat_kv."""
    target = tiny_target(arch, dtype=torch.float64)
    cache = prefilled(target)
    reference_cache = copy.deepcopy(cache)
    with monkeypatch.context() as patch:  # Transformers' own sdpa for the reference
        patch.setattr(verify, "grouped_query_sdpa", lambda model: contextlib.nullcontext())
        reference_logits, reference_features = forward_tree(target, TREE, reference_cache, FEATURE_LAYERS)

    def no_copy(*args, **kwargs):
        raise AssertionError("the tree forward copied the cached keys and values per query head")

    monkeypatch.setattr(transformers_sdpa, "repeat_kv", no_copy)
    logits, features = forward_tree(target, TREE, cache, FEATURE_LAYERS)
    torch.testing.assert_close(logits, reference_logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(features, reference_features, rtol=0, atol=1e-10)
    for layer, reference_layer in zip(cache.layers, reference_cache.layers):
        torch.testing.assert_close(layer.keys, reference_layer.keys, rtol=0, atol=1e-10)
    assert target.config._attn_implementation == "sdpa"


def test_causal_forwards_inside_the_block_equal_transformers_sdpa():
    """A prompt's forward (causal, no 4D mask) routed through the block gives Transformers' sdpa logits."""
    target = tiny_target("llama", dtype=torch.float64)
    prompt = torch.arange(3, 30).unsqueeze(0)
    with torch.no_grad():
        reference = target(input_ids=prompt).logits
        with grouped_query_sdpa(target):
            assert target.config._attn_implementation == GROUPED_QUERY_SDPA
            routed = target(input_ids=prompt).logits
    torch.testing.assert_close(routed, reference, rtol=0, atol=1e-10)


def test_the_implementation_comes_back_after_an_error():
    target = tiny_target("llama")
    with pytest.raises(RuntimeError, match="inside"):
        with grouped_query_sdpa(target):
            raise RuntimeError("inside")
    assert target.config._attn_implementation == "sdpa"


def test_other_implementations_are_left_alone():
    target = tiny_target("llama", attn="eager")
    with grouped_query_sdpa(target):
        assert target.config._attn_implementation == "eager"
