"""The adaptive tree budget: decisions from costs and evidence, tree ranks, and losslessness of plain steps."""

from collections import deque

import numpy as np
import pytest
import torch

from _helpers import FLAT_COSTS as FLAT, OracleDraft, force_costs, prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.budget import AdaptiveBudget, PolicyChoice, budget_controller
from dart_hf.controller_state import ForwardTimings, LookupEvidence, StepRecord
from dart_hf.costs import DraftCosts, ForwardCosts
from dart_hf.tree import BeamSearchTreePolicy, TopKTreePolicy, Tree

STEEP = ForwardCosts([1, 65], [0.010, 0.650])  # 10 ms per node: drafting never pays unless tau is huge
MODERATE = ForwardCosts([1, 65], [0.010, 0.074])  # 1 ms per node: pays only when drafted tokens are accepted


def history_of(records):
    return deque([StepRecord(budget, np.array(ranks, dtype=np.int64)) for budget, ranks in records], maxlen=256)


def test_each_budget_pays_the_draft_forward_of_its_own_levels():
    """Evidence from eight-level steps (the probes' budget) whose overhead was mostly the draft's eight-level
    forward: a one-level chain is priced with a one-level forward, and pays; priced with the steps' mean overhead,
    as before draft costs, it lost to plain decoding."""
    one_token = ForwardCosts([1, 2, 9], [0.060, 0.062, 0.110])
    draft_costs = DraftCosts([0.005, 0.006, 0.008, 0.009, 0.011, 0.013, 0.015, 0.017])
    assert draft_costs(1) == 0.005 and draft_costs(8) == draft_costs(60) == 0.017
    # 8-node chains whose first drafted token held on 3 steps in 10: tau(1) = 1.3
    records = [StepRecord(8, np.array([1] if i % 10 < 3 else [], dtype=np.int64), 0.025) for i in range(10)]
    priced = AdaptiveBudget(one_token, 8, deque(records, maxlen=64), draft_costs=draft_costs)
    tau, seconds_per_token = priced.estimate()[1]
    assert tau == pytest.approx(1.3)
    assert seconds_per_token == pytest.approx((0.025 - 0.017 + 0.005 + 0.062) / 1.3)  # 57.7 ms < 60 ms
    assert priced.next_budget() == 1
    flat = AdaptiveBudget(one_token, 8, deque(records, maxlen=64))
    assert flat.estimate()[1][1] == pytest.approx((0.025 + 0.062) / 1.3)  # 66.9 ms: loses
    assert flat.next_budget() == 0


def test_no_evidence_uses_the_largest_tree_that_costs_at_most_two_tokens():
    assert AdaptiveBudget(FLAT, 60, deque()).next_budget() == 60  # a GPU's shape: the full tree
    assert AdaptiveBudget(MODERATE, 60, deque()).next_budget() == 8  # 9 nodes: 18 ms; 13 nodes: 22 ms
    assert AdaptiveBudget(STEEP, 60, deque()).next_budget() == 1  # 2 nodes cost 20 ms, twice one token


def test_flat_costs_and_deep_acceptance_pick_a_large_budget():
    # every step accepted 6 drafted nodes whose ranks rise to 40: only budgets >= 40 keep the whole path
    controller = AdaptiveBudget(FLAT, 60, history_of([(60, [1, 3, 8, 15, 30, 40])] * 8))
    estimates = controller.estimate()
    assert estimates[60][0] == 7.0 and estimates[32][0] == 6.0 and estimates[1][0] == 2.0
    assert controller.next_budget() == 48


def test_steep_costs_and_poor_acceptance_fall_back_to_plain_decoding_and_probe():
    # a probe loses 10 ms (one token for 20 ms against 10 ms plain); at a 30% share that is one per 3.3 plain steps
    controller = AdaptiveBudget(STEEP, 60, history_of([(60, [])] * 8), probe_share=0.3)
    decisions = []
    for _ in range(6):
        choice = controller.next_budget()
        decisions.append(choice)
        if choice == 0:
            controller.record_plain_step()
    assert decisions[:4] == [0, 0, 0, 0] and decisions[4] > 0  # the probe after 4 plain steps
    assert controller.best()[0] == 1  # the cheapest tree, still slower than plain decoding


