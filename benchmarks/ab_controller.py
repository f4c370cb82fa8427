"""The adaptive budget's controller against its previous version, side by side with vanilla `generate`.

Three arms, each the shipped draft with its own shared state:
- previous: forward costs smoothed into a rising curve (each size raised to the dearest smaller size's cost), and
  while drafting loses a probe drafts the best budget's tree (the one that loses least, often budget 1);
- measured_costs: each size's calibrated cost as measured (`calibrate_forward_costs`, method 3), the old probe;
- this: measured costs, and a probe drafts at least `first_budget`'s tree, so it refreshes the evidence of every
  budget that could pay (`AdaptiveBudget.probe_budget`).
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; every output is checked against vanilla's.

    python benchmarks/ab_controller.py 10 32 benchmarks/results/ab_controller_costs_probes.json
    # prompts per set, new tokens, output; about 16 minutes on a 2-core CPU
"""

import sys
from pathlib import Path

import numpy as np
from _common import interleaved_speedups, patch_controllers, report, tree_policies

from dart_hf.budget import AdaptiveBudget, ForwardCosts
from dart_hf.zoo import load_draft, load_target


class PreviousProbe(AdaptiveBudget):
    """The previous probe: the best budget's tree, however small."""

    def probe_budget(self) -> int:
        budget = self.best()[0]
        return self.first_budget() if budget is None else budget


def smoothed(costs: ForwardCosts) -> ForwardCosts:
    """The previous calibration's curve: more nodes never cost less."""
    return ForwardCosts(costs.node_counts, np.maximum.accumulate(costs.seconds).tolist())


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("previous", "measured_costs", "this")}

    def previous_probe(controller) -> None:
        for budget in tree_policies(controller):
            budget.__class__ = PreviousProbe

    def smoothed_costs(controller) -> None:
        for budget in tree_policies(controller):
            budget.costs = smoothed(budget.costs)

    patch_controllers([
        (drafts["previous"], previous_probe), (drafts["previous"], smoothed_costs),
        (drafts["measured_costs"], previous_probe),
    ])
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens), out)


if __name__ == "__main__":
    main()
