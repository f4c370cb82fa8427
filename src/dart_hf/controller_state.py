"""What the decode loop's budget controller remembers across `generate` calls, in one object the draft owns.

The controller (`dart_hf.budget`) decides each step from measured costs (`dart_hf.costs`) and from what earlier
steps showed: the records here (`StepRecord`, `LookupEvidence`, `ForwardTimings`). The
costs are calibrated once (per target model and machine; the draft's own forward once per draft); the evidence
grows with every verified step and is kept per decoding mode, since greedy decoding accepts far more drafted
tokens than sampling at T=1 on the same text. `ControllerState` holds both; `draft.controller_state` is the one a
draft uses. Resetting, copying and swapping it are methods here, so a benchmark can give each method its own
evidence and drop what a warm-up left.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from .costs import DraftCosts, ForwardCosts

@dataclass
class StepRecord:
    """One verified step: the budget it used and, for every m, whether the accepted path survives budget m:
    `path_ranks[i]` is the largest rank among the first i + 1 accepted drafted nodes. overhead_seconds: the step's
    time outside the target's forward (draft, tree search, acceptance, cache compaction)."""

    budget: int
    path_ranks: np.ndarray
    overhead_seconds: float = 0.0


@dataclass
class LookupEvidence:
    """What context lookup has shown, shared across `generate` calls like the tree history: per kind of lookup
    (a key such as `dart_hf.lookup.find_continuations` gives: the match length n, whether the earlier occurrences
    disagree on what follows, which occurrence), how many leading tokens of recent continuations the committed
    text matched (the last `window`, each stamped with the count of outcomes recorded before it); and the seconds
    recent lookup steps spent outside the target's forward (acceptance, cache compaction). A tuple kind's
    outcomes also count for its pool, its first element alone (the match length), which `evidence` falls back to
    for a kind with too little of its own.

    Evidence fades with a half-life of `half_life` outcomes of any kind: a kind that turns rare after a change of
    text (three-token repeats, common in code, rare in prose) would otherwise keep the old text's acceptance for
    hundreds of steps."""

    matched: dict[Hashable, deque] = field(default_factory=dict)
    overheads: deque = field(default_factory=lambda: deque(maxlen=16))
    window: int = 64
    half_life: float = 64.0
    clock: int = 0

    @staticmethod
    def pool(kind: Hashable) -> Hashable | None:
        """The kind whose evidence pools `kind`'s with its siblings': (n,) for a tuple kind (n, ...), else None."""
        return kind[:1] if isinstance(kind, tuple) and len(kind) > 1 else None

    def record(self, kind: Hashable, matched: int) -> None:
        """One outcome of a lookup of `kind` (also counted for its pool)."""
        for key in (kind, self.pool(kind)):
            if key is not None:
                self.matched.setdefault(key, deque(maxlen=self.window)).append((self.clock, matched))
        self.clock += 1

    def outcomes(self, kind: Hashable) -> tuple[np.ndarray, np.ndarray]:
        """(matched counts `[R]`, weights `[R]`) for lookups of `kind`: an outcome recorded `a` outcomes (of any
        kind) ago weighs 0.5 ** (a / half_life)."""
        entries = self.matched.get(kind)
        if not entries:
            return np.zeros(0, np.int64), np.zeros(0)
        clocks, matched = np.array(entries, dtype=np.int64).T
        return matched, 0.5 ** ((self.clock - 1 - clocks) / self.half_life)

    def evidence(self, kind: Hashable, min_weight: float) -> tuple[np.ndarray, np.ndarray]:
        """`outcomes(kind)`, or its pool's when the kind's own weigh less than `min_weight` (a rare kind)."""
        matched, weights = self.outcomes(kind)
        pool = self.pool(kind)
        if pool is not None and weights.sum() < min_weight:
            return self.outcomes(pool)
        return matched, weights


@dataclass
class ForwardTimings:
    """Recent target forwards' measured seconds as multiples of their calibrated cost, for plain steps and for
    verify steps (trees and lookup chains), shared across `generate` calls like the step history. `scale` is the
    median of the last `window` (1.0 until `min_evidence` are in; a kind without its own uses the other's);
    window=0 keeps the calibrated costs as they are."""

    window: int = 32
    min_evidence: int = 4
    plain: deque | None = None  # ratios of plain steps' forwards (a deque of at most `window`)
    verify: deque | None = None

    def __post_init__(self):
        self.plain = deque(maxlen=self.window) if self.plain is None else self.plain
        self.verify = deque(maxlen=self.window) if self.verify is None else self.verify

    def scale(self, kind: str) -> float:
        """The factor for f in a step of `kind` ("plain" or "verify")."""
        own, other = (self.plain, self.verify) if kind == "plain" else (self.verify, self.plain)
        for ratios in (own, other):
            if len(ratios) >= self.min_evidence:
                return float(np.median(ratios))
        return 1.0


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
        """Make `mode` current (`options.decoding_mode`): the last mode's evidence is set aside and `mode`'s is
        taken up (none at first), so greedy acceptance never decides a sampling call's budget, nor the reverse."""
        if self.mode is not None and self.mode != mode:
            self.set_aside[self.mode] = self.current
            self.current = self.set_aside.pop(mode, None) or ModeEvidence()
        self.mode = mode
        return self.current


@dataclass
class ControllerState:
    """The controller's memory across `generate` calls.

    forward_costs: the target's calibrated tree-forward costs, per `costs.calibration_key` (model, dtype, device,
    threads). draft_costs: the draft's forward per level count (`costs.calibrate_draft_costs`), None until the
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