def test_probes_wait_in_proportion_to_their_expected_loss():
    nothing_accepted = [(60, [])] * 8
    # the probe is first_budget's tree (8 drafted nodes, 18 ms): one token for 18 ms against 10 ms, 8 ms / 0.3 ms
    assert AdaptiveBudget(MODERATE, 60, history_of(nothing_accepted)).probe_wait() == 27
    assert AdaptiveBudget(STEEP, 60, history_of(nothing_accepted)).probe_wait() == 34  # 10 / 0.3
    hopeless = ForwardCosts([1, 65], [0.010, 6.410])  # 100 ms per node
    assert AdaptiveBudget(hopeless, 60, history_of(nothing_accepted)).probe_wait() == 128  # the cap

    controller = AdaptiveBudget(MODERATE, 60, history_of(nothing_accepted))
    tree = TopKTreePolicy(budget=4)(torch.randn(2, 10), torch.tensor([0]), lambda ids: ids)
    for _ in range(4):
        controller.record_step(tree, [0, 1], 4, 0.0)  # the text changed: drafted tokens are accepted
    controller.plain_run = 0
    assert controller.next_budget() > 0  # drafting pays again: no plain steps in between


def test_probes_back_off_while_they_lose_and_start_over_after_one_that_wins():
    # a probe (first_budget's 8 drafted nodes, 18 ms) loses 8 ms against 10 ms per plain token: at a 30% share the
    # first waits 3 plain steps, and every probe in a row that lost doubles the wait
    controller = AdaptiveBudget(MODERATE, 60, history_of([(60, [])] * 8), probe_share=0.3)

    def next_probe() -> tuple[int, int]:
        plain_steps = 0
        while (budget := controller.next_budget()) == 0:
            controller.record_plain_step()
            plain_steps += 1
        return plain_steps, budget

    waits = []
    for _ in range(4):
        wait, budget = next_probe()
        waits.append(wait)
        controller.record_step(chain_of(budget), [0], budget, 0.0)  # nothing accepted: 1 token for 18 ms
    assert waits == [3, 6, 11, 22] and controller.lost_probes == 4
    assert AdaptiveBudget(MODERATE, 60, history_of([(60, [])] * 8), lost_probes=10).probe_wait() == 128  # the cap

    wait, budget = next_probe()
    assert wait == 43
    controller.record_step(chain_of(budget), [0, 1], budget, 0.0)  # 2 tokens for 18 ms: it beat plain decoding
    assert controller.lost_probes == 0 and controller.best()[1] >= controller.plain_cost()  # drafting still loses
    assert controller.probe_wait() == AdaptiveBudget(MODERATE, 60, controller.history, probe_share=0.3).probe_wait()

    for _ in range(8):
        controller.record_step(chain_of(4), [0, 1, 2, 3, 4], 4, 0.0)  # the text changed: drafting pays
    controller.lost_probes = 3
    assert controller.next_budget() > 0 and controller.lost_probes == 0


def test_policy_choice_spaces_each_policys_probes_by_its_own_loss():
    # both lose to 10 ms per plain token: the chain's steps accept a token half the time (tau 1.5 for 2 nodes,
    # 20 ms: its probe loses 5 ms), the tree's none (its probe loses 10 ms)
    controller = policy_choice(STEEP, [(8, [1]), (8, [])] * 4, [(60, [])] * 8, probe_share=0.3)
    chain, tree = controller.controllers
    assert chain.best()[1] >= chain.plain_cost() and tree.best()[1] >= tree.plain_cost()
    waits, arms = [], []
    for _ in range(4):
        plain_steps = 0
        expected = controller.controllers[controller.probes % 2].probe_wait()
        while (budget := controller.next_budget()) == 0:
            controller.record_plain_step()
            plain_steps += 1
        assert plain_steps == expected
        waits.append(plain_steps)
        arms.append(controller.arm)
        controller.record_step(chain_of(budget), [0], budget, 0.0)  # nothing accepted: each probe lost
        assert chain.lost_probes == tree.lost_probes == len(arms)  # counted across the policies
    assert arms == [0, 1, 0, 1] and waits[1] > waits[0]  # the tree's dearer probe waits longer


