"""Probes that back off while drafting keeps losing, side by side with the version before and vanilla `generate`.

Two arms, each the shipped draft with its own shared state:
- fixed_share: every probe waits as long as keeps probes under `probe_share` of the plain decoding time, however
  many probes in a row found drafting losing; with two tree policies (sampling, where wide trees are cheap enough
  to weigh), the probes go to them by turns after the wait of the faster policy's probe;
- backoff: each probe in a row that drafting kept losing after doubles the wait, and each policy's probe waits as
  its own expected loss says (`AdaptiveBudget.probe_wait`, `PolicyChoice`), the shipped behaviour.
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; greedy outputs are checked against vanilla's.

    python benchmarks/ab_probe_backoff.py 20 32 benchmarks/results/ab_probe_backoff_sample_all.json all sample
    # prompts per set, new tokens, output, the sets ("all", or names joined by commas), "sample" for T=1;
    # about 21 minutes on a 2-core CPU

`ab_probe_backoff_sample.json` (60 prompts, alpaca-eval,mt-bench, T=1) and `ab_probe_backoff.json` (30 prompts,
mt-bench,cnn-dailymail, greedy) were run before the backing-off arm restarted its wait after a probe that won.
"""

from _common import ab_arguments, interleaved_speedups, patch_controllers, report, tree_policies

from dart_hf.budget import AdaptiveBudget, PolicyChoice
from dart_hf.zoo import load_draft, load_target


class FixedShare(AdaptiveBudget):
    """The previous wait: no backing off (the count of lost probes reads 0 and is not kept)."""

    lost_probes = property(lambda self: 0, lambda self, value: None)


class FixedSharePolicyChoice(PolicyChoice):
    """The previous choice: the faster policy's controller decides plain step or probe, and the probe goes to the
    policies by turns."""

    def next_budget(self) -> int:
        ranked = sorted(range(len(self.controllers)), key=lambda i: self.controllers[i].best()[1])
        fastest = self.controllers[ranked[0]]
        self.arm = ranked[0]
        budget = fastest.next_budget()
        if budget == 0:
            return 0
        self.drafted += 1
        untried = [i for i in ranked[1:] if self.controllers[i].best()[0] is None]
        probe = fastest.best()[0] is not None and fastest.best()[1] >= fastest.plain_cost()
        if probe:
            self.probes += 1
            self.arm = (self.probes - 1) % len(self.controllers)
        elif self.drafted % (2 if untried else self.explore_every) == 0:
            self.arm = untried[0] if untried else ranked[1]
        if self.arm == ranked[0]:
            return budget
        chosen = self.controllers[self.arm]
        return chosen.probe_budget() if probe else chosen.best()[0] or chosen.first_budget()


def main() -> None:
    prompts_per_set, max_new_tokens, out, sets, do_sample = ab_arguments(20)
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("fixed_share", "backoff")}

    def fixed_share(controller) -> None:
        for budget in tree_policies(controller):
            budget.__class__ = FixedShare
        if isinstance(controller, PolicyChoice):
            controller.__class__ = FixedSharePolicyChoice

    patch_controllers([(drafts["fixed_share"], fixed_share)])
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets, do_sample), out)


if __name__ == "__main__":
    main()
