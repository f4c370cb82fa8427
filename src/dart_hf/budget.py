"""Choosing the tree budget per step from measured costs and acceptance; plain decoding when drafting loses.

A DART step runs the target once over a tree of n nodes (cost f(n)) plus the draft, the tree search and the
acceptance, and commits tau(m) tokens on average for a tree budget m. Plain decoding commits one token per step.
So:

- f is measured once per model, dtype, device and thread count (`calibrate_forward_costs`) and cached on disk:
  on a GPU f is nearly flat, on this project's 2-core CPU a 60-node tree costs over 2.5x one token.
- What a step costs beyond f (for a tree step the draft, the search, acceptance and cache compaction; for both
  kinds logits processing, the commit and a context longer than the calibration's) is measured on the steps
  themselves (`BudgetMemory.tree_extra`, `plain_extra`).
- tau(m) is estimated from the steps already verified, the recent ones weighted most. A policy's tree of budget
  m is its m best nodes (the `Tree.ranks` <= m), so one step verified with budget b tells what every budget
  m <= b would have accepted.
- `AdaptiveBudget` picks the m with the lowest cost per token, (f(m + 1) + tree_extra) / tau(m). Unless that beats
  a plain step, f(1) + plain_extra per token (by `min_gain`, default 0), it decodes plainly and probes with a
  tree after `probe_interval` plain tokens to notice when drafting pays again. A probe is judged on its own
  outcome: when its tokens came slower than plain decoding's the interval doubles (up to `max_probe_interval`),
  else it drops back to the base, so that probes refill the history with the new text. Every `explore_every` steps it tries twice the chosen budget, which is
  how larger budgets get evidence.
- The memory (acceptance history, measured extras, probe schedule) outlives one `generate` call: it is kept on
  the draft, so a call starts from what the previous calls learned.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from .tree import Tree
from .verify import forward_tree

CANDIDATE_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass
class ForwardCosts:
    """Seconds of one target forward over n tree nodes (root included), measured at `node_counts`; linear in
    between and beyond."""

    node_counts: list[int]
    seconds: list[float]

    def __call__(self, nodes: int) -> float:
        counts, seconds = self.node_counts, self.seconds
        if nodes > counts[-1] and len(counts) > 1:
            slope = (seconds[-1] - seconds[-2]) / (counts[-1] - counts[-2])
            return seconds[-1] + slope * (nodes - counts[-1])
        return float(np.interp(nodes, counts, seconds))


def cost_cache_dir() -> Path:
    """Where calibrated forward costs are cached: `$DART_HF_CACHE`, default `~/.cache/dart-hf`."""
    return Path(os.environ.get("DART_HF_CACHE", Path.home() / ".cache" / "dart-hf"))


def calibration_key(target: PreTrainedModel) -> str:
    """What the forward cost depends on: the model (name, size, dtype, attention), the device and the threads."""
    config = target.config
    size = sum(p.numel() for p in target.parameters())
    return (
        f"{config._name_or_path or config.model_type}|{config.model_type}|{size}|{target.dtype}|"
        f"{config._attn_implementation}|{target.device}|threads={torch.get_num_threads()}|torch={torch.__version__}"
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
    """Time the target's tree forward (as `forward_tree` runs it) for trees of 1 to `max_nodes` nodes over a
    `context_length`-token cache; the median of `repeats` runs per size. Cached in `$DART_HF_CACHE/forward_costs.json`
    under `calibration_key(target)`, so it runs once per model and machine."""
    key = f"{calibration_key(target)}|context={context_length}"
    path = cost_cache_dir() / "forward_costs.json"
    stored = json.loads(path.read_text()) if use_disk_cache and path.exists() else {}
    node_counts = sorted({1, max_nodes} | {n + 1 for n in CANDIDATE_BUDGETS if n + 1 < max_nodes})
    if key in stored and stored[key]["node_counts"][-1] >= max_nodes:
        return ForwardCosts(stored[key]["node_counts"], stored[key]["seconds"])

    vocab_size = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab_size, (1, context_length), generator=generator).to(target.device)
    cache = DynamicCache(config=target.config)
    target(input_ids=context, cache=cache, use_cache=True)
    trees = [
        Tree.from_parents(torch.randint(0, vocab_size, (nodes,), generator=generator), [-1] + [0] * (nodes - 1))
        for nodes in node_counts
    ]
    times = [[] for _ in node_counts]
    for repeat in range(repeats + 1):  # round-robin over the sizes, so machine drift hits them alike
        for tree, size_times in zip(trees, times):
            _synchronize(target.device)
            start = time.perf_counter()
            forward_tree(target, tree, cache, feature_layers)
            _synchronize(target.device)
            if repeat > 0:  # the first round warms up
                size_times.append(time.perf_counter() - start)
            cache.crop(-len(tree))
    seconds = [float(np.median(size_times)) for size_times in times]
    seconds = np.maximum.accumulate(seconds).tolist()  # more nodes never cost less: smooths timing noise
    costs = ForwardCosts(node_counts, seconds)
    if use_disk_cache:
        stored[key] = {"node_counts": node_counts, "seconds": seconds}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1))
        os.replace(tmp, path)
    return costs


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


@dataclass
class StepRecord:
    """One verified step: the budget it used and, for every m, whether the accepted path survives budget m:
    `path_ranks[i]` is the largest rank among the first i + 1 accepted drafted nodes."""

    budget: int
    path_ranks: np.ndarray


@dataclass
class BudgetMemory:
    """What the controller learns, kept across `generate` calls: the recent verified steps (acceptance varies by
    text, so only the last `maxlen`), what a tree step costs beyond the calibrated forward f(n), measured on the
    last 16 steps (their median, so one slow step, a first call's setup or a pause, does not steer it), and the
    probe schedule (many short calls would otherwise each pay for a probe)."""

    history: deque = field(default_factory=lambda: deque(maxlen=64))
    tree_extras: deque = field(default_factory=lambda: deque(maxlen=16))  # seconds, each >= 0
    plain_extras: deque = field(default_factory=lambda: deque(maxlen=16))
    plain_run: int = 0  # plain steps since the last tree step, across calls: probes keep their cadence
    probe_interval: int | None = None  # plain steps between probes; None: the controller's base interval

    @property
    def tree_extra(self) -> float:
        """Seconds a tree step costs beyond f(its nodes): the draft, the search, acceptance, cache compaction and
        a context longer than the calibration's; 0 before any step was measured."""
        return float(np.median(self.tree_extras)) if self.tree_extras else 0.0

    @property
    def plain_extra(self) -> float:
        """Seconds a plain step costs beyond f(1) (logits processing, commit, a longer context), at most
        `tree_extra`: a tree step does all that and more. 0 before both were measured."""
        if not (self.plain_extras and self.tree_extras):
            return 0.0
        return min(float(np.median(self.plain_extras)), self.tree_extra)


class AdaptiveBudget:
    """Per-step choice of the tree budget (0 = one plain decoding step), from `ForwardCosts` and a `BudgetMemory`
    (shared across `generate` calls so later calls start informed)."""

    def __init__(
        self,
        costs: ForwardCosts,
        max_budget: int,
        memory: BudgetMemory,
        probe_interval: int = 16,
        max_probe_interval: int = 128,
        explore_every: int = 16,
        min_evidence: int = 4,
        half_life: float = 16.0,
        min_gain: float = 0.0,
    ):
        self.costs = costs
        self.max_budget = max_budget
        self.memory = memory
        self.history = memory.history
        self.base_probe = probe_interval
        self.max_probe_interval = max_probe_interval
        if memory.probe_interval is None:
            memory.probe_interval = probe_interval
        self.probing = False
        self.explore_every = explore_every
        self.min_evidence = min_evidence
        self.half_life = half_life
        self.min_gain = min_gain
        self._best = None  # best() until the next record_step
        self.steps = 0
        self.budgets = [b for b in CANDIDATE_BUDGETS if b < max_budget] + [max_budget]

    def drafting_loses(self, seconds_per_token: float) -> bool:
        """Whether a tree step at `seconds_per_token` fails to beat a plain step, f(1) + plain_extra per token,
        by the fraction `min_gain`."""
        return seconds_per_token >= (1.0 - self.min_gain) * (self.costs(1) + self.memory.plain_extra)

    def estimate(self) -> dict[int, tuple[float, float]]:
        """{budget m: (estimated tau(m), estimated seconds per committed token)} for the budgets with evidence.
        tau(m) is a recency-weighted mean (a record's weight halves every `half_life` newer records): acceptance
        follows the text, so the last steps say most about the next one."""
        if not self.history:
            return {}
        extra = self.memory.tree_extra
        record_budgets = np.array([r.budget for r in self.history])  # [R]
        depth = max(r.path_ranks.size for r in self.history)
        ranks = np.full((len(self.history), depth), np.iinfo(np.int64).max)  # [R, D], padded past each path
        for row, record in enumerate(self.history):
            ranks[row, : record.path_ranks.size] = record.path_ranks
        weights = 0.5 ** (np.arange(len(self.history))[::-1] / self.half_life)  # [R], newest 1
        estimates = {}
        for budget in self.budgets:
            has_evidence = record_budgets >= budget
            if has_evidence.sum() < self.min_evidence:
                continue
            accepted = (ranks[has_evidence] <= budget).sum(axis=1)
            tau = 1.0 + float(np.average(accepted, weights=weights[has_evidence]))
            estimates[budget] = (tau, (self.costs(budget + 1) + extra) / tau)
        return estimates

    def best(self) -> tuple[int | None, float]:
        """The budget with the lowest estimated seconds per token (None without evidence) and that cost; kept until
        the next verified step."""
        if self._best is None:
            estimates = self.estimate()
            if not estimates:
                return None, float("inf")
            budget = min(estimates, key=lambda m: estimates[m][1])
            self._best = budget, estimates[budget][1]
        return self._best

    def next_budget(self) -> int:
        """The budget for the next step; 0 means a plain decoding step."""
        budget, seconds_per_token = self.best()
        if budget is None:
            return self.max_budget  # no evidence yet: gather it with the full tree
        if self.drafting_loses(seconds_per_token):
            if self.memory.plain_run >= self.memory.probe_interval:
                self.probing = True
                return budget  # a probe: does drafting pay again? (its record resets the plain run)
            return 0
        self.steps += 1
        if self.steps % self.explore_every == 0 and budget < self.max_budget:
            return min(2 * budget, self.max_budget)
        return budget

    def record_step(self, tree: Tree, path: list[int], budget: int, step_seconds: float) -> None:
        """After a verified step: the tree, its accepted node path (root first), the budget it was built with and
        the seconds the whole step took (draft, search, verify, acceptance, commit)."""
        ranks = tree.ranks if tree.ranks is not None else torch.arange(len(tree))
        path_ranks = np.maximum.accumulate(ranks[path[1:]].numpy()) if len(path) > 1 else np.zeros(0, np.int64)
        self.history.append(StepRecord(budget, path_ranks))
        self.memory.tree_extras.append(max(step_seconds - self.costs(len(tree)), 0.0))
        self._best = None
        self.memory.plain_run = 0
        if self.probing:  # judged on its own outcome: the history may still be the text where drafting lost
            self.probing = False
            seconds_per_token = (self.costs(len(tree)) + self.memory.tree_extra) / len(path)
            if self.drafting_loses(seconds_per_token):  # still losing: wait twice as long for the next probe
                self.memory.probe_interval = min(2 * self.memory.probe_interval, self.max_probe_interval)
            else:  # it paid: probe often again, so that the history fills with the new text
                self.memory.probe_interval = self.base_probe

    def record_plain_step(self, step_seconds: float) -> None:
        """After a plain decoding step of `step_seconds` (counts towards the next probe)."""
        self.memory.plain_extras.append(max(step_seconds - self.costs(1), 0.0))
        self.memory.plain_run += 1
