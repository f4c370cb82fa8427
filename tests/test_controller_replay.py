"""benchmarks/controller_replay.py decides through the decode loop's own planner: replayed on the loop's output,
with the loop's trees and the same pinned controller, it takes exactly the loop's steps."""

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from controller_replay import replay_prompt  # noqa: E402

from _helpers import FLAT_COSTS, force_costs, prompts, tiny_target  # noqa: E402
from dart_hf import DartDraftModel  # noqa: E402
from dart_hf.budget import budget_controller  # noqa: E402
from dart_hf.planner import StepPlanner  # noqa: E402


def test_the_replay_takes_the_loops_steps():
    target = tiny_target("llama", seed=8)  # random models fall into loops: lookup, plain and tree steps occur
    draft = DartDraftModel.from_target(target)
    config = draft.config
    every_kind = Counter()
    for prompt in prompts(2, seed=9):
        force_costs(draft, FLAT_COSTS)  # decisions from the text alone, with fresh evidence
        steps, trees, committed = [], {}, [1]  # tokens committed before each step (the prefill's first)

        def observe(outcome, planner):
            step = outcome.step
            steps.append((step.kind, step.budget))
            if step.kind == "tree":  # the replay reads the step's tree at anchor (committed length - 2)
                trees[prompt.shape[1] + committed[-1] - 2] = (outcome.tree, outcome.path)
            committed.append(draft.stats.new_tokens)

        draft.step_observers[:] = [observe]
        output = target.generate(prompt, max_new_tokens=40, assistant_model=draft)[0].tolist()
        draft.step_observers.clear()
        assert output == target.generate(prompt, max_new_tokens=40, do_sample=False)[0].tolist()
        every_kind.update(kind for kind, _ in steps)

        force_costs(draft, FLAT_COSTS)
        controller, _ = budget_controller(draft.controller_state, target, draft, [config.tree_budget],
                                          config.tree_lookup_length)
        replayed = []
        planner = StepPlanner(controller, config.tree_lookup_length, config.tree_lookup_max_match,
                              observers=[lambda outcome, planner: replayed.append((outcome.step.kind,
                                                                                    outcome.step.budget))])
        costs = controller.costs
        _, kinds, _ = replay_prompt(prompt.shape[1], output, trees, planner, costs,
                                    {"tree": 0.0, "lookup": 0.0, "plain": 0.0})
        assert replayed == steps
        assert kinds == Counter(kind for kind, _ in steps)
    assert set(every_kind) == {"tree", "plain", "lookup"}  # the replay was asked every kind of step
