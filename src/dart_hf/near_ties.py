"""Losslessness in low precision, measured: greedy outputs that differ from vanilla's only where the target's own
logits for the two tokens are within what its dtype's rounding moves.

In float32 DART's greedy output is token-identical to vanilla `generate`'s. In bfloat16 (or float16) it need not
be, and neither is vanilla's own: a cached forward and an uncached one over the same tokens round differently, and
where the two leading logits nearly tie, the greedy choice flips. So a low-precision run is judged against how
far rounding moves the target's logits on the same prompts:

- for every prompt, one uncached forward over vanilla's whole sequence gives the target's logits at each generated
  position (`[N, V]`; causal attention, so position j sees only the first j tokens);
- the rounding scale of the run is the largest change, between vanilla's cached logits (what `generate` decided
  on) and those uncached ones, of the gap between the two leading tokens at any position of any prompt;
- vanilla's own agreement is whether its tokens are the uncached logits' argmax at every position;
- at DART's first divergence from vanilla, the gap between the uncached logits of vanilla's token and DART's
  token is a near-tie when it is within the rounding scale, and a real disagreement (must never happen) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def first_divergence(reference: torch.Tensor, other: torch.Tensor) -> int | None:
    """Index of the first differing token of two token sequences `[N]` and `[M]` (a sequence that stops early
    diverges where it stops), None when they are identical."""
    length = min(len(reference), len(other))
    differing = (reference[:length] != other[:length]).nonzero()
    if len(differing):
        return int(differing[0])
    return None if len(reference) == len(other) else length


def leading_gap_change(cached_logits: torch.Tensor, uncached_logits: torch.Tensor) -> torch.Tensor:
    """Per position `[N]`: how much the gap between the uncached logits' two leading tokens changes in the cached
    logits (both `[N, V]`), |(c[a] - c[b]) - (u[a] - u[b])|: how far rounding moved the decision."""
    top = uncached_logits.float().topk(2, dim=-1).indices
    uncached_gap = uncached_logits.float().gather(-1, top)
    cached_gap = cached_logits.float().gather(-1, top)
    return ((cached_gap[:, 0] - cached_gap[:, 1]) - (uncached_gap[:, 0] - uncached_gap[:, 1])).abs()


def logit_gap(uncached_logits: torch.Tensor, position: int, reference_token: int, other_token: int) -> float:
    """The uncached logit of `reference_token` minus that of `other_token` at `position` (logits `[N, V]`)."""
    row = uncached_logits[position].float()
    return float(row[reference_token] - row[other_token])


@dataclass
class NearTieReport:
    """A run's greedy outputs against vanilla's in the same dtype. Per prompt: the largest leading-gap change between
    vanilla's cached and uncached logits (samples of the rounding scale) and whether vanilla's tokens are its
    uncached argmax throughout; per compared output (by method name): None when identical to vanilla's, else the
    absolute uncached logit gap between vanilla's token and its own at the first divergence (inf where one output
    stopped early, leaving no token to weigh)."""

    rounding_samples: list[float] = field(default_factory=list)
    vanilla_self_identical: list[bool] = field(default_factory=list)
    gaps: dict[str, list[float | None]] = field(default_factory=dict)

    @torch.no_grad()
    def add_prompt(
        self, target, prompt_ids: torch.Tensor, vanilla_ids: torch.Tensor, vanilla_logits: torch.Tensor,
        others: dict[str, torch.Tensor],
    ) -> None:
        """One prompt: `prompt_ids` `[S]`, vanilla's new tokens `[N]` with its cached logits `[N, V]` (generate's
        `output_logits`), and per method name the new tokens `[M]` of an output to judge against vanilla's."""
        sequence = torch.cat([prompt_ids, vanilla_ids]).unsqueeze(0).to(target.device)
        logits = target(input_ids=sequence, use_cache=False).logits[0, len(prompt_ids) - 1 : -1].float().cpu()
        vanilla_ids = vanilla_ids.cpu()
        self.vanilla_self_identical.append(bool(torch.equal(logits.argmax(-1), vanilla_ids)))
        self.rounding_samples.append(float(leading_gap_change(vanilla_logits.float().cpu(), logits).max()))
        for name, other in others.items():
            other = other.cpu()
            position = first_divergence(vanilla_ids, other)
            if position is None:
                gap = None
            elif position >= min(len(other), len(vanilla_ids)):
                gap = float("inf")
            else:
                gap = abs(logit_gap(logits, position, int(vanilla_ids[position]), int(other[position])))
            self.gaps.setdefault(name, []).append(gap)

    @classmethod
    def merged(cls, reports: list[NearTieReport]) -> NearTieReport:
        """One report over the prompts of several (a run's sets)."""
        total = cls()
        for report in reports:
            total.rounding_samples += report.rounding_samples
            total.vanilla_self_identical += report.vanilla_self_identical
            for name, gaps in report.gaps.items():
                total.gaps.setdefault(name, []).extend(gaps)
        return total

    @property
    def rounding_scale(self) -> float:
        """The near-tie threshold: the largest leading-gap change between cached and uncached logits seen."""
        return max(self.rounding_samples, default=0.0)

    def summary(self, name: str, rounding_scale: float | None = None) -> dict:
        """Counts for one method: identical outputs, near-tie and real divergences (judged by `rounding_scale`,
        default this report's own), vanilla's agreement with its uncached recomputation."""
        scale = self.rounding_scale if rounding_scale is None else rounding_scale
        gaps = [gap for gap in self.gaps.get(name, []) if gap is not None]
        near_ties = sum(gap <= scale for gap in gaps)
        return {
            "identical": len(self.gaps.get(name, [])) - len(gaps),
            "near_tie_divergences": near_ties,
            "real_divergences": len(gaps) - near_ties,
            "divergence_gaps": gaps,
            "rounding_scale": scale,
            "vanilla_self_identical": sum(self.vanilla_self_identical),
            "prompts": len(self.vanilla_self_identical),
        }


def describe(summary: dict) -> str:
    """One line from `NearTieReport.summary`: the counts and the threshold they were judged by."""
    s = summary
    return (
        f"{s['identical']}/{s['prompts']} identical to vanilla in the same dtype, {s['near_tie_divergences']} "
        f"near-tie divergences, {s['real_divergences']} real divergences (near-tie: logit gap <= "
        f"{s['rounding_scale']:.3g}, the most rounding moved a leading gap on these prompts); vanilla matches its "
        f"own uncached recomputation on {s['vanilla_self_identical']}/{s['prompts']}"
    )


def compare_with_vanilla(target, prompt_ids: torch.Tensor, vanilla, output: torch.Tensor) -> str:
    """One line on a greedy DART `output` `[1, S + M]` against vanilla `generate`'s on the same prompt `prompt_ids`
    `[1, S]` (`vanilla`: its output with `output_logits=True, return_dict_in_generate=True`): in float32 whether
    the two are identical; in lower precision the near-tie judgement of this one prompt."""
    if target.dtype == torch.float32:
        return f"identical to vanilla: {torch.equal(output, vanilla.sequences)}"
    length = prompt_ids.shape[1]
    report = NearTieReport()
    report.add_prompt(target, prompt_ids[0], vanilla.sequences[0, length:], torch.cat(vanilla.logits),
                      {"dart": output[0, length:]})
    return f"{target.dtype}: {describe(report.summary('dart'))}"
