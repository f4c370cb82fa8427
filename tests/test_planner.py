"""The step planner: the decision of each step from the controller and context lookup, and the outcomes it is
told, which the controller learns from, observers see, and `finish` carries to the next call."""

from collections import deque

import numpy as np
import torch

from _helpers import FLAT_COSTS, force_costs, prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.budget import AdaptiveBudget, FixedBudget
from dart_hf.controller_state import LookupEvidence, ModeEvidence, StepRecord
from dart_hf.costs import ForwardCosts
from dart_hf.planner import Step, StepPlanner
from dart_hf.tree import Tree

STEEP = ForwardCosts([1, 65], [0.010, 0.650])  # 10 ms per node: drafting loses
MODERATE = ForwardCosts([1, 65], [0.010, 0.074])  # 1 ms per node


def test_a_fixed_budget_plans_its_tree_every_step_and_never_a_lookup():
    planner = StepPlanner(FixedBudget(12), lookup_length=0)
    context = np.array([1, 2, 3, 1, 2, 3, 1, 2])
    assert planner.next_step(context, room=50) == Step("tree", 12, arm=0)
    assert planner.forward_layout(13) == (None, False)


def test_a_lookup_chain_is_planned_when_its_evidence_says_it_pays():
    lookup = LookupEvidence()
    for _ in range(16):
        lookup.record((3, False, "latest"), 5)  # matches of 3 tokens went on for 5 tokens
    controller = AdaptiveBudget(MODERATE, 8, deque(), lookup=lookup)
    planner = StepPlanner(controller, lookup_length=6, lookup_max_match=3)
    context = np.array([7, 8, 9, 4, 5, 6, 1, 2, 7, 8, 9])  # "7 8 9" was followed by "4 5 6 ..."
    step = planner.next_step(context, room=50)
    assert step.kind == "lookup" and step.chain.tolist() == [4, 5, 6, 1, 2, 7][: step.budget]
    assert planner.next_step(context, room=0).kind != "lookup"  # no room left for a chain


def test_outcomes_reach_the_controller_and_every_observer_and_finish_saves_the_probe_spacing():
    history = deque([StepRecord(8, np.zeros(0, np.int64))] * 8)  # trees that never paid: plain steps
    controller = AdaptiveBudget(STEEP, 8, history)
    seen = []
    evidence = ModeEvidence()
    planner = StepPlanner(controller, evidence=evidence, observers=[lambda outcome, p: seen.append(outcome)])
    step = planner.next_step(np.array([1, 2, 3]), room=10)
    assert step == Step("plain")
    planner.record_plain(step, 0.01)
    planner.record_plain(step, 0.01)
    assert controller.plain_run == 2 and [o.nodes for o in seen] == [1, 1]
    tree = Tree.chain([1, 2, 3])
    tree.ranks = torch.arange(3)
    planner.record_tree(Step("tree", 2, probe=True), tree, [0, 1], 0.002, 0.02)
    assert controller.plain_run == 0 and len(controller.history) == 9 and seen[-1].overhead_seconds == 0.002
    controller.plain_run, controller.lost_probes = 5, 1
    planner.finish()
    assert (evidence.plain_run, evidence.lost_probes) == (5, 1)


def test_the_steps_observed_in_generate_are_the_steps_the_stats_count():
    target = tiny_target("llama", seed=8)  # random models fall into loops: lookup, plain and tree steps all occur
    draft = DartDraftModel.from_target(target)
    force_costs(draft, FLAT_COSTS)
    kinds = []
    draft.step_observers.append(lambda outcome, planner: kinds.append(outcome.step.kind))
    for prompt in prompts(2, seed=9):
        expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
        kinds.clear()
        assert torch.equal(target.generate(prompt, max_new_tokens=24, assistant_model=draft), expected)
        stats = draft.stats
        assert kinds.count("lookup") == stats.lookup_steps and kinds.count("plain") == stats.plain_steps
        assert kinds.count("tree") == stats.verify_steps - stats.lookup_steps == len(stats.budgets)
