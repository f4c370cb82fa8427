"""Each budget priced with the draft forward of its own levels (`dart_hf.budget.DraftCosts`) against one measured
overhead for every budget, side by side with vanilla `generate`.

Two arms, each the shipped draft with its own shared state:
- flat: a step's overhead outside the target's forward is the mean of recent steps', whatever their budgets: the
  version before the change;
- per_level: the rest of that overhead plus the calibrated draft forward of the budget's own levels.
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; in greedy mode every output is checked against vanilla's.

    python benchmarks/ab_draft_costs.py 12 32 benchmarks/results/ab_draft_costs_sample.json all sample
    # prompts per set, new tokens, output, the sets (default all), T=1 sampling instead of greedy
"""

from _common import ab_arguments, interleaved_speedups, patch_controllers, report, tree_policies

from dart_hf.zoo import load_draft, load_target


def flat_overhead(controller) -> None:
    for budget in tree_policies(controller):
        budget.draft_costs = None


def main() -> None:
    prompts_per_set, max_new_tokens, out, sets, do_sample = ab_arguments(12)
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("flat", "per_level")}
    patch_controllers([(drafts["flat"], flat_overhead)])
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets, do_sample), out)


if __name__ == "__main__":
    main()