def test_probes_refresh_the_evidence_of_every_budget_that_could_pay():
    # a CPU's shape: a 2-node tree costs 1.7 tokens, 3 to 17 nodes cost 2, more nodes dearer; once only budget-1
    # steps were recorded, budget 1 alone has an estimate, and with tau <= 2 it can never beat plain decoding
    cpu = ForwardCosts([1, 2, 17, 65], [0.010, 0.017, 0.020, 0.040])
    controller = AdaptiveBudget(cpu, 60, history_of([(1, [])] * 8), probe_share=0.3)
    assert list(controller.estimate()) == [1] and controller.best()[1] > controller.plain_cost()
    assert controller.first_budget() == 16
    decisions = []
    while not decisions or decisions[-1] == 0:
        decisions.append(controller.next_budget())
        if decisions[-1] == 0:
            controller.record_plain_step()
    assert decisions[-1] == 16  # the probe is the largest tree costing at most two tokens, not budget 1
    tree = TopKTreePolicy(budget=16)(torch.randn(4, 10), torch.tensor([0]), lambda ids: ids)
    path = [0, 1, 2, 3]  # 3 drafted tokens accepted, ranks within the 16 best: tau 4 for 20 ms
    for _ in range(4):
        controller.record_step(tree, path, 16, 0.0)
    assert controller.best()[0] > 1 and controller.next_budget() > 0  # drafting pays again, at a larger budget


def test_measured_forward_timings_scale_the_calibrated_costs():
    accepted = history_of([(8, [1])] * 8)  # tau 2 at every budget >= 1
    calibrated = AdaptiveBudget(FLAT, 8, accepted, timings=ForwardTimings())
    assert calibrated.next_budget() > 0
    # verify forwards measured at 2.2x their calibrated cost and plain ones at 1x: one token for 1.1 forwards loses
    slow_trees = ForwardTimings(plain=deque([1.0] * 4), verify=deque([2.2] * 4))
    assert AdaptiveBudget(FLAT, 8, accepted, timings=slow_trees).next_budget() == 0
    # scaled alike, the comparison is the calibrated one
    both = ForwardTimings(plain=deque([2.2] * 4), verify=deque([2.2] * 4))
    assert AdaptiveBudget(FLAT, 8, accepted, timings=both).next_budget() > 0
    # timings are recorded as multiples of the calibrated cost; window 0 records nothing
    controller = AdaptiveBudget(STEEP, 8, deque(), timings=ForwardTimings())
    controller.record_plain_step(forward_seconds=0.015)
    controller.record_lookup_step(0.0, nodes=3, forward_seconds=0.060)
    assert list(controller.timings.plain) == [pytest.approx(1.5)] and list(controller.timings.verify) == [
        pytest.approx(2.0)
    ]
    frozen = AdaptiveBudget(STEEP, 8, deque(), timings=ForwardTimings(window=0))
    frozen.record_plain_step(forward_seconds=0.015)
    assert not frozen.timings.plain and frozen.timings.scale("plain") == 1.0


def test_measured_overhead_travels_with_the_shared_history():
    """A new call's controller starts from the overhead the earlier calls measured: a step that costs 30 ms
    beyond the forward makes a 2-token-per-step tree lose to plain decoding from the first decision."""
    ranks = [(8, [1])] * 8  # tau 2 at every budget >= 1
    cheap = deque([StepRecord(b, np.array(r), overhead_seconds=0.0) for b, r in ranks])
    costly = deque([StepRecord(b, np.array(r), overhead_seconds=0.030) for b, r in ranks])
    assert AdaptiveBudget(FLAT, 8, cheap).next_budget() > 0
    assert AdaptiveBudget(FLAT, 8, costly).next_budget() == 0


def lookup_evidence(matched_by_match: dict[int, list[int]]) -> LookupEvidence:
    evidence = LookupEvidence(half_life=float("inf"))  # every outcome counts fully
    for match, outcomes in matched_by_match.items():
        for matched in outcomes:
            evidence.record(match, matched)
    return evidence


