"""Lossless sampling: DART's multi-draft rejection sampling reproduces the target's distribution exactly.

The reference is the exact joint distribution of the first three new tokens, computed from the target itself
with the same logits warpers; a chi-square test at significance 1e-4 (seeded, so deterministic) must accept
DART's samples and vanilla `generate`'s samples alike, and must reject a deliberately wrong acceptance rule.
"""

import itertools
import math
from collections import Counter

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import dart_hf.generation
import dart_hf.verify
from _helpers import tiny_target
from dart_hf import DartDraftModel, NgramTable
from dart_hf.budget import PolicyChoice
from dart_hf.verify import sample_child

VOCAB, NEW_TOKENS, SAMPLES = 8, 3, 1500
PROMPT = torch.tensor([[1, 5, 2]])
SETTINGS = {
    "temperature": (dict(temperature=0.8), LogitsProcessorList([TemperatureLogitsWarper(0.8)])),
    "top_k_top_p": (
        dict(temperature=1.0, top_k=5, top_p=0.9),
        LogitsProcessorList([TopKLogitsWarper(5), TopPLogitsWarper(0.9)]),
    ),
}


def chi_square_critical(dof: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.719 is the normal quantile of 1 - 1e-4."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(observed: Counter, expected_probs: dict, samples: int) -> tuple[float, float]:
    """(statistic, critical value); cells expected below 5 are pooled into one bin. A sample in a cell of
    probability 0 makes the statistic infinite."""
    if any(expected_probs.get(cell, 0.0) == 0.0 for cell in observed):
        return math.inf, 0.0
    big = [cell for cell, p in expected_probs.items() if p * samples >= 5]
    small = [cell for cell in expected_probs if cell not in set(big)]
    bins = [(observed[cell], expected_probs[cell] * samples) for cell in big]
    pooled_expected = sum(expected_probs[cell] for cell in small) * samples
    if pooled_expected > 0:
        bins.append((sum(observed[cell] for cell in small), pooled_expected))
    statistic = sum((o - e) ** 2 / e for o, e in bins)
    return statistic, chi_square_critical(len(bins) - 1)


@torch.no_grad()
def exact_joint(target, processors, prompt: torch.Tensor = PROMPT) -> dict:
    """P(first NEW_TOKENS tokens after `prompt`) under the target with `processors`, by enumerating prefixes."""
    joint = {(): 1.0}
    for _ in range(NEW_TOKENS):
        prefixes = list(joint)
        rows = torch.cat([prompt.repeat(len(prefixes), 1), torch.tensor(prefixes, dtype=torch.long).view(len(prefixes), -1)], 1)
        logits = target(rows).logits[:, -1].float()
        extended = {}
        for row, prefix in enumerate(prefixes):
            probs = torch.softmax(processors(rows[row : row + 1], logits[row : row + 1])[0], dim=-1)
            for token in torch.nonzero(probs).flatten().tolist():
                extended[prefix + (token,)] = joint[prefix] * float(probs[token])
        joint = extended
    return joint


def peaked_target():
    target = tiny_target(
        "llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, seed=3,
    )
    with torch.no_grad():
        target.lm_head.weight.mul_(15)  # random init is almost uniform; make the distributions informative
    return target


def sample_many(target, generate_kwargs, seed=0, accepted: list | None = None) -> Counter:
    """Counts of the first NEW_TOKENS sampled tokens; `accepted` collects each DART call's accepted lengths."""
    torch.manual_seed(seed)
    counts = Counter()
    for _ in range(SAMPLES):
        out = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=True, **generate_kwargs)
        counts[tuple(out[0, PROMPT.shape[1] :].tolist())] += 1
        if accepted is not None:
            accepted += generate_kwargs["assistant_model"].stats.accepted_lengths
    return counts


@pytest.fixture(scope="module")
def target_and_draft():
    target = peaked_target()
    torch.manual_seed(0)  # the draft's random weights, so its trees, whatever ran before
    return target, DartDraftModel.from_target(target, feature_layers=[1, 2, 3])


