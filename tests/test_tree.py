"""Tree structure and the tree policies: plain top-k, DART's beam search, the sampled chain."""

import itertools

import pytest
import torch

import math

import numpy as np

from dart_hf.ngram import NgramTable
from dart_hf.tree import BeamSearchTreePolicy, SampledChainPolicy, TopKTreePolicy, Tree


def random_tree(size: int, generator: torch.Generator, vocab: int = 50) -> Tree:
    parents = [-1] + [int(torch.randint(0, node, (1,), generator=generator)) for node in range(1, size)]
    return Tree.from_parents(torch.randint(0, vocab, (size,), generator=generator), parents)


def test_from_parents_depths_and_paths():
    tree = Tree.from_parents([7, 1, 2, 3, 4], [-1, 0, 0, 1, 3])
    assert tree.depths.tolist() == [0, 1, 1, 2, 3]
    assert tree.path_to(4) == [0, 1, 3, 4]
    assert tree.children()[0] == {1: 1, 2: 2}


def test_from_parents_rejects_bad_structures():
    with pytest.raises(ValueError, match="root"):
        Tree.from_parents([1, 2], [0, 0])
    with pytest.raises(ValueError, match="must come before"):
        Tree.from_parents([1, 2, 3], [-1, 2, 0])


@pytest.mark.parametrize("seed", range(20))
def test_ancestor_mask_matches_paths(seed):
    generator = torch.Generator().manual_seed(seed)
    tree = random_tree(int(torch.randint(1, 70, (1,), generator=generator)), generator)
    mask = tree.ancestor_mask()
    for node in range(len(tree)):
        expected = torch.zeros(len(tree), dtype=torch.bool)
        expected[tree.path_to(node)] = True
        assert torch.equal(mask[node], expected)


def brute_force_top_nodes(log_probs: torch.Tensor, top_k: int, budget: int) -> list[tuple[float, tuple[int, ...]]]:
    """Every path of ranks through the per-level top-k, scored by summed log-probability; the best `budget`."""
    values, _ = log_probs.topk(top_k, dim=-1)
    scored = []
    for depth in range(1, log_probs.shape[0] + 1):
        for ranks in itertools.product(range(top_k), repeat=depth):
            scored.append((sum(float(values[level, rank]) for level, rank in enumerate(ranks)), ranks))
    scored.sort(key=lambda item: -item[0])
    return scored[:budget]


@pytest.mark.parametrize("seed", range(10))
def test_topk_policy_keeps_the_best_scoring_nodes(seed):
    generator = torch.Generator().manual_seed(seed)
    levels, vocab, top_k, budget = 4, 30, 3, 25
    logits = torch.randn(levels, vocab, generator=generator) * 3
    policy = TopKTreePolicy(budget=budget, top_k=top_k)
    tree = policy(logits, torch.tensor([99]), draft_to_target=lambda ids: ids)
    assert len(tree) == budget + 1 and int(tree.tokens[0]) == 99
    log_probs = torch.log_softmax(logits, dim=-1)
    kept_scores = sorted(
        (sum(float(log_probs[depth - 1, int(tree.tokens[n])]) for depth, n in enumerate(tree.path_to(node)) if n)
         for node in range(1, len(tree))),
        reverse=True,
    )
    expected_scores = [score for score, _ in brute_force_top_nodes(log_probs, top_k, budget)]
    assert kept_scores == pytest.approx(expected_scores, abs=1e-5)
    # tokens at depth d come from level d - 1's top-k
    allowed = log_probs.topk(top_k, dim=-1).indices
    for node in range(1, len(tree)):
        assert int(tree.tokens[node]) in allowed[int(tree.depths[node]) - 1].tolist()


def test_topk_policy_maps_draft_ids_and_respects_small_budgets():
    logits = torch.randn(8, 10)
    tree = TopKTreePolicy(budget=8, top_k=1)(logits, torch.tensor([0]), draft_to_target=lambda ids: ids + 100)
    assert tree.depths.tolist() == list(range(9))  # top_k=1 gives the greedy chain
    assert tree.tokens[1:].tolist() == (logits.argmax(dim=-1) + 100).tolist()
    assert len(TopKTreePolicy(budget=1, top_k=5)(logits, torch.tensor([0]), lambda ids: ids)) == 2


