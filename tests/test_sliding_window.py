"""Sliding-window targets at any length: tiny random targets of every architecture with windowed layers, a window of
16, far longer generations, token-identical to vanilla (trees larger than the window included); sampling past the
window follows the target's exact law; the mask and the compaction on their own; the refusals that remain."""

from collections import Counter

import pytest
import torch
import transformers
from _helpers import VOCAB_SIZE, prompts
from test_sampling import SAMPLES, SETTINGS, chi_square, exact_joint
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

import dart_hf.sliding_window as sliding_window
from dart_hf import DartDraftModel
from dart_hf.generation import _check_sliding_window
from dart_hf.tree import Tree
from dart_hf.verify import compact_cache, forward_tree

WINDOW = 16
# config class and the fields that give it windowed layers; the comment: its layers, S windowed and F full
ARCHITECTURES = {
    "gemma2": ("Gemma2Config", dict(sliding_window=WINDOW)),  # SFSFSF
    "gemma3": ("Gemma3TextConfig", dict(sliding_window=WINDOW)),  # SSSSSF
    "mistral": ("MistralConfig", dict(sliding_window=WINDOW)),  # SSSSSS
    "mixtral": ("MixtralConfig", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),  # FFSSSS
    "qwen3": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(
        use_sliding_window=True, sliding_window=WINDOW, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
    )),
    "gpt_oss": ("GptOssConfig", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2)),  # SFSFSF
    "exaone4": ("Exaone4Config", dict(sliding_window=WINDOW, sliding_window_pattern=3)),  # SSFSSF
    "cohere2": ("Cohere2Config", dict(sliding_window=WINDOW)),  # SSSFSS
    "phi3": ("Phi3Config", dict(sliding_window=WINDOW)),
}


