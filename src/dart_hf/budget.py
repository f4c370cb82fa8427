"""Choosing the tree budget per step from measured costs and acceptance; plain decoding when drafting loses.

A DART step runs the target once over a tree of n nodes (cost f(n)) plus the draft, the tree search, the acceptance
and the cache compaction (cost o(m)), and commits tau(m) tokens on average for a tree budget m. Plain decoding
commits one token per f(1). So:

- f is measured once per model, dtype, device and thread count (`costs.calibrate_forward_costs`) and cached on
  disk: on a GPU f is nearly flat up to tens of nodes, on a CPU a large tree costs several one-token forwards.
- tau(m) is estimated from the steps already verified. A policy's tree of budget m is its m best nodes (the
  `Tree.ranks` <= m), so one step verified with budget b tells what every budget m <= b would have accepted.
- f is the fastest of several runs at a 128-token context; during generation the context is longer and the
  machine busier, and not by the same factor for one token as for a tree. `ForwardTimings` keeps recent forwards'
  measured seconds as multiples of f, per kind of step, and decisions scale f by their medians.
- o(m) is the draft's forward for the min(m, draft length) levels a tree of budget m can reach, measured once per
  draft (`costs.calibrate_draft_costs`), plus the rest of recent steps' measured overhead: a one-level drawn
  chain is then not priced with an eight-level probe's draft forward (which at T=1 would send such chains to
  plain decoding).
- `AdaptiveBudget` picks the m with the lowest cost per token, (o(m) + f(m + 1)) / tau(m); when even that loses to
  f(1), it decodes plainly and probes with a tree now and then to notice when drafting pays again. A probe costs
  its expected loss, tau(m) times the gap per token, so it waits for as many plain steps as keep probes' losses
  under `probe_share` of the plain decoding time: a tree that nearly pays is probed every few steps (so the
  evidence follows a change of text quickly), one that loses badly rarely. Each probe in a row that lost doubles
  the wait (up to `max_probe_interval`), and one that beat plain decoding restarts it: text where drafting loses
  tends to go on being such text, and at a fixed share a long stretch of it paid the whole share
  (`docs/HISTORY.md`). A probe is at least `first_budget`'s tree, so that it refreshes the evidence of every
  budget that could pay. Every `explore_every` steps it tries twice the chosen budget, which is how larger budgets
  get evidence. With no evidence at all it starts with the largest tree that costs at most twice one token
  (`first_budget`). Where a forward runs padded to a faster size (`costs.ForwardCosts.rows`: on a CPU some sizes
  cost more than a larger one), the budgets grow to fill the padded rows with nodes (`AdaptiveBudget.filled`).
- Context lookup (`dart_hf.lookup`) chains are scored on every step for free, so `lookup_choice` needs no probes:
  of a step's candidate chains it verifies the prefix of length k with the lowest (o_lookup + f(k + 1)) /
  tau_lookup(k) when that beats both plain decoding and the drafted tree; tau_lookup is measured per kind of
  candidate: its match length n (a continuation found after matching 3 tokens is far likelier to hold than one
  found after matching 1), whether the earlier occurrences disagree on what follows, and which occurrence it
  follows (the latest or the earliest), recent outcomes weighing more.
- When sampling, two tree policies compete (`PolicyChoice`): the drawn chain and the deterministic tree, each with
  its own `AdaptiveBudget` and acceptance evidence; a step drafts with the one that is cheaper per token.
- `FixedBudget` is the controller of a call without `adaptive`: every step a tree of the largest budget.

Every controller answers the same questions (`next_budget`, `arm`, `lookup_choice`, `forward_layout`) and is told
the outcome of each step (`record_step`, `record_lookup_step`, `record_plain_step`); `save` writes what carries
over to the next call back into the draft's `ControllerState`. `dart_hf.planner` asks them; nothing else does.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Hashable

import numpy as np
import torch

from .controller_state import ControllerState, ForwardTimings, LookupEvidence, ModeEvidence, StepRecord
from .costs import (
    CANDIDATE_BUDGETS,
    DraftCosts,
    ForwardCosts,
    calibrate_batch_forward_costs,
    calibrate_draft_costs,
    calibrate_forward_costs,
    calibration_key,
)
from .tree import Tree


def candidate_budgets(max_budget: int) -> list[int]:
    """The budgets a controller weighs for trees of at most `max_budget` nodes below the root, before filling."""
    return [b for b in CANDIDATE_BUDGETS if b < max_budget] + [max_budget]


class AdaptiveBudget:
    """Per-step choice of the tree budget (0 = one plain decoding step), from `ForwardCosts` and the acceptance
    `history` (a deque of `StepRecord`, shared across `generate` calls so later calls start informed, the
    measured overhead of a tree step included), the `lookup` evidence and the `timings` of recent forwards; with
    `draft_costs`, each budget's overhead counts the draft forward of its own levels."""

    def __init__(
        self,
        costs: ForwardCosts,
        max_budget: int,
        history: deque,
        probe_share: float = 0.03,
        max_probe_interval: int = 128,
        explore_every: int = 16,
        min_evidence: int = 4,
        first_cost: float = 2.0,
        overhead_window: int = 16,
        lookup: LookupEvidence | None = None,
        timings: ForwardTimings | None = None,
        plain_run: int = 0,
        lost_probes: int = 0,
        draft_costs: DraftCosts | None = None,
        timed: bool = True,
    ):
        self.costs = costs
        self.draft_costs = draft_costs
        self.max_budget = max_budget
        self.history = history
        self.probe_share = probe_share
        self.max_probe_interval = max_probe_interval
        self.explore_every = explore_every
        self.min_evidence = min_evidence
        self.first_cost = first_cost
        self.overhead_window = overhead_window  # the overhead is the mean of this many recent steps'
        self.plain_run = plain_run  # plain steps since the last tree, carried across calls by the caller
        self.lost_probes = lost_probes  # probes in a row that lost, carried across calls by the caller
        self._estimates = None  # cached_estimate() until the next record_step
        self.steps = 0
        self.budgets = sorted({self.filled(b) for b in candidate_budgets(max_budget)})
        self.lookup = lookup if lookup is not None else LookupEvidence()
        self.timings = timings if timings is not None else ForwardTimings()
        self.timed = timed  # False: steps record no overhead and no forward timing (`ControllerState.pin`)

    arm = 0  # the index of the tree policy a step drafts with: one policy (`PolicyChoice` weighs several)

    def filled(self, budget: int) -> int:
        """`budget`, grown to fill the rows that its tree's forward would be padded to (`ForwardCosts.rows`) where
        that stays within `max_budget`: the same forward, with nodes that may be accepted instead of pad rows."""
        grown = self.costs.rows(budget + 1) - 1
        return grown if grown <= self.max_budget else budget

    def forward_layout(self, nodes: int) -> tuple[int, bool]:
        """(rows, weight_major) of a verify forward over `nodes` nodes: padded where a larger size measured
        faster (`ForwardCosts.rows`), in the faster layout of the linear layers' products there."""
        rows = self.costs.rows(nodes)
        return rows, self.costs.weight_major(rows)

    def save(self, evidence: ModeEvidence) -> None:
        """Write what the next call goes on from into `evidence`: probes are spaced over the decoding stream, so
        the plain steps since the last drafted one and the probes in a row that lost carry over."""
        evidence.plain_run, evidence.lost_probes = self.plain_run, self.lost_probes

    def plain_cost(self) -> float:
        """Expected seconds of one plain decoding step's forward."""
        return self.costs(1) * self.timings.scale("plain")

    def verify_costs(self, nodes: list[int] | np.ndarray) -> np.ndarray:
        """Expected seconds of one verify forward over each of `nodes` node counts (root included) `[K]`."""
        return np.array([self.costs(int(n)) for n in nodes]) * self.timings.scale("verify")

    def estimate(self) -> dict[int, tuple[float, float]]:
        """{budget m: (estimated tau(m), estimated seconds per committed token)} for the budgets with evidence."""
        if not self.history:
            return {}
        recent = list(self.history)[-self.overhead_window :]
        draft_seconds = self.draft_costs or (lambda budget: 0.0)
        # the recent steps' overhead besides the draft forward, plus the draft forward of each budget's levels
        other_overhead = max(float(np.mean([r.overhead_seconds - draft_seconds(r.budget) for r in recent])), 0.0)
        record_budgets = np.array([r.budget for r in self.history])  # [R]
        depth = max(r.path_ranks.size for r in self.history)
        ranks = np.full((len(self.history), depth), np.iinfo(np.int64).max)  # [R, D], padded past each path
        for row, record in enumerate(self.history):
            ranks[row, : record.path_ranks.size] = record.path_ranks
        estimates = {}
        for budget, forward_seconds in zip(self.budgets, self.verify_costs([b + 1 for b in self.budgets])):
            has_evidence = record_budgets >= budget
            if has_evidence.sum() < self.min_evidence:
                continue
            tau = self.expected_tau((ranks[has_evidence] <= budget).sum(axis=1))
            overhead = other_overhead + draft_seconds(budget)
            estimates[budget] = (tau, (overhead + float(forward_seconds)) / tau)
        return estimates

    def expected_tau(self, accepted_drafted: np.ndarray) -> float:
        """tau from the drafted tokens that the evidence's steps would have accepted at one budget `[R]`: their
        mean, plus the bonus token."""
        return 1.0 + float(accepted_drafted.mean())

    def cached_estimate(self) -> dict[int, tuple[float, float]]:
        """`estimate()`, kept until the next verified step, since plain steps change neither the history nor the
        overhead (plain steps ask for it on every step: `probe_wait`)."""
        if self._estimates is None:
            self._estimates = self.estimate()
        return self._estimates

    def best(self) -> tuple[int | None, float, float]:
        """The budget with the lowest estimated seconds per token (None without evidence), that cost and its tau."""
        estimates = self.cached_estimate()
        if not estimates:
            return None, float("inf"), 1.0
        budget = min(estimates, key=lambda m: estimates[m][1])
        return budget, estimates[budget][1], estimates[budget][0]

    def probe_budget(self) -> int:
        """The budget of a probe while drafting loses: the best budget, or `first_budget` where that is larger. A
        step tells what every budget up to its own would have accepted, so a probe of the largest tree that costs
        at most `first_cost` one-token forwards refreshes the evidence of every budget that could pay; the best
        budget alone is often the cheapest (budget 1, whose tau cannot pass 2), and probing only it would let the
        larger budgets' records fall out of the history until none but the smallest had an estimate."""
        budget = self.best()[0]
        return self.first_budget() if budget is None else max(budget, self.first_budget())

    def probe_wait(self) -> int:
        """Plain steps between probes while drafting loses: a probe's expected loss over plain decoding (tau times
        the gap per token, at the probe's budget where that has an estimate) spread so that the first probe after
        drafting stopped paying costs at most `probe_share` of the plain decoding time, and doubled for every probe
        in a row that lost since (`lost_probes`), up to `max_probe_interval` steps."""
        _, seconds_per_token, tau = self.best()
        tau, seconds_per_token = self.cached_estimate().get(self.probe_budget(), (tau, seconds_per_token))
        plain = self.plain_cost()
        loss = tau * (seconds_per_token - plain) * 2.0 ** min(self.lost_probes, 30)
        return min(math.ceil(loss / (self.probe_share * plain)), self.max_probe_interval)

    def first_budget(self) -> int:
        """The budget while there is no evidence yet: the largest whose forward costs at most `first_cost` one-token
        forwards. On a GPU, where a tree costs about what one token does, that is the full tree; on a CPU, where a
        large tree costs several tokens, a smaller one. Its steps tell what every smaller budget would have
        accepted; larger ones are reached by exploration."""
        affordable = [b for b in self.budgets if self.costs(b + 1) <= self.first_cost * self.costs(1)]
        return max(affordable, default=self.budgets[0])

    def next_budget(self) -> int:
        """The budget for the next step; 0 means a plain decoding step."""
        budget, seconds_per_token, _ = self.best()
        if budget is None:
            return self.first_budget()
        if seconds_per_token >= self.plain_cost():  # drafting loses to plain decoding
            if self.plain_run >= self.probe_wait():
                self.lost_probes += 1
                return self.probe_budget()  # a probe: does drafting pay again? (its record resets the plain run)
            return 0
        self.lost_probes = 0
        self.steps += 1
        if self.steps % self.explore_every == 0 and budget < self.max_budget:
            return self.filled(min(2 * budget, self.max_budget))
        return budget

    def lookup_estimate(self, kind: Hashable, available: int) -> tuple[float, int]:
        """(lowest estimated seconds per token, the chain length that gets it, grown into the rows its forward
        is padded to) for verifying a context-lookup continuation of `kind` (its key in the lookup evidence) with
        `available` tokens; (inf, 0) without a continuation or enough evidence."""
        matched, weights = self.lookup.evidence(kind, self.min_evidence)
        total_weight = weights.sum()
        if not available or total_weight < self.min_evidence:
            return math.inf, 0
        counts = np.arange(available + 1)  # [K + 1]: 0 to K matched tokens
        lengths = counts[1:]  # [K]
        # tau(L) = 1 + sum_i w_i min(m_i, L) / sum_i w_i for every L, from the weight histogram of the matched counts:
        # O(R + K), and no BLAS call (OpenBLAS threads spinning after one starve the target's next forward)
        histogram = np.bincount(np.minimum(matched, available), weights=weights, minlength=available + 1)  # [K + 1]
        below = np.cumsum(histogram * counts)[1:]  # sum of w_i m_i over m_i <= L
        above = total_weight - np.cumsum(histogram)[1:]  # sum of w_i over m_i > L
        taus = 1.0 + (below + lengths * above) / total_weight  # [K]
        overhead = float(np.mean(self.lookup.overheads)) if self.lookup.overheads else 0.0
        seconds_per_token = (overhead + self.verify_costs(lengths + 1)) / taus
        best = int(seconds_per_token.argmin())
        # the chain's forward padded to a faster size verifies more of the continuation in those rows, for free
        length = min(self.costs.rows(int(lengths[best]) + 1) - 1, available)
        return float(seconds_per_token[best]), length

    def lookup_choice(self, candidates: list[tuple[Hashable, int]]) -> tuple[int, int]:
        """Which context-lookup continuation to verify this step, and how many of its tokens: (index into
        `candidates`, length), the one with the lowest estimated seconds per token if that beats both plain
        decoding and the drafted tree, else (-1, 0). candidates: (kind, available tokens) of each continuation."""
        estimates = [self.lookup_estimate(kind, available) for kind, available in candidates]
        if not estimates:
            return -1, 0
        index = min(range(len(estimates)), key=lambda i: estimates[i][0])
        seconds_per_token, length = estimates[index]
        if seconds_per_token < min(self.plain_cost(), self.best()[1]):
            return index, length
        return -1, 0

    def lookup_length(self, kind: Hashable, available: int) -> int:
        """`lookup_choice` for one continuation: how many of its tokens to verify (0: none)."""
        return self.lookup_choice([(kind, available)])[1]

    def record_lookup_step(self, overhead_seconds: float, nodes: int, forward_seconds: float | None = None) -> None:
        """After a verified lookup chain: its seconds outside the target's forward, and its forward's seconds over
        `nodes` nodes (root included)."""
        if not self.timed:
            overhead_seconds, forward_seconds = 0.0, None
        self.lookup.overheads.append(overhead_seconds)
        self.record_forward("verify", nodes, forward_seconds)
        self._estimates = None  # the verify forwards' scale moved

    def record_step(
        self, tree: Tree, path: list[int], budget: int, overhead_seconds: float, forward_seconds: float | None = None
    ) -> None:
        """After a verified step: the tree, its accepted node path (root first), the budget it was built with, the
        seconds the step spent outside the target's forward (draft, tree search, acceptance, compaction) and in
        it."""
        if not self.timed:
            overhead_seconds, forward_seconds = 0.0, None
        ranks = tree.ranks if tree.ranks is not None else torch.arange(len(tree))
        path_ranks = np.maximum.accumulate(ranks[path[1:]].numpy()) if len(path) > 1 else np.zeros(0, np.int64)
        self.history.append(StepRecord(budget, path_ranks, overhead_seconds))
        self.record_forward("verify", len(tree), forward_seconds)
        self._estimates = None
        self.plain_run = 0
        if self.lost_probes:  # a probe: one that beat plain decoding restarts the wait (the text may have changed)
            seconds = overhead_seconds + (forward_seconds or float(self.verify_costs([len(tree)])[0]))
            if len(path) * self.plain_cost() >= seconds:
                self.lost_probes = 0

    def record_plain_step(self, forward_seconds: float | None = None) -> None:
        """After a plain decoding step (counts towards the next probe), with its forward's seconds."""
        self.record_forward("plain", 1, forward_seconds)
        self.plain_run += 1

    def record_forward(self, kind: str, nodes: int, seconds: float | None) -> None:
        """A target forward of `kind` ("plain" or "verify") over `nodes` nodes took `seconds` (None: untimed)."""
        if seconds is not None and self.timed:  # (a window of 0 keeps nothing)
            (self.timings.plain if kind == "plain" else self.timings.verify).append(seconds / self.costs(nodes))


