"""Weight-major products in the tree forward (`dart_hf.weight_major`) against the usual layout, side by side with
vanilla `generate`.

Two arms, each the shipped draft with its own shared state, both from one calibration of the forward costs (which
measures both layouts):
- usual: every tree forward with the linear layers' usual products, priced by their measured costs alone: the
  version before the change;
- weight_major: each forward in the layout that measured faster at its size (`ForwardCosts.weight_major`).
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; in greedy mode every output is checked against vanilla's.

    python benchmarks/ab_weight_major.py 12 32 benchmarks/results/ab_weight_major.json [all|gsm8k,mbpp] [sample]
    # prompts per set, new tokens, output, the sets (default all), T=1 sampling instead of greedy
"""

import dataclasses

from _common import ab_arguments, interleaved_speedups, report

from dart_hf import generation
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    prompts_per_set, max_new_tokens, out, sets, do_sample = ab_arguments(12)
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("usual", "weight_major")}
    make_controller, calibrate = generation.adaptive_budget, generation.calibrate_forward_costs

    def usual_layout_costs(*args, **kwargs):  # the same calibration, without the weight-major curve
        return dataclasses.replace(calibrate(*args, **kwargs), weight_major_seconds=None)

    def adaptive_budget(draft, *args, **kwargs):  # the costs are memoised on each draft in its first call
        generation.calibrate_forward_costs = usual_layout_costs if draft is drafts["usual"] else calibrate
        return make_controller(draft, *args, **kwargs)

    generation.adaptive_budget = adaptive_budget
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets, do_sample), out)


if __name__ == "__main__":
    main()
