"""The step planner: what the decode loop does next, and what it learns from each step.

A step is one of three kinds:

    Step("plain")                          one ordinary decoding step of the target
    Step("lookup", k, chain=tokens)        verify k tokens copied from earlier in the context, as a chain
    Step("tree", b, arm=p)                 draft, build a tree of budget b with tree policy p, verify it

`StepPlanner.next_step` decides from the committed text (context lookup: `dart_hf.lookup`) and the budget
controller (`dart_hf.budget`); the caller runs the step and tells the planner its outcome (`record_plain`,
`record_lookup`, `record_tree`), which the controller learns from and every observer sees. The decode loop
(`dart_hf.generation`) executes the steps; `benchmarks/controller_replay.py` simulates them under a cost model;
both through this one planner, so the replay's decisions are the loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .controller_state import ModeEvidence
from .lookup import LookupTracker, find_continuations
from .tree import Tree


@dataclass
class Step:
    """One decided step. budget: a tree's nodes below the root, or a lookup chain's tokens (0 for a plain step);
    arm: the index of the tree policy that drafts a tree; chain: a lookup step's tokens `[k]`; probe: a tree drafted
    while drafting loses to plain decoding, to see whether it pays again."""

    kind: str
    budget: int = 0
    arm: int = 0
    chain: np.ndarray | None = None
    probe: bool = False


@dataclass
class StepOutcome:
    """What a step did, as the planner is told it: the nodes of its target forward (root included; 1 for a plain
    step), that forward's seconds, the step's seconds outside it (draft, tree search, acceptance, cache
    compaction), and for a drafted tree the tree with its accepted node path (root first). Observers receive one
    per step, with the planner."""

    step: Step
    nodes: int
    forward_seconds: float | None
    overhead_seconds: float
    tree: Tree | None = None
    path: list[int] | None = None


class StepPlanner:
    """Decides each step of one `generate` call with `controller` (an `AdaptiveBudget`, a `PolicyChoice` or a
    `FixedBudget`), weighing context-lookup chains of up to `lookup_length` tokens (0: none) found after matching
    up to `lookup_max_match` tokens. evidence: where `finish` saves what the next call goes on from (None: nothing
    is saved). observers: callables given each step's `StepOutcome` and the planner."""

    def __init__(
        self,
        controller,
        lookup_length: int = 0,
        lookup_max_match: int = 3,
        evidence: ModeEvidence | None = None,
        observers: list[Callable[[StepOutcome, StepPlanner], None]] | tuple = (),
    ):
        self.controller = controller
        self.lookup_length = lookup_length
        self.lookup_max_match = lookup_max_match
        self.lookups = LookupTracker() if lookup_length else None
        self.evidence = evidence
        self.observers = list(observers)

    def next_step(self, context: np.ndarray | torch.Tensor, room: int) -> Step:
        """The next step after the committed tokens `context` `[S]` (no padding; a tensor is copied to the host only
        when context lookup reads it); `room`: the tokens the length
        limit still lets in after the one the step is sure to commit (a chain of k tokens commits up to k + 1, so a
        longer one than `room` is waste)."""
        if self.lookups is not None:  # score earlier continuations on what was committed since, then look up this one
            if isinstance(context, torch.Tensor):
                context = context.cpu().numpy()
            for kind, matched in self.lookups.resolve(context):
                self.controller.lookup.record(kind, matched)
            candidates = find_continuations(context, self.lookup_max_match, self.lookup_length)
            for kind, continuation in candidates:
                self.lookups.propose(context, kind, continuation)
            chosen, length = self.controller.lookup_choice([(kind, min(c.size, room)) for kind, c in candidates])
            if length:
                return Step("lookup", length, chain=candidates[chosen][1][:length])
        budget = self.controller.next_budget()
        if budget == 0:
            return Step("plain")
        return Step("tree", budget, arm=self.controller.arm, probe=self.controller.lost_probes > 0)

    def forward_layout(self, nodes: int) -> tuple[int | None, bool]:
        """(rows, weight_major) for a verify forward over `nodes` nodes (`forward_tree`'s arguments)."""
        return self.controller.forward_layout(nodes)

    def record_plain(self, step: Step, forward_seconds: float | None) -> None:
        self.controller.record_plain_step(forward_seconds)
        self._observe(StepOutcome(step, 1, forward_seconds, 0.0))

    def record_lookup(self, step: Step, overhead_seconds: float, forward_seconds: float | None) -> None:
        self.controller.record_lookup_step(overhead_seconds, step.budget + 1, forward_seconds)
        self._observe(StepOutcome(step, step.budget + 1, forward_seconds, overhead_seconds))

    def record_tree(
        self, step: Step, tree: Tree, path: list[int], overhead_seconds: float, forward_seconds: float | None
    ) -> None:
        """After a verified tree: `path` is its accepted node path, root first."""
        self.controller.record_step(tree, path, step.budget, overhead_seconds, forward_seconds)
        self._observe(StepOutcome(step, len(tree), forward_seconds, overhead_seconds, tree, path))

    def finish(self) -> None:
        """The call is over: save what the next call goes on from."""
        if self.evidence is not None:
            self.controller.save(self.evidence)

    def _observe(self, outcome: StepOutcome) -> None:
        for observer in self.observers:
            observer(outcome, self)