def windowed_target(arch: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A 6-layer random target of `arch` whose windowed layers attend to the last WINDOW positions."""
    class_name, window_fields = ARCHITECTURES[arch]
    fields = dict(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, eos_token_id=None, bos_token_id=None,
        pad_token_id=0, **window_fields,
    )
    fields.update(overrides)
    torch.manual_seed(seed)
    config = getattr(transformers, class_name)(**fields)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()  # sdpa where it has it (not Gemma 2)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_greedy_is_token_identical_far_past_the_window(arch):
    """200 new tokens with a window of 16, every step a 61-node tree (larger than the window), then the adaptive
    default: identical to vanilla; the windowed layers end holding the window, not the sequence."""
    target = windowed_target(arch)
    draft = DartDraftModel.from_target(target)
    verified_past_window = 0
    for prompt in prompts(3, seed=31, min_len=4, max_len=30):
        expected = target.generate(prompt, max_new_tokens=200, do_sample=False)
        for options in ({"adaptive": False}, {}):
            output = target.generate(prompt, max_new_tokens=200, assistant_model=draft, tree_options=options,
                                     return_dict_in_generate=True)
            assert torch.equal(output.sequences, expected), (arch, options)
            windowed = [layer for layer in output.cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
            assert windowed and all(layer.keys.shape[-2] == WINDOW - 1 for layer in windowed)
        verified_past_window += draft.stats.verify_steps
    assert verified_past_window > 0


@pytest.mark.parametrize("arch", ["gemma3", "mistral"])
def test_chain_mode_is_token_identical_past_the_window(arch):
    target = windowed_target(arch, seed=1)
    draft = DartDraftModel.from_target(target)
    for prompt in prompts(2, seed=32):
        expected = target.generate(prompt, max_new_tokens=120, do_sample=False)
        assert torch.equal(target.generate(prompt, max_new_tokens=120, assistant_model=draft, dart_chain=True),
                           expected)


def test_sampling_past_the_window_follows_the_exact_law():
    """A peaked Qwen3 with full and windowed layers (window 8), a 24-token prompt: the first three sampled tokens
    after it, drafted as 61-node deterministic trees, follow the target's exact joint distribution."""
    vocab = 8
    target = windowed_target("qwen3", seed=3, vocab_size=vocab, hidden_size=16, intermediate_size=32,
                             num_attention_heads=2, num_key_value_heads=1, sliding_window=8)
    with torch.no_grad():
        target.lm_head.weight.mul_(15)  # random init is almost uniform; make the distributions informative
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    prompt = torch.randint(1, vocab, (1, 24), generator=torch.Generator().manual_seed(4))  # 0 is padding
    kwargs, processors = SETTINGS["temperature"]
    options = {"adaptive": False, "sample_drafts": 0}
    torch.manual_seed(0)
    observed, accepted = Counter(), []
    for _ in range(SAMPLES):
        output = target.generate(prompt, max_new_tokens=3, do_sample=True, assistant_model=draft,
                                 tree_options=options, **kwargs)
        observed[tuple(output[0, prompt.shape[1]:].tolist())] += 1
        accepted += draft.stats.accepted_lengths
    assert sum(length >= 2 for length in accepted) >= SAMPLES // 10  # drafted tokens were accepted, often
    statistic, critical = chi_square(observed, exact_joint(target, processors, prompt), SAMPLES)
    assert statistic < critical, (statistic, critical)


def test_the_sliding_mask_blocks_keys_a_window_or_more_behind():
    tree = Tree.from_parents(torch.tensor([3, 4, 5, 6, 7]), [-1, 0, 1, 1, 3])  # depths 0 1 2 2 3
    past_len, kept, window = 40, 5, 6
    mask = sliding_window.sliding_tree_mask(tree, past_len, kept, window, torch.float32, torch.device("cpu"))
    visible = mask[0, 0] == 0
    assert visible.shape == (5, kept + 5)
    depths = tree.depths.tolist()
    for node, depth in enumerate(depths):
        for key in range(kept):  # prefix key at position past_len - kept + key
            assert visible[node, key] == (past_len + depth - (past_len - kept + key) < window)
    ancestors = [{0}, {0, 1}, {0, 1, 2}, {0, 1, 3}, {0, 1, 3, 4}]
    for node, seen in enumerate(ancestors):
        assert {i for i in range(5) if visible[node, kept + i]} == seen | {node}


def test_compaction_keeps_the_accepted_path_and_the_window():
    """A windowed layer of a mixed model after a tree forward past the window: compaction leaves exactly what a
    plain forward over the accepted tokens would have cached."""
    target = windowed_target("gemma3", seed=5)
    context = torch.randint(1, VOCAB_SIZE, (1, 40), generator=torch.Generator().manual_seed(6))
    tree = Tree.from_parents(torch.tensor([7, 8, 9, 10, 11, 12]), [-1, 0, 0, 1, 3, 2])
    path = [0, 1, 3]
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=context, cache=cache, use_cache=True)
    forward_tree(target, tree, cache, [1, 2, 3])
    compact_cache(cache, 40, path)
    reference = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=torch.cat([context, tree.tokens[path].unsqueeze(0)], 1), cache=reference, use_cache=True)
    for layer, expected in zip(cache.layers, reference.layers):
        assert layer.keys.shape == expected.keys.shape and cache.get_seq_length() == 43
        torch.testing.assert_close(layer.keys, expected.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.values, expected.values, rtol=1e-5, atol=1e-5)


def test_what_cannot_be_verified_exactly_is_refused_with_the_reason(monkeypatch):
    target = windowed_target("gemma3")
    cache = DynamicCache(config=target.config)
    assert sliding_window.takes_mask_per_layer_type(target)
    sliding_window.check_supported(target, cache)
    cache.layers[0] = DynamicSlidingWindowLayer(sliding_window=8)
    with pytest.raises(ValueError, match="several windows \\(\\[8, 16\\]\\)"):
        sliding_window.check_supported(target, cache)
    monkeypatch.setattr(sliding_window, "takes_mask_per_layer_type", lambda model: False)
    with pytest.raises(ValueError, match="mixes full-attention and sliding-window layers"):
        sliding_window.check_supported(target, DynamicCache(config=target.config))
    monkeypatch.undo()
    target.config._attn_implementation = "dart_tree"  # the Triton kernel has no window: only inside it
    _check_sliding_window(target, DynamicCache(config=target.config), max_length=8, tree_budget=4)
    with pytest.raises(ValueError, match="has no window"):
        _check_sliding_window(target, DynamicCache(config=target.config), max_length=200, tree_budget=60)