def test_lookup_needs_evidence_for_its_match_length():
    controller = AdaptiveBudget(FLAT, 60, deque(), lookup=lookup_evidence({3: [10] * 3, 2: [10] * 4}))
    assert controller.lookup_length(3, 10) == 0  # 3 outcomes, fewer than min_evidence
    assert controller.lookup_length(2, 10) == 10
    assert controller.lookup_length(1, 10) == 0  # nothing seen after one-token matches
    assert controller.lookup_length(2, 0) == 0  # no continuation


def test_lookup_choice_takes_the_candidate_with_the_best_evidence():
    evidence = lookup_evidence({(3, True, "latest"): [0] * 8, (3, True, "earliest"): [10] * 8})
    controller = AdaptiveBudget(FLAT, 60, deque(), lookup=evidence)
    assert controller.lookup_choice([((3, True, "latest"), 10), ((3, True, "earliest"), 10)]) == (1, 10)
    assert controller.lookup_choice([((3, True, "latest"), 10)]) == (-1, 0)  # alone, it never holds: plain wins
    assert controller.lookup_choice([((3, True, "earliest"), 0)]) == (-1, 0)  # no tokens to verify
    assert controller.lookup_choice([]) == (-1, 0)


def test_a_rare_kind_of_lookup_falls_back_to_its_match_lengths_pooled_evidence():
    evidence = lookup_evidence({(3, False, "latest"): [10] * 8, (3, True, "earliest"): [0] * 2})
    assert evidence.outcomes((3,))[0].tolist() == [10] * 8 + [0] * 2  # every kind's outcomes, pooled
    controller = AdaptiveBudget(FLAT, 60, deque(), lookup=evidence)
    assert controller.lookup_length((3, True, "earliest"), 10) == 10  # 2 of its own, too few: the pool's 8 of 10
    assert controller.lookup_length((2, True, "latest"), 10) == 0  # nothing at its match length either
    evidence = lookup_evidence({(3, False, "latest"): [10] * 8, (3, True, "earliest"): [0] * 4})
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=evidence).lookup_length((3, True, "earliest"), 10) == 0  # its own


def test_lookup_length_follows_costs_and_matches():
    held = lookup_evidence({3: [10] * 8, 1: [0] * 8})
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=held).lookup_length(3, 10) == 10
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=held).lookup_length(3, 4) == 4  # only 4 available
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=held).lookup_length(1, 10) == 0  # never matched: plain wins
    # at 10 ms a node, a token must be accepted for every node verified: half the continuations failing loses
    coin = lookup_evidence({3: [10, 0] * 4})
    assert AdaptiveBudget(STEEP, 60, deque(), lookup=coin).lookup_length(3, 10) == 0
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=coin).lookup_length(3, 10) == 10
    # every other continuation held 2 tokens, the rest none: the third token is never worth its cost
    half = lookup_evidence({2: [2, 0] * 4})
    assert AdaptiveBudget(MODERATE, 60, deque(), lookup=half).lookup_length(2, 10) == 2
    # ... unless its forward runs padded to 5 rows anyway: the chain fills them, as far as the continuation goes
    padded = ForwardCosts([1, 2, 3, 4, 5, 65], [0.010, 0.020, 0.020, 0.020, 0.011, 0.08], max_rows=16)
    assert AdaptiveBudget(padded, 60, deque(), lookup=half).lookup_length(2, 10) == 4
    assert AdaptiveBudget(padded, 60, deque(), lookup=half).lookup_length(2, 3) == 3


def test_lookup_evidence_fades_after_a_change_of_text():
    fading, lasting = LookupEvidence(half_life=8), LookupEvidence(half_life=float("inf"))
    for evidence in (fading, lasting):
        for _ in range(16):
            evidence.record(3, 10)  # code: three-token repeats hold for long
    _, weights = fading.outcomes(3)
    assert weights[-1] == 1.0 and weights[-9] == pytest.approx(0.5)
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=fading).lookup_length(3, 10) == 10
    for evidence in (fading, lasting):
        for _ in range(40):
            evidence.record(1, 0)  # prose: one-token matches that fail; three-token repeats turn rare
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=fading).lookup_length(3, 10) == 0  # too little evidence left
    for evidence in (fading, lasting):
        for _ in range(6):
            evidence.record(3, 0)  # the rare three-token repeats of prose fail
    assert AdaptiveBudget(MODERATE, 60, deque(), lookup=fading).lookup_length(3, 10) == 0  # the fresh outcomes decide
    assert AdaptiveBudget(MODERATE, 60, deque(), lookup=lasting).lookup_length(3, 10) == 10  # the code's still would