class PolicyChoice:
    """Per-step choice between tree policies, each with its own `AdaptiveBudget` (its own acceptance history and
    largest budget; the forward costs, the timings and the lookup evidence shared). When sampling, DART weighs the
    drawn chain (`SampledChainPolicy`) against the deterministic tree: which one is faster depends on the hardware.
    A drawn token is accepted more often than a deterministic top-1 guess, but the chain is one node per drafted
    level, so its acceptance saturates; the deterministic tree accepts more with every node it adds, which pays
    where a large tree costs about one token's forward (a GPU) and not where it costs several (a CPU).

    The policy whose controller estimates the lowest seconds per token (its `best`) decides each step: a plain
    decoding step, or a tree of its budget. Of those drafted steps, every `explore_every`-th goes to the runner-up
    at its own best budget, so that its evidence follows the text; while a policy has no estimate yet, every other
    one does. While drafting loses to plain decoding the drafted steps are probes, and they go to the policies by
    turns: a policy that is probed no more would keep the evidence it had when it fell behind. Each waits as its
    own probe's expected loss says (`AdaptiveBudget.probe_wait`), so that a dear policy's probe (a wide tree on a
    CPU) is not spaced as a cheap one's. A plain step counts towards every policy's next probe, a verified step
    ends every policy's plain run, and the probes in a row that lost are counted across the policies. `arm`
    is the index of the policy that drafts the step `next_budget` decided.
    """

    def __init__(self, controllers: list[AdaptiveBudget], explore_every: int = 16):
        if len(controllers) < 2:
            raise ValueError(f"PolicyChoice needs at least two policies' controllers, got {len(controllers)}.")
        self.controllers = controllers
        self.explore_every = explore_every
        self.arm = 0
        self.drafted = 0  # drafted steps decided, probes included
        self.probes = 0

    @property
    def lookup(self) -> LookupEvidence:
        return self.controllers[0].lookup

    @property
    def costs(self) -> ForwardCosts:
        return self.controllers[0].costs  # the policies share them

    @property
    def plain_run(self) -> int:
        return self.controllers[0].plain_run

    @property
    def lost_probes(self) -> int:
        return self.controllers[0].lost_probes

    def best(self) -> tuple[int | None, float, float]:
        """The chosen policy's `best` (budget, seconds per token, tau): the lowest seconds per token of any."""
        return min((controller.best() for controller in self.controllers), key=lambda best: best[1])

    def next_budget(self) -> int:
        """The budget for the next step (0: a plain decoding step), drafted with the policy `arm`."""
        ranked = sorted(range(len(self.controllers)), key=lambda i: self.controllers[i].best()[1])
        fastest = self.controllers[ranked[0]]
        if fastest.best()[0] is not None and fastest.best()[1] >= fastest.plain_cost():  # every policy loses
            self.arm = self.probes % len(self.controllers)  # probes by turns, each after its own wait
            probed = self.controllers[self.arm]
            budget = probed.next_budget()  # 0, or its probe (its first tree while it has no evidence)
            if budget:
                self.probes += 1
                self.drafted += 1
                for controller in self.controllers:  # the count is kept alike on every policy
                    controller.lost_probes = probed.lost_probes
            return budget
        for controller in self.controllers:
            controller.lost_probes = 0
        self.arm = ranked[0]
        budget = fastest.next_budget()
        self.drafted += 1
        untried = [i for i in ranked[1:] if self.controllers[i].best()[0] is None]
        if self.drafted % (2 if untried else self.explore_every) == 0:
            self.arm = untried[0] if untried else ranked[1]
        if self.arm == ranked[0]:
            return budget
        chosen = self.controllers[self.arm]
        return chosen.best()[0] or chosen.first_budget()

    def forward_layout(self, nodes: int) -> tuple[int, bool]:
        return self.controllers[0].forward_layout(nodes)

    def save(self, evidence: ModeEvidence) -> None:
        self.controllers[0].save(evidence)

    def lookup_choice(self, candidates: list[tuple[Hashable, int]]) -> tuple[int, int]:
        """`AdaptiveBudget.lookup_choice` against the fastest policy's drafted tree."""
        fastest = min(self.controllers, key=lambda controller: controller.best()[1])
        return fastest.lookup_choice(candidates)

    def record_lookup_step(self, overhead_seconds: float, nodes: int, forward_seconds: float | None = None) -> None:
        self.controllers[0].record_lookup_step(overhead_seconds, nodes, forward_seconds)
        self._timings_moved()

    def record_step(
        self, tree: Tree, path: list[int], budget: int, overhead_seconds: float, forward_seconds: float | None = None
    ) -> None:
        """`AdaptiveBudget.record_step` of the policy `arm`, which built `tree`."""
        self.controllers[self.arm].record_step(tree, path, budget, overhead_seconds, forward_seconds)
        self._timings_moved()
        for controller in self.controllers:
            controller.plain_run = 0
            controller.lost_probes = self.controllers[self.arm].lost_probes

    def record_plain_step(self, forward_seconds: float | None = None) -> None:
        self.controllers[0].record_plain_step(forward_seconds)
        for controller in self.controllers[1:]:
            controller.plain_run += 1

    def _timings_moved(self) -> None:
        for controller in self.controllers:  # the shared verify scale moved: every policy's estimate is stale
            controller._estimates = None


