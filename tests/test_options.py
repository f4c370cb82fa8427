"""DecodingOptions: one place for the tree and loop defaults, the order overrides apply in, every check."""

import dataclasses

import pytest
import torch

from _helpers import tiny_target
from dart_hf import DartConfig, DartDraftModel, DecodingOptions
from dart_hf.options import check_generation_config, strip_left_padding
from dart_hf.tree import BeamSearchTreePolicy, SampledChainPolicy, TopKTreePolicy
from transformers import GenerationConfig


def test_the_config_and_the_tree_policies_take_their_defaults_from_decoding_options():
    defaults = DecodingOptions()
    config = DartConfig()
    for name in DecodingOptions.names():
        if name != "use_ngram":  # a per-call switch, not saved with a draft
            assert getattr(config, f"tree_{name}") == getattr(defaults, name), name
    for policy in (BeamSearchTreePolicy(), TopKTreePolicy()):
        for option in dataclasses.fields(policy):
            if hasattr(defaults, option.name):
                assert getattr(policy, option.name) == getattr(defaults, option.name), (policy, option.name)
    chain = SampledChainPolicy()
    assert (chain.temperature, chain.ngram_weight, chain.top_k) == (
        defaults.sample_drafts, defaults.ngram_weight, defaults.top_k
    )


def test_the_call_overrides_the_config_and_the_shortcuts_override_both():
    config = DartConfig(tree_budget=30, tree_top_k=12, tree_lookup_length=4)
    assert DecodingOptions.resolve(config).budget == 30
    options = DecodingOptions.resolve(config, {"budget": 20, "ngram_weight": 0.3}, tree_top_k=7)
    assert (options.budget, options.top_k, options.ngram_weight, options.lookup_length) == (20, 7, 0.3, 4)
    assert DecodingOptions.resolve(config, {"budget": 20}, tree_budget=9).budget == 9
    assert DecodingOptions.resolve(config, {"adaptive": False}).lookup_chain_length() == 0


@pytest.mark.parametrize("overrides, message", [
    ({"beam": 3}, "Unknown tree option\\(s\\) \\['beam'\\]; valid options"),
    ({"policy": "greedy"}, "Unknown tree policy 'greedy'"),
    ({"budget": 0}, "tree_budget must be a positive integer, got 0"),
    ({"top_k": 2.5}, "tree_top_k must be a positive integer, got 2.5"),
    ({"beam_width": True}, "tree_beam_width must be a positive integer, got True"),
    ({"lookup_length": -1}, "lookup_length must be an integer >= 0 \\(0 turns context lookup off\\)"),
    ({"lookup_max_match": 0}, "lookup_max_match must be a positive integer"),
    ({"sample_drafts": -0.5}, "sample_drafts must be >= 0"),
])
def test_each_bad_option_is_refused_with_its_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        DecodingOptions.resolve(DartConfig(), overrides)


def test_a_config_with_a_bad_tree_field_is_refused_when_built():
    from huggingface_hub.errors import StrictDataclassClassValidationError

    with pytest.raises(StrictDataclassClassValidationError, match="tree_budget must be a positive integer"):
        DartConfig(tree_budget=0)
    with pytest.raises(StrictDataclassClassValidationError, match="lookup_length must be an integer >= 0"):
        DartConfig(tree_lookup_length=-2)


def test_generation_inputs_dart_cannot_run_are_refused():
    def config(**changes) -> GenerationConfig:  # as `generate` hands it over: every field set
        return GenerationConfig(**{"num_beams": 1, "num_return_sequences": 1, "use_cache": True, **changes})

    ids = torch.ones(1, 3, dtype=torch.long)
    check_generation_config(ids, config())
    for generation_config, message in ((config(num_beams=2), "beam search"),
                                       (config(use_cache=False), "use_cache=False"),
                                       (config(cache_implementation="static"), "DynamicCache")):
        with pytest.raises(ValueError, match=message):
            check_generation_config(ids, generation_config)
    check_generation_config(torch.ones(2, 3, dtype=torch.long), config(num_return_sequences=2, do_sample=True))


def test_left_padding_is_split_off_and_other_masks_are_refused():
    ids = torch.tensor([[0, 0, 5, 6]])
    pad, real = strip_left_padding(ids, torch.tensor([[0, 0, 1, 1]]))
    assert pad.tolist() == [[0, 0]] and real.tolist() == [[5, 6]]
    with pytest.raises(ValueError, match="left padding only"):
        strip_left_padding(ids, torch.tensor([[1, 0, 1, 1]]))


def test_generate_reads_the_options_of_the_call():
    target = tiny_target("llama", seed=3)
    draft = DartDraftModel.from_target(target)
    prompt = torch.tensor([[1, 2, 3, 4]])
    target.generate(prompt, max_new_tokens=6, assistant_model=draft, tree_options={"adaptive": False, "budget": 5})
    assert set(draft.stats.budgets) == {5} and max(draft.stats.tree_sizes) <= 6
