"""What the decode loop's budget controller remembers across `generate` calls, in one object the draft owns.

The controller (`dart_hf.budget`) decides each step from measured costs and from what earlier steps accepted. The
costs are calibrated once (per target model and machine; the draft's own forward once per draft); the evidence
grows with every verified step and is kept per decoding mode, since greedy decoding accepts far more drafted
tokens than sampling at T=1 on the same text. `ControllerState` holds both; `draft.controller_state` is the one a
draft uses. Resetting, copying and swapping it are methods here, so a benchmark can give each method its own
evidence and drop what a warm-up left.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

from .budget import DraftCosts, ForwardCosts, ForwardTimings, LookupEvidence, StepRecord

HISTORY_LENGTH = 64  # verified steps of evidence per tree policy: acceptance varies with the text


def _history() -> deque[StepRecord]:
    return deque(maxlen=HISTORY_LENGTH)


@dataclass
class ModeEvidence:
    """What the steps of one decoding mode have shown.

    acceptance: the verified steps of the first tree policy (`StepRecord`s); second_policy_acceptance: those of the
    second one when sampling weighs two (the drawn chain, then the deterministic tree: `budget.PolicyChoice`).
    lookup: context-lookup outcomes. plain_run: plain steps since the last drafted one, and lost_probes: probes in a
    row that lost to plain decoding; both carry the probes' spacing across calls (a wait longer than one call)."""

    acceptance: deque[StepRecord] = field(default_factory=_history)
    second_policy_acceptance: deque[StepRecord] = field(default_factory=_history)
    lookup: LookupEvidence = field(default_factory=LookupEvidence)
    plain_run: int = 0
    lost_probes: int = 0


@dataclass
class DecodingEvidence:
    """The evidence of every decoding mode: the current mode's, the others' set aside, and the recent forwards'
    timings against their calibrated cost. This is what `ControllerState.swap_evidence` exchanges."""

    mode: tuple | None = None  # None: no call yet; the current evidence is taken as the next call's mode's
    current: ModeEvidence = field(default_factory=ModeEvidence)
    set_aside: dict[tuple, ModeEvidence] = field(default_factory=dict)
    timings: ForwardTimings = field(default_factory=ForwardTimings)

    def select_mode(self, mode: tuple) -> ModeEvidence:
        """Make `mode` current (`generation.decoding_mode`): the last mode's evidence is set aside and `mode`'s is
        taken up (none at first), so greedy acceptance never decides a sampling call's budget, nor the reverse."""
        if self.mode is not None and self.mode != mode:
            self.set_aside[self.mode] = self.current
            self.current = self.set_aside.pop(mode, None) or ModeEvidence()
        self.mode = mode
        return self.current


@dataclass
class ControllerState:
    """The controller's memory across `generate` calls.

    forward_costs: the target's calibrated tree-forward costs, per `budget.calibration_key` (model, dtype, device,
    threads). draft_costs: the draft's forward per level count (`budget.calibrate_draft_costs`), None until the
    first adaptive call. evidence: `DecodingEvidence`.

    pinned: the controller's measured inputs are fixed (`pin`): the given forward costs for any target, the given
    draft costs, and steps recorded with no overhead outside the target's forward and no timing of their forwards
    (`AdaptiveBudget(timed=False)`).
    Its decisions then depend on the text alone: tests and replays use it; decoding stays lossless either way."""

    forward_costs: dict[str, ForwardCosts] = field(default_factory=dict)
    draft_costs: DraftCosts | None = None
    evidence: DecodingEvidence = field(default_factory=DecodingEvidence)
    pinned: bool = False

    def reset(self) -> None:
        """Forget the evidence of every mode; keep the calibrations."""
        self.evidence = DecodingEvidence()

    def swap_evidence(self, evidence: DecodingEvidence | None) -> DecodingEvidence:
        """Take `evidence` (fresh where None) and return the evidence held until now: lets two decoding setups
        share one draft without sharing evidence, and a warm-up call leave none behind."""
        held = self.evidence
        self.evidence = evidence if evidence is not None else DecodingEvidence()
        return held

    def copy(self) -> ControllerState:
        """An independent copy (calibrations and evidence)."""
        return copy.deepcopy(self)

    def pin(self, forward_costs: ForwardCosts, draft_costs: DraftCosts | None = None) -> None:
        """Fix the controller's measured inputs (see the class docstring): `forward_costs` for every target, and
        `draft_costs` (default: a free draft forward). Resets the evidence."""
        self.pinned = True
        self.forward_costs = {"pinned": forward_costs}
        self.draft_costs = draft_costs if draft_costs is not None else DraftCosts([0.0])
        self.reset()

    def costs_for(self, key: str) -> ForwardCosts | None:
        """The forward costs for the target with calibration key `key`: the pinned ones, or its calibration."""
        return self.forward_costs["pinned"] if self.pinned else self.forward_costs.get(key)
