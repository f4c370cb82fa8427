"""The adaptive budget's controller against its previous version, side by side with vanilla `generate`.

Previous version: a step's evidence stops at the budget it verified, so the budget just above the chosen one is
seen on exploration steps alone (one in 16), and budget 5 is no candidate. This version builds each tree one
node larger than it verifies and reads that node's outcome as exact evidence for the next budget
(`AdaptiveBudget.build_budget`). Both drafts are the shipped one (each with its own shared state), over the
benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other prompt;
every output is checked against vanilla's.

    python benchmarks/ab_controller.py 12 64 out.json  # prompts per set, new tokens, optional JSON; ~10 min
"""

import sys
from pathlib import Path

from _common import interleaved_speedups, report

from dart_hf import generation
from dart_hf.budget import AdaptiveBudget
from dart_hf.zoo import load_draft, load_target


class PreviousBudget(AdaptiveBudget):
    """The previous version: trees built with the budget they verify (and no budget 5, see `main`)."""

    def build_budget(self, budget: int) -> int:
        return budget


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("previous", "this")}
    make_controller = generation.adaptive_budget

    def adaptive_budget(draft, *args, **kwargs):
        controller = make_controller(draft, *args, **kwargs)
        if draft is drafts["previous"]:
            controller.__class__ = PreviousBudget
            controller.budgets = [b for b in controller.budgets if b != 5]
        return controller

    generation.adaptive_budget = adaptive_budget
    results = interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens)
    report(results, Path(sys.argv[3]) if len(sys.argv) > 3 else None)


if __name__ == "__main__":
    main()