class FixedBudget:
    """The controller of a call without `adaptive`: every step drafts the first policy's tree at `budget`; no
    context lookup, no padding of forwards, nothing recorded."""

    arm = 0
    lost_probes = 0

    def __init__(self, budget: int):
        self.budget = budget

    def next_budget(self) -> int:
        return self.budget

    def lookup_choice(self, candidates: list[tuple[Hashable, int]]) -> tuple[int, int]:
        return -1, 0

    def forward_layout(self, nodes: int) -> tuple[int | None, bool]:
        return None, False

    def record_step(self, *args, **kwargs) -> None:
        pass

    def record_lookup_step(self, *args, **kwargs) -> None:
        pass

    def record_plain_step(self, *args, **kwargs) -> None:
        pass

    def record_forward(self, *args, **kwargs) -> None:
        pass

    def save(self, evidence: ModeEvidence) -> None:
        pass


def budget_controller(
    state: ControllerState,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    max_budgets: list[int],
    max_chain: int = 0,
    mode: tuple = ("greedy",),
) -> tuple[AdaptiveBudget | PolicyChoice, ModeEvidence]:
    """The adaptive controller of one `generate` call in decoding `mode` (`options.decoding_mode`), from `state`
    (the draft's `controller_state`): the target's forward costs (calibrated once per model and machine for trees up
    to the largest of `max_budgets` or `max_chain` lookup tokens), the draft's own forward costs per level (once per
    draft), and `mode`'s evidence (acceptance, lookup outcomes, plain steps since the last probe) with the recent
    forwards' timings. Returns the controller and the evidence its `save` writes back to.

    One largest budget per tree policy: an `AdaptiveBudget` for one, a `PolicyChoice` between two (the drawn chain,
    then the deterministic tree), each with its own acceptance evidence. The tree beats the chain only with more
    nodes than the chain has levels, so it is weighed only where a tree of twice as many nodes costs at most two
    one-token forwards (a GPU); on a CPU, where it costs more, the chain alone drafts (weighing both there measured
    slower: `docs/HISTORY.md`)."""
    if len(max_budgets) > 2:
        raise ValueError(f"budget_controller weighs at most two tree policies, got {len(max_budgets)}.")
    evidence = state.evidence.select_mode(mode)
    max_nodes = max(*max_budgets, max_chain) + 1
    key = calibration_key(target)
    costs = state.costs_for(key)
    if costs is None or costs.node_counts[-1] < max_nodes:
        costs = state.forward_costs[key] = calibrate_forward_costs(target, list(draft.config.feature_layers), max_nodes)
    if state.draft_costs is None:
        state.draft_costs = calibrate_draft_costs(draft)
    # forwards padded to a faster size never run more rows than the largest tree
    costs = dataclasses.replace(costs, max_rows=max_nodes)
    controllers = [
        AdaptiveBudget(
            costs, max_budget, history, lookup=evidence.lookup, timings=state.evidence.timings,
            plain_run=evidence.plain_run, lost_probes=evidence.lost_probes, draft_costs=state.draft_costs,
            timed=not state.pinned,
        )
        for history, max_budget in zip((evidence.acceptance, evidence.second_policy_acceptance), max_budgets)
    ]
    chain = controllers[0]
    if len(controllers) == 1 or chain.costs(2 * chain.max_budget + 1) > chain.first_cost * chain.costs(1):
        return chain, evidence
    return PolicyChoice(controllers), evidence