def test_lookup_yields_to_a_drafted_tree_that_is_cheaper_per_token():
    deep = history_of([(60, [1, 2, 3, 4, 5, 6])] * 8)  # tau 7 at budget 6
    short = lookup_evidence({3: [1] * 8})  # tau 2
    assert AdaptiveBudget(FLAT, 60, deep, lookup=short).lookup_length(3, 10) == 0
    assert AdaptiveBudget(FLAT, 60, deque(), lookup=short).lookup_length(3, 10) >= 1


def test_evidence_only_counts_steps_whose_tree_held_the_budget():
    controller = AdaptiveBudget(FLAT, 60, history_of([(8, [1, 2])] * 5), min_evidence=4)
    assert set(controller.estimate()) == {1, 2, 3, 4, 6, 8}


def test_exploration_tries_twice_the_chosen_budget():
    controller = AdaptiveBudget(MODERATE, 60, history_of([(60, [1, 2, 3])] * 8), explore_every=3)
    choices = [controller.next_budget() for _ in range(6)]
    best = controller.best()[0]
    assert best == 3  # the smallest tree that holds the whole accepted path
    assert choices == [best, best, 2 * best, best, best, 2 * best]


def policy_choice(costs, chain_records, tree_records, **kwargs) -> PolicyChoice:
    """A drawn chain's controller (8 levels at most) beside a deterministic tree's (60 nodes), sharing evidence."""
    chain = AdaptiveBudget(costs, 8, history_of(chain_records), **kwargs)
    tree = AdaptiveBudget(costs, 60, history_of(tree_records), lookup=chain.lookup, timings=chain.timings, **kwargs)
    return PolicyChoice([chain, tree], explore_every=4)


def chain_of(budget: int) -> Tree:
    return Tree.chain(torch.arange(budget + 1))


def test_policy_choice_drafts_with_the_policy_the_hardware_favours():
    # the chain accepts 3 drafted tokens within budget 3; the tree accepts 5, but needs budget 40 for them: that
    # pays where 41 nodes cost about one token (FLAT), not where every node adds 1 ms (MODERATE)
    for costs, favoured in ((FLAT, 1), (MODERATE, 0)):
        controller = policy_choice(costs, [(8, [1, 2, 3])] * 8, [(60, [1, 2, 10, 20, 40])] * 8)
        arms = []
        for _ in range(8):
            controller.next_budget()
            arms.append(controller.arm)
        other = 1 - favoured  # every 4th step (explore_every) keeps the runner-up's evidence fresh
        assert arms == [favoured, favoured, favoured, other] * 2
        assert controller.best() == controller.controllers[favoured].best()


def test_policy_choice_tries_a_policy_without_evidence_every_other_step():
    controller = policy_choice(MODERATE, [(8, [1, 2, 3])] * 8, [])
    chain, tree = controller.controllers
    steps = []
    for _ in range(10):
        budget = controller.next_budget()
        steps.append((controller.arm, budget))
        accepted = [0, 1, 2, 3] if controller.arm == 0 else [0, 1, 2]  # the chain accepts 3 tokens, the tree 2
        controller.record_step(chain_of(budget), accepted, budget, 0.0)
    # the tree's first steps use its evidence-free budget (8: 9 nodes cost 18 ms, under two tokens' 20 ms); four
    # steps give it tau 3 at budget 2, 4 ms per token against the chain's 3.25 (tau 4 at budget 3): the chain wins
    assert steps == [(0, 3), (1, 8)] * 4 + [(0, 3), (0, 3)]
    assert len(tree.history) == 4 and len(chain.history) == 8 + 6


