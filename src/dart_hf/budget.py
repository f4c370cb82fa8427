"""Choosing the tree budget per step from measured costs and acceptance; plain decoding when drafting loses.

A DART step runs the target once over a tree of n nodes (cost f(n)) plus the draft, the tree search, the acceptance
and the cache compaction (cost o(m)), and commits tau(m) tokens on average for a tree budget m. Plain decoding
commits one token per f(1). So:

- f is measured once per model, dtype, device and thread count (`calibrate_forward_costs`) and cached on disk:
  on a GPU f is nearly flat, on this project's 2-core CPU a 60-node tree costs over 2.5x one token.
- tau(m) is estimated from the steps already verified. A policy's tree of budget m is its m best nodes (the
  `Tree.ranks` <= m), so one step verified with budget b tells what every budget m <= b would have accepted.
- f is the fastest of several runs at a 128-token context; during generation the context is longer and the
  machine busier, and not by the same factor for one token as for a tree. `ForwardTimings` keeps recent forwards'
  measured seconds as multiples of f, per kind of step, and decisions scale f by their medians.
- o(m) is the draft's forward for the min(m, draft length) levels a tree of budget m can reach, measured once per
  draft (`calibrate_draft_costs`: on this project's CPU one level cost a third of eight), plus the rest of recent
  steps' measured overhead: a one-level drawn chain is then not priced with an eight-level probe's draft forward
  (which at T=1 would send such chains to plain decoding).
- `AdaptiveBudget` picks the m with the lowest cost per token, (o(m) + f(m + 1)) / tau(m); when even that loses to
  f(1), it decodes plainly and probes with a tree now and then to notice when drafting pays again. A probe costs
  its expected loss, tau(m) times the gap per token, so it waits for as many plain steps as keep probes' losses
  under `probe_share` of the plain decoding time: a tree that nearly pays is probed every few steps (so the
  evidence follows a change of text quickly), one that loses badly rarely. Each probe in a row that lost doubles
  the wait (up to `max_probe_interval`), and one that beat plain decoding restarts it: text where drafting loses
  tends to go on being such text, and at a fixed share a long stretch of it paid the whole share (3% slower than
  vanilla on AlpacaEval at T=1, `docs/HISTORY.md`). A probe is at least `first_budget`'s
  tree, so that it refreshes the evidence of every budget that could pay. Every `explore_every` steps it tries
  twice the chosen budget, which is how larger budgets get evidence. With no evidence at all it starts with the
  largest tree that costs at most twice one token (`first_budget`). Where a forward runs padded to a faster
  size (`ForwardCosts.rows`: on a CPU 3 nodes cost more than 4), the budgets grow to fill the padded rows with
  nodes (`AdaptiveBudget.filled`).
- Context lookup (`dart_hf.lookup`) chains are scored on every step for free, so `lookup_choice` needs no probes:
  of a step's candidate chains it verifies the prefix of length k with the lowest (o_lookup + f(k + 1)) /
  tau_lookup(k) when that beats both plain decoding and the drafted tree; tau_lookup is measured per kind of
  candidate: its match length n (a continuation found after matching 3 tokens is far likelier to hold than one
  found after matching 1), whether the earlier occurrences disagree on what follows, and which occurrence it
  follows (the latest or the earliest), recent outcomes weighing more.
- When sampling, two tree policies compete (`PolicyChoice`): the drawn chain and the deterministic tree, each with
  its own `AdaptiveBudget` and acceptance evidence; a step drafts with the one that is cheaper per token.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from .files import write_atomically
from .hardware import device_description, synchronize
from .tree import Tree
from .verify import compact_cache, forward_tree

# the version of what `forward_tree` runs: part of the calibration key, so that costs cached on disk for another
# version of it are measured again (its changes are listed in docs/HISTORY.md)
CALIBRATION_METHOD = 5
CANDIDATE_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

# calibrated at every size up to this many nodes (context-lookup chains take any length; on a CPU neighbouring
# sizes differ by up to 40%, so interpolation between sparse sizes misprices them), then at the budgets' sizes
EVERY_SIZE_UP_TO = 17


def candidate_budgets(max_budget: int) -> list[int]:
    """The budgets a controller weighs for trees of at most `max_budget` nodes below the root, before filling."""
    return [b for b in CANDIDATE_BUDGETS if b < max_budget] + [max_budget]


@dataclass
class ForwardCosts:
    """Seconds of one target forward over n tree nodes (root included), measured at `node_counts`; linear in
    between and beyond.

    max_rows > 0 lets a forward run with more rows than it has nodes (`rows`): on this project's 2-core CPU,
    float32 matmuls of 2, 3 or 7 rows are slower than of 4, 5 or 13, so a forward of 3 nodes padded to 5 rows
    costs less than one of 3. Calling the costs then gives the cost of the padded forward.

    weight_major_seconds: the same forwards with the linear layers' products taken weight first
    (`dart_hf.weight_major`), None where not measured; a forward runs in whichever layout measured faster at its
    size (`weight_major`), and costs that."""

    node_counts: list[int]
    seconds: list[float]
    max_rows: int = 0
    weight_major_seconds: list[float] | None = None

    def __post_init__(self):
        self._rows = [self._cheapest_rows(nodes) for nodes in range(self.max_rows + 1)]  # looked up every step

    def __call__(self, nodes: int) -> float:
        return self.measured(self.rows(nodes))

    def measured(self, rows: int) -> float:
        """Seconds of a forward over exactly `rows` rows, in the faster layout."""
        if self.weight_major_seconds is None:
            return self._interpolated(self.seconds, rows)
        return min(self._interpolated(self.seconds, rows), self._interpolated(self.weight_major_seconds, rows))

    def weight_major(self, rows: int) -> bool:
        """Whether a forward over `rows` rows is faster with weight-major products."""
        if self.weight_major_seconds is None:
            return False
        return self._interpolated(self.weight_major_seconds, rows) < self._interpolated(self.seconds, rows)

    def _interpolated(self, seconds: list[float], rows: int) -> float:
        counts = self.node_counts
        if rows > counts[-1] and len(counts) > 1:
            slope = (seconds[-1] - seconds[-2]) / (counts[-1] - counts[-2])
            return seconds[-1] + slope * (rows - counts[-1])
        return float(np.interp(rows, counts, seconds))

    def rows(self, nodes: int) -> int:
        """The rows a forward over `nodes` nodes runs with: `nodes`, or up to `max_rows` where a measured size
        is at least `PADDING_GAIN` cheaper (the cheapest such size)."""
        return self._rows[nodes] if nodes <= self.max_rows else nodes

    def _cheapest_rows(self, nodes: int) -> int:
        counts = np.asarray(self.node_counts)  # a measured size costs as measured
        seconds = np.array([self.measured(int(count)) for count in counts])
        cheaper = (counts > nodes) & (counts <= self.max_rows) & (seconds <= PADDING_GAIN * self.measured(nodes))
        return int(counts[cheaper][seconds[cheaper].argmin()]) if cheaper.any() else nodes  # ties: the fewest rows


# a forward is padded to a larger measured size only when that measured at most this share of its own cost: where
# every size costs about the same (a GPU), calibration noise alone must not pad a 5-node tree to 61 rows
PADDING_GAIN = 0.95


def cost_cache_dir() -> Path:
    """Where calibrated forward costs are cached: `$DART_HF_CACHE`, default `~/.cache/dart-hf`."""
    return Path(os.environ.get("DART_HF_CACHE", Path.home() / ".cache" / "dart-hf"))


def calibration_key(target: PreTrainedModel) -> str:
    """What the forward cost depends on: the model (name, size, dtype, attention), the device with what it is (the
    CPU's model and bfloat16 flags, or the GPU's name: `hardware.device_description`), the threads and torch."""
    config = target.config
    size = sum(p.numel() for p in target.parameters())
    return (
        f"{config._name_or_path or config.model_type}|{config.model_type}|{size}|{target.dtype}|"
        f"{config._attn_implementation}|{target.device}|{device_description(target.device)}|"
        f"threads={torch.get_num_threads()}|torch={torch.__version__}"
    )


@torch.no_grad()
def calibrate_forward_costs(
    target: PreTrainedModel,
    feature_layers: list[int],
    max_nodes: int,
    context_length: int = 128,
    repeats: int = 7,
    use_disk_cache: bool = True,
) -> ForwardCosts:
    """Time the target's tree forward (as `forward_tree` runs it, in both layouts of its linear layers' products:
    `dart_hf.weight_major`) for trees of 1 to `max_nodes` nodes over a `context_length`-token cache; the fastest of
    `repeats` runs per size and layout, since other work on the machine only ever adds time and the result is kept
    for good: cached in `$DART_HF_CACHE/forward_costs.json` under `calibration_key(target)`, so it runs once per
    model and machine."""
    key = f"{calibration_key(target)}|context={context_length}|method={CALIBRATION_METHOD}"
    path = cost_cache_dir() / "forward_costs.json"
    stored = json.loads(path.read_text()) if use_disk_cache and path.exists() else {}
    every_size = set(range(1, min(max_nodes, EVERY_SIZE_UP_TO) + 1))
    node_counts = sorted({max_nodes} | every_size | {n + 1 for n in CANDIDATE_BUDGETS if n + 1 < max_nodes})
    if key in stored and stored[key]["node_counts"][-1] >= max_nodes:
        entry = stored[key]
        return ForwardCosts(entry["node_counts"], entry["seconds"], weight_major_seconds=entry["weight_major_seconds"])

    vocab_size = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab_size, (1, context_length), generator=generator).to(target.device)
    cache = DynamicCache(config=target.config)
    target(input_ids=context, cache=cache, use_cache=True)
    trees = [
        Tree.from_parents(torch.randint(0, vocab_size, (nodes,), generator=generator), [-1] + [0] * (nodes - 1))
        for nodes in node_counts
    ]
    layouts = (False, True)  # weight_major
    times = {layout: [[] for _ in node_counts] for layout in layouts}
    for repeat in range(repeats + 1):  # round-robin over the sizes, so machine drift hits them alike
        for index, tree in enumerate(trees):
            for layout in layouts if (repeat + index) % 2 == 0 else layouts[::-1]:
                synchronize(target.device)
                start = time.perf_counter()
                forward_tree(target, tree, cache, feature_layers, weight_major=layout)
                synchronize(target.device)
                if repeat > 0:  # the first round warms up
                    times[layout][index].append(time.perf_counter() - start)
                compact_cache(cache, context_length, [])  # drop the tree (sliding-window layers too)
    # not smoothed into a rising curve: on a 2-core CPU's float32 matmuls 4, 5, 9 and 17 nodes measured 116-125 ms
    # where 3 and 7 took 146-153 ms (the same at a 400-token context), so the budget of 3 nodes was the dearer one
    seconds, weight_major_seconds = ([min(size_times) for size_times in times[layout]] for layout in layouts)
    costs = ForwardCosts(node_counts, seconds, weight_major_seconds=weight_major_seconds)
    if use_disk_cache:
        stored[key] = {"node_counts": node_counts, "seconds": seconds, "weight_major_seconds": weight_major_seconds}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: Path(temporary).write_text(json.dumps(stored, indent=1)))
    return costs


@dataclass
class DraftCosts:
    """Seconds of one draft forward that drafts `levels` levels (`levels - 1` mask rows after the real rows), for
    1 to `len(seconds)` (the draft length) levels. A step of budget m drafts min(m, draft length) levels: on this
    project's CPU the shipped draft's forward took about 6 ms for one level and 17 ms for eight, a sixth of a
    one-token target forward between a small budget and a large one."""

    seconds: list[float]

    def __call__(self, budget: int) -> float:
        """Seconds of the draft forward of a step of `budget`."""
        return self.seconds[min(budget, len(self.seconds)) - 1]


@torch.no_grad()
def calibrate_draft_costs(
    draft: torch.nn.Module, real_rows: int = 2, context_length: int = 64, repeats: int = 5
) -> DraftCosts:
    """Time `draft`'s forward (a `DartDraftModel`) for 1 to its draft length levels, with `real_rows` new rows over a
    `context_length`-row cache; the fastest of `repeats` runs per level count (well under a second on a CPU, so
    measured once per draft object, not cached on disk)."""
    config = draft.config
    generator = torch.Generator().manual_seed(0)

    def rows(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.randn(1, count, 3 * config.target_hidden_size, generator=generator)
        input_ids = torch.randint(0, config.vocab_size, (1, count), generator=generator)
        return features.to(draft.device), input_ids.to(draft.device)

    cache = DynamicCache()
    features, input_ids = rows(context_length)
    draft(features, input_ids=input_ids, cache=cache, num_masks=0)
    features, input_ids = rows(real_rows)
    times = [[] for _ in range(config.draft_length)]
    for repeat in range(repeats + 1):
        for levels, level_times in enumerate(times, start=1):
            synchronize(draft.device)
            start = time.perf_counter()
            draft(features, input_ids=input_ids, cache=cache, num_masks=levels - 1)
            synchronize(draft.device)
            if repeat > 0:  # the first round warms up
                level_times.append(time.perf_counter() - start)
            cache.crop(-(real_rows + levels - 1))
    return DraftCosts([min(level_times) for level_times in times])


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
        at most `first_cost` one-token forwards refreshes the evidence of every budget that could pay. Probing the
        best budget alone kept the evidence of larger ones from coming back: the tree that loses least is often
        the cheapest (budget 1, whose tau cannot pass 2), and as its records filled the history the larger
        budgets' fell out of it, until none but the smallest had an estimate."""
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
        61-node tree can cost 3.4 tokens, a smaller one. Its steps tell what every smaller budget would have
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
        if not available or weights.sum() < self.min_evidence:
            return math.inf, 0
        lengths = np.arange(1, available + 1)  # [K]
        taus = 1.0 + weights @ np.minimum(matched[:, None], lengths) / weights.sum()  # [K]
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
        self._record_forward("verify", nodes, forward_seconds)
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
        self._record_forward("verify", len(tree), forward_seconds)
        self._estimates = None
        self.plain_run = 0
        if self.lost_probes:  # a probe: one that beat plain decoding restarts the wait (the text may have changed)
            seconds = overhead_seconds + (forward_seconds or float(self.verify_costs([len(tree)])[0]))
            if len(path) * self.plain_cost() >= seconds:
                self.lost_probes = 0

    def record_plain_step(self, forward_seconds: float | None = None) -> None:
        """After a plain decoding step (counts towards the next probe), with its forward's seconds."""
        self._record_forward("plain", 1, forward_seconds)
        self.plain_run += 1

    def _record_forward(self, kind: str, nodes: int, seconds: float | None) -> None:
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
