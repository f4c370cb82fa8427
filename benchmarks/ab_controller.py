"""The adaptive budget's controller against its previous version, side by side with vanilla `generate`.

Previous version: the calibrated forward costs as they are, and a probe after 16 plain tokens whose wait doubles
(up to 128) while probes keep losing. This version: calibrated costs scaled by measured forwards
(`ForwardTimings`) and probes spaced by their expected loss (`AdaptiveBudget.probe_wait`). Both drafts are the
shipped one (each with its own shared state), over the benchmark sets in the bench's order, interleaved prompt
by prompt with the order reversed on every other prompt; every output is checked against vanilla's.

    python benchmarks/ab_controller.py 15      # prompts per set; about 10 minutes on a 2-core CPU
"""

import sys
import time

import torch

from dart_hf import generation
from dart_hf.bench import BENCHMARK_SETS, chat_inputs
from dart_hf.budget import AdaptiveBudget, ForwardTimings
from dart_hf.prompts import load_prompts
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
    options = {"max_new_tokens": 32, "do_sample": False}
    runs = {
        "vanilla": lambda inputs: target.generate(**inputs, **options),
        **{name: (lambda inputs, d=draft: target.generate(**inputs, **options, assistant_model=d))
           for name, draft in drafts.items()},
    }
    for run in runs.values():
        run(chat_inputs(tokenizer, "Say hello."))  # untimed warm-up (and the one-time calibration)

    overall = dict.fromkeys(runs, 0.0)
    for prompt_set in BENCHMARK_SETS:
        seconds = dict.fromkeys(runs, 0.0)
        plain, steps = dict.fromkeys(drafts, 0), dict.fromkeys(drafts, 0)
        for index, prompt in enumerate(load_prompts(prompt_set, prompts_per_set)):
            inputs = chat_inputs(tokenizer, prompt)
            outputs = {}
            for name in list(runs) if index % 2 == 0 else list(runs)[::-1]:
                start = time.perf_counter()
                outputs[name] = runs[name](inputs)
                seconds[name] += time.perf_counter() - start
                if name in drafts:
                    stats = drafts[name].stats
                    plain[name] += stats.plain_steps
                    steps[name] += stats.plain_steps + stats.verify_steps
            for name in drafts:
                assert torch.equal(outputs[name], outputs["vanilla"]), f"{name} differs from vanilla on {prompt!r}"
        for name in runs:
            overall[name] += seconds[name]
        print(prompt_set, "  ".join(
            f"{name} {seconds['vanilla'] / seconds[name]:.3f}x ({plain[name] / max(steps[name], 1):.0%} plain)"
            for name in drafts), flush=True)
    print("overall", "  ".join(f"{name} {overall['vanilla'] / overall[name]:.3f}x" for name in drafts))


if __name__ == "__main__":
    main()