def test_the_tree_is_weighed_beside_drawn_chains_only_where_wide_trees_are_cheap():
    target = tiny_target("llama", seed=5)
    draft = DartDraftModel.from_target(target)
    this_cpu = ForwardCosts([1, 3, 9, 17, 65], [0.0332, 0.0363, 0.0613, 0.0746, 0.12])  # SmolLM2 on this CPU
    for costs, weighed in ((FLAT, True), (MODERATE, False), (this_cpu, False)):
        force_costs(draft, costs)
        controller, _ = budget_controller(draft.controller_state, target, draft, [8, 60], mode=("sample", 1.0))
        assert isinstance(controller, PolicyChoice) == weighed  # a 17-node tree against two one-token forwards
        assert controller.arm == 0


def test_policy_choice_counts_plain_steps_towards_every_policys_probe():
    controller = policy_choice(STEEP, [(8, [])] * 8, [(60, [])] * 8, probe_share=0.3)  # both lose to plain steps
    decisions = []
    for _ in range(4):
        decisions.append(controller.next_budget())
        controller.record_plain_step()
    assert decisions == [0, 0, 0, 0]  # the first probe comes after 4 plain steps, as for one policy
    assert [c.plain_run for c in controller.controllers] == [4, 4]
    probed = []
    for _ in range(4):  # probes go to the policies by turns, whichever is estimated faster
        budget = controller.next_budget()
        while budget == 0:
            controller.record_plain_step()
            budget = controller.next_budget()
        probed.append(controller.arm)
        controller.record_step(chain_of(budget), [0], budget, 0.0)  # nothing accepted: drafting still loses
        assert [c.plain_run for c in controller.controllers] == [0, 0]
    assert probed == [0, 1, 0, 1]


@pytest.mark.parametrize("policy", [TopKTreePolicy(budget=40, top_k=6), BeamSearchTreePolicy(budget=40, top_k=6)])
def test_the_tree_of_a_smaller_budget_is_the_nodes_of_lower_rank(policy):
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)) * 3
    context = torch.tensor([5, 6, 7])
    full = policy(logits, context, lambda ids: ids)

    def paths(tree, nodes):
        return {tuple(tree.tokens[tree.path_to(n)].tolist()) for n in nodes}

    for budget in (1, 5, 17, 40):
        small = policy(logits, context, lambda ids: ids, budget=budget)
        assert len(small) == budget + 1
        lower = [n for n in range(len(full)) if int(full.ranks[n]) <= budget]
        assert paths(small, range(len(small))) == paths(full, lower)
    parents = full.parents[1:]
    assert bool((full.ranks[parents] < full.ranks[1:]).all())  # a parent always ranks before its children


def test_plain_fallback_is_lossless_greedy_and_engages():
    target = tiny_target("qwen3", seed=3)
    draft = DartDraftModel.from_target(target)  # untrained: nothing is accepted
    force_costs(draft, STEEP)
    for prompt in prompts(3, seed=4):
        expected = target.generate(prompt, max_new_tokens=48, do_sample=False)
        got = target.generate(prompt, max_new_tokens=48, do_sample=False, assistant_model=draft)
        assert torch.equal(got, expected)
    stats = draft.stats
    # a probe loses 10 ms against 10 ms per plain token: 34 plain steps before each probe, so at most two of the
    # 47 steps
    assert stats.verify_steps <= 2 and stats.plain_steps >= 45
    assert stats.plain_steps + sum(stats.accepted_lengths) == 47  # the first token comes from the prefill


def test_the_wait_between_probes_spans_generate_calls():
    target = tiny_target("llama", seed=7)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, STEEP)
    known_to_lose = history_of([(60, [])] * 8)  # known to lose: a probe after 34 plain steps
    draft.controller_state.evidence.current.acceptance.extend(known_to_lose)
    probes = []
    for prompt in prompts(4, seed=8):  # 11 decoding steps per call: no single call is long enough to probe
        expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=draft), expected)
        probes.append(draft.stats.verify_steps)
    assert probes == [0, 0, 0, 1]  # the 35th plain-or-probe step of the stream, in the fourth call


def test_the_probes_backing_off_spans_generate_calls():
    target = tiny_target("llama", seed=7)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, STEEP)
    evidence = draft.controller_state.evidence.current
    evidence.acceptance.extend(history_of([(60, [])] * 8))  # known to lose: a probe after 34 plain steps
    evidence.plain_run, evidence.lost_probes = 30, 2  # but two probes in a row lost: 128 steps
    for prompt in prompts(2, seed=8):
        expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=draft), expected)
        assert draft.stats.verify_steps == 0
    assert (evidence.plain_run, evidence.lost_probes) == (30 + 2 * 11, 2)
    assert budget_controller(draft.controller_state, target, draft, [60])[0].lost_probes == 2


