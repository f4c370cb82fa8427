"""benchmarks/sample_tree_replay.py: its expected reach of every node equals how often sampling verification
(`dart_hf.verify.sample_child`) reaches it, for trees that mix drawn siblings, deterministic siblings and chains."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from sample_tree_replay import expected_accepted, with_drawn_siblings  # noqa: E402

from dart_hf.tree import Tree  # noqa: E402
from dart_hf.verify import sample_child  # noqa: E402

VOCAB = 6


def drawn_chain(generator: torch.Generator) -> Tree:
    """A 3-node drawn chain over a 6-token vocabulary: each level's token drawn from its own proposal."""
    proposals = torch.softmax(torch.randn(3, VOCAB, generator=generator) * 1.5, dim=-1)
    tokens = [0] + [int(torch.multinomial(q, 1, generator=generator)) for q in proposals]
    tree = Tree.from_parents(tokens, [-1, 0, 1, 2])
    tree.ranks = torch.arange(4)
    tree.proposals = {level + 1: q for level, q in enumerate(proposals)}
    return tree


def reach_frequencies(tree: Tree, probs: torch.Tensor, trials: int) -> torch.Tensor:
    """How often sampling verification reaches each node `[N + 1]`, over `trials` walks from the root."""
    children, counts = tree.children(), torch.zeros(len(tree))
    scores = probs.log()
    for _ in range(trials):
        node = 0
        while node is not None:
            counts[node] += 1
            _, node = sample_child(scores[node], children[node], tree.proposals)
    return counts / trials


@pytest.mark.parametrize("layout", ["chain", "drawn_sibling_first", "drawn_sibling_after_chain", "deterministic"])
def test_expected_reach_equals_sampling_verification(layout):
    generator = torch.Generator().manual_seed(3)
    tree = drawn_chain(generator)
    if layout == "drawn_sibling_first":
        tree = with_drawn_siblings(tree, siblings=2, position=1)
    elif layout == "drawn_sibling_after_chain":
        tree = with_drawn_siblings(tree, siblings=1, position=3)
    elif layout == "deterministic":  # two deterministic root children beside the drawn chain
        proposals = tree.proposals
        tree = Tree.from_parents(tree.tokens.tolist() + [(int(tree.tokens[1]) + 1) % VOCAB, 5], [-1, 0, 1, 2, 0, 0])
        tree.ranks, tree.proposals = torch.arange(6), proposals
    probs = torch.softmax(torch.randn(len(tree), VOCAB, generator=generator), dim=-1)  # the target's, per node
    budgets = list(range(1, len(tree)))
    expected = torch.tensor(expected_accepted(tree, probs.log(), 1.0, budgets))
    expected_reach = torch.diff(expected, prepend=torch.tensor([1.0]))  # node m's reach: E(m) - E(m - 1)

    torch.manual_seed(0)
    trials = 6000
    measured = reach_frequencies(tree, probs, trials)[1:]
    tolerance = 4 * (expected_reach * (1 - expected_reach) / trials).sqrt() + 1e-3
    assert expected_reach.max() > 0.05  # the tree is reached at all, so the comparison has teeth
    assert torch.all((measured - expected_reach).abs() <= tolerance), (measured, expected_reach)


def test_a_residual_free_expectation_would_fail():
    """The residual matters: reading a drawn sibling's reach as min(1, p / q) of the untouched p is wrong."""
    generator = torch.Generator().manual_seed(3)
    tree = with_drawn_siblings(drawn_chain(generator), siblings=2, position=1)
    probs = torch.softmax(torch.randn(len(tree), VOCAB, generator=generator), dim=-1)
    torch.manual_seed(0)
    measured = reach_frequencies(tree, probs, 6000)
    sibling = 2  # the first drawn sibling, node 2
    token = int(tree.tokens[sibling])
    naive = (1 - measured[1]) * min(1.0, float(probs[0, token] / tree.proposals[sibling][token]))
    assert abs(float(measured[sibling]) - naive) > 0.02