# the drafted trees of sampling mode: a chain of tokens drawn from the draft (the default), DART's deterministic tree
# (the N-gram case: levels below the first drawn from continuity-weighted top-k scores)
DRAFTS = {"drawn_chain": {}, "drawn_chain_ngram": {}, "deterministic_tree": {"sample_drafts": 0}}


@pytest.mark.parametrize("drafts", list(DRAFTS))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_dart_sampling_matches_the_exact_target_distribution(target_and_draft, setting, drafts):
    target, draft = target_and_draft
    kwargs, processors = SETTINGS[setting]
    expected = exact_joint(target, processors)
    fixed_tree = {"adaptive": False, **DRAFTS[drafts]}  # every step a tree (plain steps: test_budget.py)
    accepted = []
    if drafts == "drawn_chain_ngram":  # a table that knows some continuations of this vocabulary, not the target's
        sequences = torch.randint(0, VOCAB, (40, 12), generator=torch.Generator().manual_seed(1)).tolist()
        draft.ngram = NgramTable.from_sequences(sequences, vocab_size=VOCAB, eos_token_id=0, progress=False)
    try:
        observed = sample_many(target, dict(kwargs, assistant_model=draft, tree_options=fixed_tree), accepted=accepted)
    finally:
        draft.ngram = None
    assert sum(length >= 2 for length in accepted) >= SAMPLES // 10  # drafted tokens were accepted, often
    assert set(draft.stats.tree_sizes) == ({61} if drafts == "deterministic_tree" else {9})
    statistic, critical = chi_square(observed, expected, SAMPLES)
    assert statistic < critical, (statistic, critical)


def test_vanilla_sampling_passes_the_same_test(target_and_draft):
    target, _ = target_and_draft
    kwargs, processors = SETTINGS["temperature"]
    statistic, critical = chi_square(sample_many(target, kwargs), exact_joint(target, processors), SAMPLES)
    assert statistic < critical, (statistic, critical)


def biased_sample_child(scores, children, proposals=None):
    """A wrong rule: rejected drafts are not removed from the residual, so drafted tokens are over-weighted."""
    probs = torch.softmax(scores.float(), dim=-1)
    for token, child in children.items():
        if float(torch.rand(())) < float(probs[token]):
            return token, child
    return int(torch.multinomial(probs, num_samples=1)), None


def test_the_test_rejects_a_wrong_acceptance_rule(target_and_draft, monkeypatch):
    target, draft = target_and_draft
    kwargs, processors = SETTINGS["temperature"]
    monkeypatch.setattr(dart_hf.verify, "sample_child", biased_sample_child)
    deterministic_tree = {"adaptive": False, "sample_drafts": 0}
    observed = sample_many(target, dict(kwargs, assistant_model=draft, tree_options=deterministic_tree))
    statistic, critical = chi_square(observed, exact_joint(target, processors), SAMPLES)
    assert statistic > critical, (statistic, critical)


@pytest.mark.parametrize("seed", range(3))
def test_sample_child_is_exact_for_any_child_order(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, generator=generator) * 2
    scores[5] = -math.inf  # a token the warpers removed
    probs = torch.softmax(scores, dim=-1)
    order = torch.randperm(6, generator=generator).tolist()[:4]
    children = {token: node for node, token in enumerate(order, start=1)}
    torch.manual_seed(seed)
    draws = 20000
    counts = Counter(sample_child(scores, children)[0] for _ in range(draws))
    expected = {token: float(probs[token]) for token in range(6)}
    statistic, critical = chi_square(counts, expected, draws)
    assert statistic < critical and counts[5] == 0
    torch.manual_seed(seed)
    biased = Counter(biased_sample_child(scores, children)[0] for _ in range(draws))
    assert chi_square(biased, expected, draws)[0] > critical