def test_plain_steps_sample_exactly_like_vanilla_generate():
    target = tiny_target("llama", seed=5)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, STEEP)
    known_to_lose = history_of([(60, [])] * 8)  # known to lose: plain from the first step
    draft.controller_state.evidence.current.acceptance.extend(known_to_lose)
    prompt = prompts(1, seed=6)[0]
    torch.manual_seed(11)
    expected = target.generate(prompt, max_new_tokens=12, do_sample=True, top_k=20)
    torch.manual_seed(11)
    got = target.generate(prompt, max_new_tokens=12, do_sample=True, top_k=20, assistant_model=draft)
    assert draft.stats.verify_steps == 0 and draft.stats.plain_steps == 11
    assert torch.equal(got, expected)  # the same random draws as vanilla sampling


def test_greedy_evidence_does_not_decide_a_sampling_call():
    target = tiny_target("llama", seed=5)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, STEEP)
    known_to_lose = history_of([(60, [])] * 8)  # greedy calls found that drafting loses
    draft.controller_state.evidence.current.acceptance.extend(known_to_lose)
    prompt = prompts(1, seed=6)[0]
    target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=draft)
    assert draft.stats.verify_steps == 0
    # a sampling call has no evidence of its own yet: it drafts until its own steps say drafting loses
    target.generate(prompt, max_new_tokens=12, do_sample=True, top_k=20, assistant_model=draft)
    assert draft.stats.verify_steps >= 4
    sampling_history = draft.controller_state.evidence.current.acceptance
    assert len(sampling_history) == draft.stats.verify_steps
    # back to greedy: its own evidence again, plain from the first step; and sampling's is kept for later
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=draft), expected)
    assert draft.stats.verify_steps == 0 and len(draft.controller_state.evidence.current.acceptance) == 8
    target.generate(prompt, max_new_tokens=4, do_sample=True, top_k=20, assistant_model=draft)
    assert draft.controller_state.evidence.current.acceptance is sampling_history


def test_a_good_draft_with_flat_costs_never_falls_back():
    target = tiny_target("llama", seed=2)
    draft = OracleDraft.from_target(target)
    force_costs(draft, FLAT)
    prompt = prompts(1, seed=3)[0]
    longer = target.generate(prompt, max_new_tokens=72, do_sample=False)
    draft.set_reference(longer, 5)
    expected = target.generate(prompt, max_new_tokens=64, do_sample=False)
    assert torch.equal(target.generate(prompt, max_new_tokens=64, do_sample=False, assistant_model=draft), expected)
    assert draft.stats.plain_steps == 0 and draft.stats.tau == 6
    assert draft.stats.chosen_budget is not None


def test_budgets_grow_to_fill_the_rows_their_forward_is_padded_to():
    """2-4 rows cost more than 5: budgets 1-4 become 4, a tree of 5 nodes; 7 and 9 nodes run unpadded."""
    measured = ([1, 2, 3, 4, 5, 9, 13], [1.0, 1.7, 2.1, 1.45, 1.37, 1.85, 1.7])
    controller = AdaptiveBudget(ForwardCosts(*measured, max_rows=9), 8, history_of([(8, [1, 2])] * 8))
    assert controller.budgets == [4, 6, 8]
    assert controller.filled(2) == 4 and controller.filled(6) == 6
    # a budget is never grown past the largest tree: 9 nodes would run as 13 rows, but the largest budget is 8
    capped = AdaptiveBudget(ForwardCosts(*measured, max_rows=13), 8, deque())
    assert capped.filled(8) == 8 and capped.budgets == [4, 6, 8]
    # exploring twice the chosen budget fills too
    explorer = AdaptiveBudget(ForwardCosts(*measured, max_rows=9), 8, history_of([(8, [1])] * 8), explore_every=1)
    assert explorer.next_budget() in explorer.budgets
    # unpadded costs leave the candidate budgets as they are
    assert AdaptiveBudget(ForwardCosts(*measured), 8, deque()).budgets == [1, 2, 3, 4, 6, 8]


