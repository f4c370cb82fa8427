"""The low-precision losslessness standard: first divergences, the rounding scale, and the near-tie judgement on
constructed logits (a real tie, a near-tie within the rounding scale, a clear disagreement)."""

from types import SimpleNamespace

import pytest
import torch

from dart_hf.near_ties import NearTieReport, describe, first_divergence, leading_gap_change

PROMPT = torch.tensor([5, 6])


class FixedLogitsTarget:
    """Stands in for a target whose uncached forward gives `logits` `[N, V]` at the N generated positions."""

    device = torch.device("cpu")

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def __call__(self, input_ids: torch.Tensor, use_cache: bool) -> SimpleNamespace:
        assert not use_cache and input_ids.shape[1] == len(PROMPT) + len(self.logits)
        rows = torch.zeros(input_ids.shape[1], self.logits.shape[1])
        rows[len(PROMPT) - 1 : -1] = self.logits
        return SimpleNamespace(logits=rows.unsqueeze(0))


def test_first_divergence():
    assert first_divergence(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3])) is None
    assert first_divergence(torch.tensor([1, 2, 3]), torch.tensor([1, 4, 3])) == 1
    assert first_divergence(torch.tensor([1, 2, 3]), torch.tensor([1, 2])) == 2  # one stopped early


def test_leading_gap_change_measures_how_far_the_top_two_moved():
    uncached = torch.tensor([[4.0, 1.0, 0.0], [0.0, 2.0, 2.5]])
    cached = torch.tensor([[4.0, 1.0, 0.0], [0.0, 2.125, 2.5]])  # one rounding step on the runner-up
    assert leading_gap_change(cached, uncached).tolist() == pytest.approx([0.0, 0.125])


def make_report() -> NearTieReport:
    uncached = torch.tensor([
        [9.0, 1.0, 0.0, 0.0],  # a clear winner: token 0
        [0.0, 3.0, 3.03125, 0.0],  # a near-tie: token 2 leads token 1 by 1/32
        [0.0, 0.0, 0.0, 7.0],  # a clear winner: token 3
    ])
    cached = uncached.clone()
    cached[1, 1] += 0.0625  # the cached forward rounded token 1 up past it: vanilla chose token 1
    vanilla = torch.tensor([0, 1, 3])
    report = NearTieReport()
    report.add_prompt(
        FixedLogitsTarget(uncached), PROMPT, vanilla, cached,
        {"same": vanilla.clone(), "tie": torch.tensor([0, 2, 3]), "wrong": torch.tensor([1, 1, 3]),
         "short": torch.tensor([0, 1])},
    )
    return report


def test_a_divergence_at_a_tie_is_a_near_tie_and_a_clear_disagreement_is_not():
    report = make_report()
    assert report.rounding_scale == pytest.approx(0.0625)
    assert report.vanilla_self_identical == [False]  # its uncached recomputation would choose token 2
    same, tie, wrong, short = (report.summary(name) for name in ("same", "tie", "wrong", "short"))
    assert same["identical"] == 1 and same["near_tie_divergences"] == 0 and same["real_divergences"] == 0
    assert tie["near_tie_divergences"] == 1 and tie["divergence_gaps"] == [0.03125]
    assert wrong["real_divergences"] == 1 and wrong["divergence_gaps"] == [8.0]
    assert short["real_divergences"] == 1  # an output that stops early leaves no token to weigh: never excused
    assert "1 near-tie divergences, 0 real divergences" in describe(tie)


def test_the_threshold_is_the_whole_runs_rounding_scale():
    report = make_report()
    exact_tie = torch.eye(3, 4) * 5
    exact_tie[2, 3] = 5.0  # tokens 2 and 3 tie exactly; vanilla (argmax) took 2
    quiet = NearTieReport()
    quiet.add_prompt(FixedLogitsTarget(exact_tie), PROMPT, torch.tensor([0, 1, 2]), exact_tie,
                     {"tie": torch.tensor([0, 1, 3])})
    assert quiet.rounding_scale == 0.0 and quiet.summary("tie")["near_tie_divergences"] == 1  # a real tie
    merged = NearTieReport.merged([report, quiet])
    assert merged.rounding_scale == pytest.approx(0.0625)
    assert merged.summary("tie")["near_tie_divergences"] == 2 and merged.summary("tie")["prompts"] == 2
