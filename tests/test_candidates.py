"""DART's chain inside Transformers' own assisted decoding (`DartCandidateGenerator`): greedy identity with vanilla
`generate`, exact tau with an oracle draft, and Transformers' speculative sampling reproducing the target's
distribution."""

import pytest
import torch

from _helpers import OracleDraft, prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.candidates import DartCandidateGenerator, best_path
from dart_hf.tree import Tree
from test_sampling import SAMPLES, SETTINGS, chi_square, exact_joint, peaked_target, sample_many


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_chain_greedy_equals_vanilla(arch):
    target = tiny_target(arch, seed=1)
    draft = DartDraftModel.from_target(target)
    for prompt in prompts(3, seed=2):
        expected = target.generate(prompt, max_new_tokens=40, do_sample=False)
        got = target.generate(prompt, max_new_tokens=40, do_sample=False, assistant_model=draft, dart_chain=True)
        assert torch.equal(got, expected)
    assert "_get_candidate_generator" not in vars(target)  # the override ends with the call


@pytest.mark.parametrize("correct_levels", [2, 5])
def test_chain_with_an_oracle_draft_accepts_exactly_the_correct_levels(correct_levels):
    target = tiny_target("llama", seed=2)
    draft = OracleDraft.from_target(target)
    prompt = prompts(1, seed=3)[0]
    draft.set_reference(target.generate(prompt, max_new_tokens=56, do_sample=False), correct_levels)
    expected = target.generate(prompt, max_new_tokens=48, do_sample=False)
    got = target.generate(prompt, max_new_tokens=48, do_sample=False, assistant_model=draft, dart_chain=True)
    assert torch.equal(got, expected)
    lengths = draft.stats.accepted_lengths
    assert lengths[:-1] == [correct_levels + 1] * (len(lengths) - 1) and lengths[-1] <= correct_levels + 1
    # the tree path's decoding options are accepted and ignored by the chain path
    tree_path_options = {"adaptive": True, "lookup_length": 0, "lookup_max_match": 2}
    got = target.generate(prompt, max_new_tokens=48, do_sample=False, assistant_model=draft, dart_chain=True,
                          tree_options=tree_path_options)
    assert torch.equal(got, expected) and draft.stats.accepted_lengths == lengths


def test_chain_sampling_matches_the_exact_target_distribution():
    target = peaked_target()
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    kwargs, processors = SETTINGS["top_k_top_p"]
    observed = sample_many(target, dict(kwargs, assistant_model=draft, dart_chain=True))
    assert max(draft.stats.accepted_lengths) >= 2  # drafted tokens were accepted by speculative sampling
    statistic, critical = chi_square(observed, exact_joint(target, processors), SAMPLES)
    assert statistic < critical, (statistic, critical)


def test_best_path_follows_the_lowest_rank_child():
    tree = Tree.from_parents([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 2, 2])
    tree.ranks = torch.tensor([0, 2, 1, 4, 3, 5])
    assert best_path(tree) == [2, 4]  # node 2 (rank 1), then its best child node 4 (rank 3)
    assert best_path(Tree.from_parents([7], [-1])) == []


def test_generator_without_hidden_states_is_refused():
    target = tiny_target()
    draft = DartDraftModel.from_target(target)
    generator = DartCandidateGenerator(draft, lambda *a, **k: None, target.generation_config)
    with pytest.raises(ValueError, match="hidden states"):
        generator.get_candidates(torch.tensor([[1, 2]]), model_outputs=None)
