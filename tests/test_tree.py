"""Tree structure and the plain top-k tree policy."""

import itertools

import pytest
import torch

from dart_hf.tree import TopKTreePolicy, Tree


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
    tree = policy(logits, root_token=99, draft_to_target=lambda ids: ids)
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
    tree = TopKTreePolicy(budget=8, top_k=1)(logits, root_token=0, draft_to_target=lambda ids: ids + 100)
    assert tree.depths.tolist() == list(range(9))  # top_k=1 gives the greedy chain
    assert tree.tokens[1:].tolist() == (logits.argmax(dim=-1) + 100).tolist()
    assert len(TopKTreePolicy(budget=1, top_k=5)(logits, 0, lambda ids: ids)) == 2
