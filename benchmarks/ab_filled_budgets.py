"""Budgets that fill their padded rows with nodes, side by side with the version before and vanilla `generate`.

Two arms, each the shipped draft with its own shared state:
- padded: the candidate budgets as they are; a tree whose forward is faster padded (`ForwardCosts.rows`: on this
  CPU 3 nodes cost more than 4, 7 more than 8) runs with pad rows;
- filled: each budget grown to the nodes of its padded forward (`AdaptiveBudget.filled`), the shipped behaviour.
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; every output is checked against vanilla's.

    python benchmarks/ab_filled_budgets.py 20 32 benchmarks/results/ab_filled_budgets.json [gsm8k,mbpp]
    # prompts per set, new tokens, output, the sets (default all); about 25 minutes on a 2-core CPU
"""

import sys
from pathlib import Path

from _common import interleaved_speedups, patch_controllers, report, tree_policies

from dart_hf.budget import candidate_budgets
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    sets = sys.argv[4].split(",") if len(sys.argv) > 4 else None
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("padded", "filled")}

    def padded(controller) -> None:
        for budget in tree_policies(controller):
            budget.filled = lambda b: b
            budget.budgets = candidate_budgets(budget.max_budget)

    patch_controllers([(drafts["padded"], padded)])
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets), out)


if __name__ == "__main__":
    main()
