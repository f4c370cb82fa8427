"""The adaptive budget's controller against its previous version, side by side with vanilla `generate`.

Previous version: the calibrated forward costs as they are, and a probe after 16 plain tokens whose wait doubles
(up to 128) while probes keep losing. This version: calibrated costs scaled by measured forwards
(`ForwardTimings`) and probes spaced by their expected loss (`AdaptiveBudget.probe_wait`). Both drafts are the
shipped one (each with its own shared state), over the benchmark sets in the bench's order, interleaved prompt
by prompt with the order reversed on every other prompt; every output is checked against vanilla's.

    python benchmarks/ab_controller.py 15      # prompts per set; about 10 minutes on a 2-core CPU
"""

import sys

from _common import interleaved_speedups

from dart_hf import generation
from dart_hf.budget import AdaptiveBudget, ForwardTimings
from dart_hf.zoo import load_draft, load_target


class PreviousBudget(AdaptiveBudget):
    """The previous probe schedule: a fixed wait that doubles after each probe that finds drafting still losing."""

    probe_interval = 16
    probing = False

    def next_budget(self) -> int:
        budget, seconds_per_token, _ = self.best()
        if budget is None or seconds_per_token < self.plain_cost():
            return super().next_budget()  # no evidence yet, or drafting pays: as this version decides
        if self.plain_run >= self.probe_interval:
            self.probing = True
            return budget
        return 0

    def record_step(self, *args, **kwargs) -> None:
        super().record_step(*args, **kwargs)
        if self.probing:
            self.probing = False
            losing = self.best()[1] >= self.plain_cost()
            self.probe_interval = min(2 * self.probe_interval, self.max_probe_interval) if losing else 16


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("previous", "this")}
    drafts["previous"]._dart_forward_timings = ForwardTimings(window=0)  # calibrated costs as they are
    make_controller = generation.adaptive_budget

    def adaptive_budget(draft, *args, **kwargs):
        controller = make_controller(draft, *args, **kwargs)
        if draft is drafts["previous"]:
            controller.__class__ = PreviousBudget
        return controller

    generation.adaptive_budget = adaptive_budget
    interleaved_speedups(target, tokenizer, drafts, prompts_per_set)


if __name__ == "__main__":
    main()
