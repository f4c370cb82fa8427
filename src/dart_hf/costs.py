"""Measured costs of the target's tree forward and of the draft's forward, per model, dtype, device and threads.

The budget controller (`dart_hf.budget`) prices a step from two curves: f(n), the seconds of one target forward
over a tree of n nodes (root included), and the seconds of one draft forward per number of drafted levels. Both
are measured here (`calibrate_forward_costs`, `calibrate_draft_costs`) rather than modelled: on a GPU f is nearly
flat up to tens of nodes; on a CPU it rises with n, and not smoothly (matmuls of some row counts are slower than
of a few more rows). The target's curve is cached on disk under `calibration_key`, so it is measured once per
model and machine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from . import ragged, sliding_window
from .files import cache_root, write_atomically
from .hardware import device_description, synchronize
from .tree import Tree
from .verify import compact_cache, forward_tree

# the version of what `forward_tree` runs: part of the calibration key, so that costs cached on disk for another
# version of it are measured again (its changes are listed in docs/HISTORY.md)
CALIBRATION_METHOD = 5

# the budgets a controller may weigh (`dart_hf.budget.candidate_budgets`): calibrated at their tree sizes
CANDIDATE_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

# calibrated at every size up to this many nodes (context-lookup chains take any length; on a CPU neighbouring
# sizes can differ a lot, so interpolation between sparse sizes misprices them), then at the budgets' sizes
EVERY_SIZE_UP_TO = 17


@dataclass
class ForwardCosts:
    """Seconds of one target forward over n tree nodes (root included), measured at `node_counts`; linear in
    between and beyond.

    max_rows > 0 lets a forward run with more rows than it has nodes (`rows`): on a CPU, a matmul of some row
    counts can be slower than one of a few more rows, so a forward of n nodes padded to a measured faster size
    costs less than one of n. Calling the costs then gives the cost of the padded forward.

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


def calibration_key(target: PreTrainedModel) -> str:
    """What the forward cost depends on: the model (name, size, dtype, attention), the device with what it is (the
    CPU's model, bfloat16 and AVX-512 flags, or the GPU's name: `hardware.device_description`), the threads and
    torch."""
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
    path = cache_root() / "forward_costs.json"
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
    # not smoothed into a rising curve: where a smaller tree's forward is slower than a larger one's (CPU matmuls
    # of some row counts), the smaller budget is the dearer one, and `ForwardCosts.rows` pads it
    seconds, weight_major_seconds = ([min(size_times) for size_times in times[layout]] for layout in layouts)
    costs = ForwardCosts(node_counts, seconds, weight_major_seconds=weight_major_seconds)
    if use_disk_cache:
        stored[key] = {"node_counts": node_counts, "seconds": seconds, "weight_major_seconds": weight_major_seconds}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: Path(temporary).write_text(json.dumps(stored, indent=1)))
    return costs


@torch.no_grad()
def calibrate_batch_forward_costs(
    target: PreTrainedModel,
    feature_layers: list[int],
    batch_size: int,
    max_nodes: int,
    context_length: int = 128,
    repeats: int = 3,
    use_disk_cache: bool = True,
) -> ForwardCosts:
    """Time the target's forward over `batch_size` rows of n tree nodes each (as batched decoding runs it:
    `ragged.forward_rows`) over a `context_length`-token cache, at the candidate budgets' tree sizes up to
    `max_nodes`; the fastest of `repeats` runs per size. Returns the costs PER ROW (the seconds divided by
    `batch_size`): a step then commits each row's tokens, and the controller weighs seconds per committed token
    as it does for one sequence. Cached on disk as `calibrate_forward_costs` is, per batch size."""
    key = f"{calibration_key(target)}|context={context_length}|batch={batch_size}|method={CALIBRATION_METHOD}"
    path = cache_root() / "forward_costs.json"
    stored = json.loads(path.read_text()) if use_disk_cache and path.exists() else {}
    node_counts = sorted({1, max_nodes} | {n + 1 for n in CANDIDATE_BUDGETS if n + 1 < max_nodes})
    if key in stored and stored[key]["node_counts"][-1] >= max_nodes:
        return ForwardCosts(stored[key]["node_counts"], stored[key]["seconds"])

    vocab_size = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab_size, (batch_size, context_length), generator=generator).to(target.device)
    cache = DynamicCache(config=target.config)
    windows = ragged.sliding_windows(cache)
    valid = torch.ones(batch_size, context_length, dtype=torch.bool, device=target.device)
    times = [[] for _ in node_counts]
    with sliding_window.keeping_every_key(cache):
        target(input_ids=context, cache=cache, use_cache=True)
        for repeat in range(repeats + 1):
            for index, nodes in enumerate(node_counts):
                tokens = torch.randint(0, vocab_size, (nodes,), generator=generator)
                tree = Tree.from_parents(tokens, [-1] + [0] * (nodes - 1))
                tokens, ancestors = ragged.padded_trees([tree] * batch_size)
                depths = ragged.padded_depths([tree] * batch_size)
                synchronize(target.device)
                start = time.perf_counter()
                ragged.forward_rows(target, tokens, ancestors, depths, valid, cache, windows, feature_layers)
                synchronize(target.device)
                if repeat > 0:  # the first round warms up
                    times[index].append(time.perf_counter() - start)
                ragged.truncate(cache, context_length)
    seconds = [min(size_times) / batch_size for size_times in times]
    if use_disk_cache:
        stored[key] = {"node_counts": node_counts, "seconds": seconds}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: Path(temporary).write_text(json.dumps(stored, indent=1)))
    return ForwardCosts(node_counts, seconds)


@dataclass
class DraftCosts:
    """Seconds of one draft forward that drafts `levels` levels (`levels - 1` mask rows after the real rows), for
    1 to `len(seconds)` (the draft length) levels. A step of budget m drafts min(m, draft length) levels, so a
    small budget's step is priced with a shorter draft forward than a large one's."""

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