def residual_free_sample_child(scores, children, proposals=None):
    """A wrong rule for drawn drafts: on rejection the next token comes from p itself, not from (p - q)+."""
    probs = torch.softmax(scores.float(), dim=-1)
    for token, child in children.items():
        q = proposals[child] if proposals and child in proposals else None
        threshold = float(probs[token]) if q is None else min(1.0, float(probs[token]) / float(q[token]))
        if float(torch.rand(())) < threshold:
            return token, child
    return int(torch.multinomial(probs, num_samples=1)), None


@pytest.mark.parametrize("seed", range(3))
def test_sample_child_is_exact_with_drawn_and_deterministic_children(seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, generator=generator) * 2
    scores[5] = -math.inf  # a token the warpers removed: a drawn draft may still propose it
    probs = torch.softmax(scores, dim=-1)
    proposal = torch.softmax(torch.randn(6, generator=generator) * 2, dim=-1)  # a draft that guesses p poorly
    torch.manual_seed(seed)
    draws = 20000
    counts, biased = Counter(), Counter()
    for _ in range(draws):
        drawn = int(torch.multinomial(proposal, 1))  # a drawn child first, then deterministic ones
        children = {drawn: 1}
        for node, token in enumerate((2, 4), start=2):
            children.setdefault(token, node)
        proposals = {1: proposal}
        counts[sample_child(scores, children, proposals)[0]] += 1
        biased[residual_free_sample_child(scores, children, proposals)[0]] += 1
    expected = {token: float(probs[token]) for token in range(6)}
    statistic, critical = chi_square(counts, expected, draws)
    assert statistic < critical and counts[5] == 0
    assert chi_square(biased, expected, draws)[0] > critical


def test_same_seed_same_output(target_and_draft):
    target, draft = target_and_draft
    outputs = []
    for _ in range(2):  # fixed trees: the adaptive budget follows measured time, which changes the random draws
        torch.manual_seed(123)
        outputs.append(target.generate(PROMPT, max_new_tokens=20, do_sample=True, temperature=0.9,
                                       assistant_model=draft, tree_options={"adaptive": False}))
    assert torch.equal(outputs[0], outputs[1])



@pytest.mark.parametrize("rule", ["exact", "biased"])
def test_lookup_chains_sample_the_exact_target_distribution(target_and_draft, monkeypatch, rule):
    from _helpers import FLAT_COSTS, force_costs
    from dart_hf.controller_state import LookupEvidence, StepRecord

    target, _ = target_and_draft
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    kwargs, processors = SETTINGS["temperature"]
    # every token occurs, so every step finds a match; and the copied tokens' target probabilities are middling
    # (not near 0 or 1), so the biased rule's error is large: its expected chi-square statistic here is about 2.4x
    # the critical value (about 5 standard deviations above it; a prompt whose copies the target is sure of or
    # rejects outright left the biased test a coin flip)
    prompt = torch.tensor([[0, 6, 1, 3, 7, 4, 2, 5, 3, 2, 6]])
    force_costs(draft, FLAT_COSTS)  # and no measured overheads: the choices, so the random draws, are fixed
    evidence = draft.controller_state.evidence.current.lookup = LookupEvidence(window=10**6, half_life=float("inf"))
    for kind in itertools.product((1, 2, 3), (False, True), ("latest", "earliest")):  # every kind of lookup
        for _ in range(10**4):  # overwhelming evidence that continuations hold: every match is verified as a chain
            evidence.record(kind, 10)
    # and that drafts never hold, drawn chains nor trees (in an 8-token vocabulary they often would): the copied
    # chain is always cheaper
    never_accepted = StepRecord(60, torch.zeros(0, dtype=torch.long).numpy())
    draft.controller_state.evidence.current.acceptance.extend([never_accepted] * 8)
    draft.controller_state.evidence.current.second_policy_acceptance.extend([never_accepted] * 8)
    if rule == "biased":
        monkeypatch.setattr(dart_hf.verify, "sample_child", biased_sample_child)
    torch.manual_seed(0)
    observed, lookup_steps = Counter(), 0
    for _ in range(SAMPLES):
        out = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, assistant_model=draft, **kwargs)
        observed[tuple(out[0, prompt.shape[1] :].tolist())] += 1
        lookup_steps += draft.stats.lookup_steps
    # a sample verifies a chain at its first step, one copied token long (what the length limit lets in), unless
    # the prefill's token is 0: the pad id, so the prompt's leading 0 counts as padding and 0 has no earlier match
    assert lookup_steps >= 0.8 * SAMPLES, lookup_steps
    statistic, critical = chi_square(observed, exact_joint(target, processors, prompt), SAMPLES)
    assert (statistic < critical) == (rule == "exact"), (statistic, critical)