def recorded_verify_forwards(monkeypatch) -> list[tuple[int, int | None, bool]]:
    """Make the decode loop's verify forwards append (nodes, rows, weight_major) to the returned list."""
    import dart_hf.generation as generation
    from dart_hf.verify import forward_tree

    forwards = []

    def recording_forward_tree(model, tree, cache, feature_layers, rows=None, weight_major=False):
        forwards.append((len(tree), rows, weight_major))
        return forward_tree(model, tree, cache, feature_layers, rows, weight_major)

    monkeypatch.setattr(generation, "forward_tree", recording_forward_tree)
    return forwards


def assert_oracle_decoding_is_vanilla(target, draft, tree_options: dict) -> list[int]:
    """Greedy DART with the oracle `draft` right for 1, 2 and 3 levels, on three prompts: the output is vanilla's.
    Returns the budgets of every drafted step."""
    budgets = []
    for correct_levels, prompt in zip((1, 2, 3), prompts(3, seed=9)):
        draft.set_reference(target.generate(prompt, max_new_tokens=72, do_sample=False), correct_levels)
        expected = target.generate(prompt, max_new_tokens=64, do_sample=False)
        got = target.generate(
            prompt, max_new_tokens=64, do_sample=False, assistant_model=draft, tree_options=tree_options
        )
        assert torch.equal(got, expected)
        budgets += draft.stats.budgets
    return budgets


def test_filled_budgets_are_lossless_end_to_end(monkeypatch):
    """Costs under which trees of 2-4 nodes would run padded to 5 rows: the drafted trees are built with budget 4
    instead (no tree runs fewer nodes than 5 but for lookup chains), and the greedy output is vanilla's."""
    target = tiny_target("llama", seed=8)
    draft = OracleDraft.from_target(target)
    force_costs(draft, ForwardCosts([1, 2, 3, 4, 5, 65], [0.010, 0.020, 0.020, 0.020, 0.011, 0.08]))
    forwards = recorded_verify_forwards(monkeypatch)
    budgets = assert_oracle_decoding_is_vanilla(target, draft, {"budget": 8, "lookup_length": 0})
    assert budgets and min(budgets) >= 4 and 4 in budgets
    assert min(nodes for nodes, _, _ in forwards) >= 5


def test_weight_major_forwards_are_lossless_end_to_end(monkeypatch):
    """Costs under which every tree and lookup chain of up to 5 nodes runs weight-major (`dart_hf.weight_major`):
    greedy output as vanilla's, with forwards of both layouts run."""
    target = tiny_target("llama", seed=8)
    draft = OracleDraft.from_target(target)
    counts = [1, 2, 3, 4, 5, 6, 65]
    usual = [0.010, 0.012, 0.013, 0.014, 0.015, 0.016, 0.08]
    major = [0.011, 0.011, 0.011, 0.011, 0.011, 0.020, 0.2]
    force_costs(draft, ForwardCosts(counts, usual, weight_major_seconds=major))
    forwards = recorded_verify_forwards(monkeypatch)
    assert_oracle_decoding_is_vanilla(target, draft, {"budget": 8})
    assert {major for _, _, major in forwards} == {False, True}
    assert all(major == (nodes <= 5) for nodes, _, major in forwards)


def test_padded_forwards_are_lossless_end_to_end(monkeypatch):
    """Costs under which trees and lookup chains of 2-4 nodes run padded to 5 rows: greedy output as vanilla's."""
    target = tiny_target("llama", seed=8)  # random models fall into loops: context lookup engages
    draft = OracleDraft.from_target(target)
    force_costs(draft, ForwardCosts([1, 2, 3, 4, 5, 65], [0.010, 0.020, 0.020, 0.020, 0.011, 0.08]))
    forwards = recorded_verify_forwards(monkeypatch)
    assert_oracle_decoding_is_vanilla(target, draft, {"budget": 3})
    assert any(nodes < 5 and rows == 5 for nodes, rows, _ in forwards)
    assert all(rows == 5 for nodes, rows, _ in forwards if nodes < 5)
    assert all(rows == nodes for nodes, rows, _ in forwards if nodes >= 5)