def batch_budget_controller(
    state: ControllerState, target: torch.nn.Module, draft: torch.nn.Module, max_budget: int, rows: int, mode: tuple
) -> tuple[AdaptiveBudget, ModeEvidence]:
    """The adaptive controller of batched decoding over `rows` rows: an `AdaptiveBudget` whose forward costs are the
    batch's per row (`calibrate_batch_forward_costs`, once per model, machine and batch size), so it weighs seconds
    per committed token of the batch against plain batched decoding. Its evidence is its own per decoding `mode`
    (each row's accepted path is one record; the step's overhead, draft forward included, is shared by its rows).
    Returns the controller and the evidence its `save` writes back to."""
    evidence = state.evidence.select_mode(mode + ("batch",))
    key = f"{calibration_key(target)}|batch={rows}"
    costs = state.costs_for(key)
    if costs is None or costs.node_counts[-1] < max_budget + 1:
        feature_layers = list(draft.config.feature_layers)
        costs = state.forward_costs[key] = calibrate_batch_forward_costs(target, feature_layers, rows, max_budget + 1)
    controller = AdaptiveBudget(
        costs, max_budget, evidence.acceptance, lookup=evidence.lookup, plain_run=evidence.plain_run,
        lost_probes=evidence.lost_probes, timed=not state.pinned,
    )
    return controller, evidence