class AlternatingChoice(PolicyChoice):
    """The drawn chain and the deterministic tree by turns, across calls, each at its largest budget: every step
    a switch of policy."""

    turn = itertools.count()

    def next_budget(self) -> int:
        self.arm = next(self.turn) % len(self.controllers)
        return self.controllers[self.arm].max_budget


def test_switching_between_drawn_chains_and_trees_samples_the_exact_target_distribution(target_and_draft, monkeypatch):
    from _helpers import FLAT_COSTS, force_costs

    target, _ = target_and_draft
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    force_costs(draft, FLAT_COSTS)  # trees are cheap: every step drafts
    kwargs, processors = SETTINGS["temperature"]
    no_lookup = {"lookup_length": 0}
    # by default both policies are weighed: the one without evidence yet takes every other step
    target.generate(PROMPT, max_new_tokens=12, do_sample=True, assistant_model=draft, tree_options=no_lookup, **kwargs)
    assert {"drawn", "tree"} <= set(draft.stats.tree_kinds)
    target.generate(PROMPT, max_new_tokens=12, do_sample=True, assistant_model=draft,
                    tree_options={**no_lookup, "compare_policies": False}, **kwargs)
    assert set(draft.stats.tree_kinds) == {"drawn"}

    monkeypatch.setattr(dart_hf.budget, "PolicyChoice", AlternatingChoice)
    torch.manual_seed(0)
    observed, kinds = Counter(), Counter()
    for _ in range(SAMPLES):
        out = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, do_sample=True, assistant_model=draft,
                              tree_options=no_lookup, **kwargs)
        observed[tuple(out[0, PROMPT.shape[1] :].tolist())] += 1
        kinds.update(draft.stats.tree_kinds)
    assert min(kinds["drawn"], kinds["tree"]) >= 0.4 * sum(kinds.values()), kinds
    statistic, critical = chi_square(observed, exact_joint(target, processors), SAMPLES)
    assert statistic < critical, (statistic, critical)


def test_weight_major_forwards_sample_the_exact_target_distribution(target_and_draft, monkeypatch):
    """Every verify forward run weight-major (`dart_hf.weight_major`; which sizes the adaptive budget runs so is
    `test_budget.py`'s): drawn chains verified with those logits still sample the target's exact distribution."""
    target, draft = target_and_draft
    forward_tree, weight_major_forwards = dart_hf.generation.forward_tree, []

    def weight_major_forward_tree(model, tree, cache, feature_layers, rows=None, weight_major=False):
        weight_major_forwards.append(len(tree))
        return forward_tree(model, tree, cache, feature_layers, rows, weight_major=True)

    monkeypatch.setattr(dart_hf.generation, "forward_tree", weight_major_forward_tree)
    kwargs, processors = SETTINGS["temperature"]
    accepted = []
    fixed_chains = dict(kwargs, assistant_model=draft, tree_options={"adaptive": False})
    observed = sample_many(target, fixed_chains, accepted=accepted)
    assert len(weight_major_forwards) >= SAMPLES
    assert sum(length >= 2 for length in accepted) >= SAMPLES // 10  # drafted tokens were accepted, often
    statistic, critical = chi_square(observed, exact_joint(target, processors), SAMPLES)
    assert statistic < critical, (statistic, critical)