def reference_beam_search(logits, context, policy: BeamSearchTreePolicy):
    """Loop-based DART tree search straight from the paper's description: returns {token path: score} of the kept nodes."""
    levels = logits.shape[0]
    candidates = []
    for level in range(levels):
        values, ids = logits[level].float().topk(policy.top_k)
        if policy.full_softmax:
            log_probs = torch.log_softmax(logits[level].float(), dim=-1)[ids]
        else:
            log_probs = torch.log_softmax(values, dim=-1)
        candidates.append([(int(i), max(float(lp), math.log(1e-10))) for i, lp in zip(ids, log_probs)])

    def ngram_log_prob(path, token):
        history = [int(t) for t in context] + list(path)
        ctx = history[-(policy.ngram.order - 1):]
        ctx = [-1] * (policy.ngram.order - 1 - len(ctx)) + ctx
        p = float(policy.ngram.probabilities(np.array([ctx]), np.array([[token]]))[0, 0])
        return math.log(max(p, 1e-10))

    pool = {}
    beams = [((), 0.0)]
    for level in range(levels):
        weight = (level + 1) ** -policy.level_decay
        expanded = []
        for path, score in beams:
            for token, log_prob in candidates[level]:
                term = policy.logit_decay**level * log_prob
                if policy.ngram is not None and (level > 0 or policy.ngram_at_root):
                    term += policy.ngram_weight * ngram_log_prob(path, token)
                new_path = path + (token,)
                pool[new_path] = score + weight * term
                expanded.append((new_path, score + weight * term))
        expanded.sort(key=lambda item: (item[0][-1] in policy.eos_token_ids, -item[1]))
        beams = [item for item in expanded[: policy.beam_width] if item[0][-1] not in policy.eos_token_ids]
        if not beams:
            break
    ranked = sorted(pool.items(), key=lambda item: (-item[1], len(item[0])))
    kept = {}
    for path, score in ranked:
        if len(path) == 1 or path[:-1] in kept:
            kept[path] = score
        if len(kept) == policy.budget:
            break
    return kept


def tree_paths(tree: Tree) -> set:
    return {tuple(int(tree.tokens[n]) for n in tree.path_to(node)[1:]) for node in range(1, len(tree))}


def random_search_inputs(seed: int, vocab: int = 40) -> tuple[NgramTable, torch.Tensor, torch.Tensor]:
    """An N-gram table over random documents (EOS = 3), draft logits `[8, vocab]` and a context `[5]`."""
    rng = np.random.default_rng(seed)
    documents = [rng.integers(0, vocab, rng.integers(5, 60)) for _ in range(300)]
    table = NgramTable.from_sequences(documents, vocab_size=vocab, eos_token_id=3, progress=False)
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, vocab, generator=generator) * 2
    return table, logits, torch.randint(0, vocab, (5,), generator=generator)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["reference", "paper"])
def test_beam_search_equals_loop_reference(seed, variant):
    table, logits, context = random_search_inputs(seed)
    paper = variant == "paper"
    policy = BeamSearchTreePolicy(
        budget=30, top_k=6, beam_width=5, ngram=table, eos_token_ids=(3,), ngram_at_root=paper, full_softmax=paper
    )
    tree = policy(logits, context, lambda ids: ids)
    expected = reference_beam_search(logits, context, policy)
    assert len(tree) == 31 and tree_paths(tree) == set(expected)
    assert tree.depths.tolist() == sorted(tree.depths.tolist())  # nodes ordered by depth
    assert all(int(tree.parents[n]) < n for n in range(1, len(tree)))


@pytest.mark.parametrize("seed", range(3))
def test_beam_search_small_budgets_equal_the_full_beam_search(seed):
    """Below `beam_width` the search runs `budget` beams over `budget` levels: the tree must not change."""
    table, logits, context = random_search_inputs(seed)
    for budget in range(1, 12):
        policy = BeamSearchTreePolicy(budget=budget, top_k=6, beam_width=12, ngram=table, eos_token_ids=(3,))
        tree = policy(logits, context, lambda ids: ids)
        assert len(tree) == budget + 1 and tree_paths(tree) == set(reference_beam_search(logits, context, policy))


def test_beam_search_without_ngram_and_with_draft_vocab_mapping():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 20, generator=generator)
    policy = BeamSearchTreePolicy(budget=60, top_k=25, beam_width=20)
    tree = policy(logits, torch.tensor([1, 2]), lambda ids: ids * 2 + 1)
    assert len(tree) == 61 and bool((tree.tokens[1:] % 2 == 1).all())
    expected = reference_beam_search(logits, torch.tensor([1, 2]), BeamSearchTreePolicy(budget=60, top_k=20, beam_width=20))
    assert {tuple(2 * t + 1 for t in path) for path in expected} == tree_paths(tree)


def test_sampled_chain_draws_each_level_from_its_proposal():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 6, generator=generator) * 3
    logits[:, 5] = -math.inf  # a draft token no level can draw
    policy = SampledChainPolicy(budget=3, temperature=0.5, vocab_size=20)
    draft_ids = torch.arange(6)
    torch.manual_seed(0)
    counts = torch.zeros(3, 6)
    for _ in range(3000):
        tree = policy(logits, torch.tensor([4, 7]), draft_to_target=lambda ids: 2 * ids + 1)
        assert tree.parents.tolist() == [-1, 0, 1, 2] and tree.tokens[0] == 7 and tree.ranks.tolist() == [0, 1, 2, 3]
        assert sorted(tree.proposals) == [1, 2, 3]
        drawn = (tree.tokens[1:] - 1) // 2
        counts[torch.arange(3), drawn] += 1
    expected = torch.softmax(logits[:3] / 0.5, dim=-1)
    for level in range(3):  # each node's proposal is its level's distribution at the policy's temperature, mapped
        proposal = tree.proposals[level + 1]
        torch.testing.assert_close(proposal[2 * draft_ids + 1], expected[level])
        assert float(proposal.sum()) == pytest.approx(1.0) and proposal[0] == 0
    assert counts[:, 5].sum() == 0
    torch.testing.assert_close(counts / 3000, expected, atol=0.04, rtol=0)  # the draws follow the proposals
    assert len(policy(logits, torch.tensor([4]), lambda ids: ids, budget=20)) == 9  # one node per level at most



def test_sampled_chain_with_an_ngram_draws_deeper_levels_from_the_continuity_scores():
    # the table has only seen 7 -> 2 -> 4, so after the root 7 and a drawn 2, level 1 should favour 4 by exactly the
    # N-gram factor; the chain's first level is the draft's alone, as in the beam search
    table = NgramTable.from_sequences([[7, 2, 4]] * 5, vocab_size=10, eos_token_id=9, progress=False)
    logits = torch.zeros(3, 10)
    logits[0, 2] = 50.0  # level 0 draws 2 (as good as surely)
    logits[1, [1, 3, 4, 6]] = 1.0  # level 1's top 4, alike to the draft
    policy = SampledChainPolicy(budget=2, temperature=1.0, vocab_size=10, ngram=table, ngram_weight=0.5, top_k=4)
    tree = policy(logits, torch.tensor([5, 7]), draft_to_target=lambda ids: ids)
    assert tree.tokens[:2].tolist() == [7, 2]
    torch.testing.assert_close(tree.proposals[1], torch.softmax(logits[0], dim=-1))
    level_one = tree.proposals[2]
    assert int((level_one > 0).sum()) == 4  # drawn from the level's top-k only
    # P(4 | 7, 2) = 1 and every other candidate is unseen (1e-10): weights 1 against 1e-10 ** 0.5
    assert float(level_one[4]) == pytest.approx(1 / (1 + 3e-5), rel=1e-4)
    assert float(level_one.sum()) == pytest.approx(1.0)
