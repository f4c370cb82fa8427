"""Batched DART decoding: several sequences per `generate` call, each accepting its own path, exact per row.

`dart_generate` comes here for a batch of more than one row (a left-padded batch, or `num_return_sequences`
copies that `generate` expanded). Each step the draft runs once for every row, each row gets its own tree, and the
target verifies all rows' trees in one forward (per-row masks and positions: `dart_hf.ragged`). Each row then
accepts its own path, token by token through the logits processors and stopping criteria with the row's own
history and padding, as vanilla batched `generate` shows them to that row. A row that stops leaves the batch (its
cache rows are dropped), so it costs no more target compute. One budget per step serves every row: the adaptive
controller prices a step with the forward costs of the batch's size (`costs.calibrate_batch_forward_costs`), and a
step drafts only while drafting measures no slower per committed token than plain batched steps (`StepRates`).

What a row's output holds: the sequence as vanilla batched `generate` returns it (its left padding, its tokens,
then `pad_token_id` up to the longest row); with `return_dict_in_generate`, scores and logits per step `[B, V]`,
zeros for a row at the steps after it ended (vanilla fills those from forwards over padding, which are skipped
here), and no cache (each row's cache holds holes). A streamer takes one sequence, as Transformers' streamers do.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import (
    EncoderNoRepeatNGramLogitsProcessor,
    EncoderRepetitionPenaltyLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import ragged, sliding_window
from .budget import FixedBudget, batch_budget_controller
from .features import forward_with_features
from .options import check_fresh_cache, check_prompt_not_empty, decoding_mode, strip_left_padding
from .lookup import LookupTracker, find_continuations
from .stats import DartStats
from .tree import SampledChainPolicy, Tree, graft
from .verify import accept, append_token, choose_token

if TYPE_CHECKING:  # `generation` imports this module
    from .generation import DecodeSetup


@dataclass
class Row:
    """One sequence of the batch. input_ids: its committed tokens `[1, S]` without its left padding `pad_prefix`
    `[1, P]`; waiting: target features `[T_i, 3H]` of its positions the draft has not read; scores, logits: per
    committed token `[1, V]` when `return_dict_in_generate` asks for them."""

    pad_prefix: torch.Tensor
    input_ids: torch.Tensor
    waiting: list[torch.Tensor] = field(default_factory=list)
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    processors: LogitsProcessorList | None = None  # the call's processors, as they apply to this row
    stopped_at: int | None = None  # the length `[P + S]` at which the stopping criteria first said stop
    length_limit: int | None = None  # the length the row ends at, once known
    done: bool = False

    def __post_init__(self):
        self.prompt_length = self.input_ids.shape[1]

    def with_padding(self) -> torch.Tensor:
        """The row as vanilla batched `generate` holds it `[1, P + S]`."""
        return torch.cat([self.pad_prefix, self.input_ids], dim=-1)

    def room(self, max_length: int) -> int:
        """Tokens the length limit (and the batch's end, once known) lets in after the next one."""
        limit = max_length if self.length_limit is None else min(max_length, self.length_limit)
        return max(limit - self.pad_prefix.shape[1] - self.input_ids.shape[1] - 1, 0)


@dataclass
class StepRates:
    """The measured cost of the batch's recent plain steps and drafting steps (a tree or a lookup chain for some
    row), each step's whole time included: seconds per committed token over the last `window` steps of each kind
    (their seconds summed over their tokens summed: throughput, not a typical step). Drafting is allowed while it
    costs no more per token than plain steps. The kind not chosen is tried again after `explore_every` steps of the
    other, so both stay measured as the context grows and rows leave; each try of drafting that loses doubles the
    wait before the next (up to `max_explore_every`), as a probe that loses does for one sequence."""

    window: int = 8
    explore_every: int = 16
    max_explore_every: int = 128
    plain: deque = field(default_factory=deque)  # (seconds, tokens) of recent plain steps
    drafting: deque = field(default_factory=deque)
    since_plain: int = 0
    since_drafting: int = 0
    drafting_wait: int = 16

    def drafting_allowed(self) -> bool:
        if len(self.drafting) < 2:
            return True
        if len(self.plain) < 2:
            return False
        if self.rate(self.drafting) <= self.rate(self.plain):
            return self.since_plain < self.explore_every
        return self.since_drafting >= self.drafting_wait

    @staticmethod
    def rate(steps: deque) -> float:
        return sum(seconds for seconds, _ in steps) / max(sum(tokens for _, tokens in steps), 1)

    def record(self, drafted: bool, seconds: float, tokens: int) -> None:
        steps = self.drafting if drafted else self.plain
        steps.append((seconds, tokens))
        while len(steps) > self.window:
            steps.popleft()
        if drafted and self.since_drafting >= self.drafting_wait and len(self.plain) >= 2:  # a try after a wait
            losing = self.rate(self.drafting) > self.rate(self.plain)
            self.drafting_wait = min(2 * self.drafting_wait, self.max_explore_every) if losing else self.explore_every
        self.since_drafting = 0 if drafted else self.since_drafting + 1
        self.since_plain = self.since_plain + 1 if drafted else 0


@dataclass
class BatchState:
    """What changes step by step. rows: every row, in the caller's order; active: the indices of the rows still
    decoding, in the order of the caches' batch dimension; valid / draft_valid `[B_active, L]`: which columns of the
    target's / the draft's cache hold each active row's tokens (`dart_hf.ragged`); windows: the target's
    sliding-window layout (`ragged.sliding_windows`); controller: decides each step's budget, priced for
    `controller_rows` rows; lookups: each row's context-lookup proposals, scored as its tokens come."""

    rows: list[Row]
    active: list[int]
    cache: DynamicCache
    valid: torch.Tensor
    windows: tuple[int | None, bool]
    stats: DartStats
    pads_finished_rows: bool
    draft_cache: DynamicCache = field(default_factory=DynamicCache)
    draft_valid: torch.Tensor | None = None
    controller: object = None
    controller_rows: int = 0
    evidence: object = None  # where the controller saves what the next call goes on from (None: nothing)
    rates: StepRates = field(default_factory=lambda: StepRates())
    lookups: dict[int, LookupTracker] = field(default_factory=dict)


def decode_batch(setup: DecodeSetup, input_ids: torch.Tensor, model_kwargs: dict):
    """The decode loop of `dart_generate` for a batch `[B, S]`."""
    state = new_batch_state(setup, input_ids, model_kwargs)
    start = setup.clock()
    with sliding_window.keeping_every_key(state.cache):
        prefill_batch(setup, state, input_ids, model_kwargs.get("attention_mask"))
        while state.active:
            tick, committed = setup.clock(), state.stats.new_tokens
            update_controller(setup, state)
            drafting = drafting_allowed(setup, state)
            budget = state.controller.next_budget() if drafting else 0
            chains = lookup_chains(setup, state) if drafting else {}
            if budget == 0:
                plain_batch_step(setup, state, chains)
            else:
                tree_batch_step(setup, state, budget, chains)
            state.rates.record(budget > 0 or bool(chains), setup.clock() - tick, state.stats.new_tokens - committed)
    state.stats.total_time = setup.clock() - start
    if state.evidence is not None:
        state.controller.save(state.evidence)
    return finish_batch(setup, state)


def new_batch_state(setup: DecodeSetup, input_ids: torch.Tensor, model_kwargs: dict) -> BatchState:
    """The rows split from their left padding, the fresh cache `generate` made, `draft.stats` for this call; refuses
    what a batch cannot run."""
    check_batch_supported(setup)
    cache = model_kwargs.get("cache")
    check_fresh_cache(cache)
    sliding_window.check_supported(setup.model, cache)
    attention_mask = model_kwargs.get("attention_mask")
    rows, batch_size = [], input_ids.shape[0]
    for index in range(batch_size):
        row_mask = attention_mask[index : index + 1] if attention_mask is not None else None
        pad_prefix, tokens = strip_left_padding(input_ids[index : index + 1], row_mask)
        check_prompt_not_empty(tokens)
        rows.append(Row(pad_prefix, tokens, processors=row_processors(setup.logits_processor, index, batch_size)))
    stats = DartStats()
    setup.draft.stats = stats
    # as vanilla `generate`: with an EOS criterion a row that stops is padded from then on; without one (stop
    # strings alone) every row goes on decoding until all have stopped
    pads_finished_rows = any(hasattr(criteria, "eos_token_id") for criteria in setup.stopping_criteria)
    return BatchState(
        rows, list(range(len(rows))), cache, None, ragged.sliding_windows(cache), stats, pads_finished_rows
    )


def check_batch_supported(setup: DecodeSetup) -> None:
    """Refuse, with the fix, what batched DART decoding does not run."""
    if setup.streamer is not None:
        raise ValueError(
            "A streamer takes one sequence (Transformers' streamers support batch size 1): generate one prompt per "
            "call to stream it, or drop the streamer for a batch."
        )
    if setup.model.config._attn_implementation == "dart_tree":
        raise ValueError(
            "The Triton tree-attention kernel (attn_implementation='dart_tree') verifies one sequence; for a batch, "
            "load the target with attn_implementation='sdpa'."
        )


def row_processors(processors: LogitsProcessorList, row: int, batch_size: int) -> LogitsProcessorList:
    """`processors` as they apply to row `row` of `batch_size` rows called on its own: the processors `generate`
    builds with one entry per row (or per prompt, before `num_return_sequences` copies) get that row's entry."""
    return LogitsProcessorList(processor_for_row(processor, row, batch_size) for processor in processors)


def processor_for_row(processor, row: int, batch_size: int):
    """A copy of `processor` holding only row `row`'s part of its per-row state (the processor itself where it has
    none): a repetition penalty's `prompt_ignore_length` (each row's padding), the encoder penalties' prompt ids and
    n-grams (one per prompt: `num_return_sequences` copies share theirs), `prefix_allowed_tokens_fn`'s row index,
    and classifier-free guidance's unconditional context (its own model cache per row)."""
    if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(
        getattr(processor, "prompt_ignore_length", None), torch.Tensor
    ):
        processor = copy.copy(processor)
        processor.prompt_ignore_length = processor.prompt_ignore_length[row : row + 1]
    elif isinstance(processor, EncoderRepetitionPenaltyLogitsProcessor):
        processor = copy.copy(processor)
        prompt = row // (batch_size // processor.encoder_input_ids.shape[0])
        processor.encoder_input_ids = processor.encoder_input_ids[prompt : prompt + 1]
    elif isinstance(processor, EncoderNoRepeatNGramLogitsProcessor):
        processor = copy.copy(processor)
        processor.generated_ngrams = [processor.generated_ngrams[row // (batch_size // processor.batch_size)]]
        processor.batch_size = 1
    elif isinstance(processor, PrefixConstrainedLogitsProcessor):
        processor = copy.copy(processor)
        allowed = processor._prefix_allowed_tokens_fn
        processor._prefix_allowed_tokens_fn = lambda batch_id, sequence: allowed(row, sequence)
    elif isinstance(processor, UnbatchedClassifierFreeGuidanceLogitsProcessor):
        processor = copy.copy(processor)
        context = dict(processor.unconditional_context)
        for name in ("input_ids", "attention_mask"):
            if isinstance(context[name], torch.Tensor):
                prompt = row // (batch_size // context[name].shape[0])
                context[name] = context[name][prompt : prompt + 1]
        processor.unconditional_context = context
    return processor


def prefill_batch(
    setup: DecodeSetup, state: BatchState, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> None:
    """The target's forward over the padded prompts, as vanilla batched `generate` runs it (positions counted from
    each row's first token); commits each row's first new token."""
    tick = setup.clock()
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill_(attention_mask == 0, 1)
    outputs, features = forward_with_features(
        setup.model, setup.feature_layers, input_ids=input_ids, attention_mask=attention_mask,
        position_ids=positions, cache=state.cache, use_cache=True, **setup.last_logits_only,
    )
    state.valid = attention_mask.bool().to(setup.model.device)
    token_logits = outputs.logits[:, -1].to(dtype=torch.float32, copy=True)
    for index, row in enumerate(state.rows):
        row.waiting.append(features[index, row.pad_prefix.shape[1] :])
        row_logits = token_logits[index : index + 1]
        row_scores = row.processors(row.with_padding(), row_logits)
        token = choose_token(row_scores[0], setup.generation_config.do_sample)
        commit(setup, state, row, token, row_scores, row_logits)
    drop_finished(state)
    state.stats.prefill_time = setup.clock() - tick


def update_controller(setup: DecodeSetup, state: BatchState) -> None:
    """Build the controller for the batch's size, again when rows leave and the size moves to another calibrated
    one (its evidence goes on)."""
    rows = calibrated_rows(len(state.active))
    if state.controller is None or rows != state.controller_rows:
        (state.controller, state.evidence), state.controller_rows = batch_controller(setup, rows), rows


def drafting_allowed(setup: DecodeSetup, state: BatchState) -> bool:
    """Whether this step may draft (trees or lookup chains), or must be plain. The controller prices steps from
    forward costs calibrated over a short context; a batch's context (long prompts padded to the longest, holes)
    makes a tree's forward grow faster than a plain one's, and the lookup chains it takes per row make every row's
    forward longer. So in a batch the measured seconds per committed token of recent drafting and plain steps
    decide first (`StepRates`); a controller with fixed inputs (`adaptive=False`, a pinned `ControllerState`) is
    followed as it is."""
    if not setup.adaptive or not state.controller.timed:
        return True
    return state.rates.drafting_allowed()


def calibrated_rows(batch_size: int) -> int:
    """The batch size whose forward costs price a step of `batch_size` rows: the next power of two (costs are
    measured at those sizes only, and a step of fewer rows costs at most as much)."""
    return 1 << (batch_size - 1).bit_length()


def batch_controller(setup: DecodeSetup, rows: int) -> tuple:
    """The adaptive controller for batches of `rows` rows with its evidence, or a `FixedBudget` at the one policy's
    budget (and no evidence)."""
    if not setup.adaptive:
        return FixedBudget(setup.max_budgets[0]), None
    return batch_budget_controller(
        setup.draft.controller_state, setup.model, setup.draft, setup.max_budgets[0], rows,
        decoding_mode(setup.generation_config),
    )


def lookup_chains(setup: DecodeSetup, state: BatchState) -> dict[int, list[int]]:
    """Each active row's context-lookup chain to verify this step, by row index (none for most rows): every row's
    earlier proposals are scored against what it committed since (the evidence is the batch's, per kind of
    proposal), then the controller takes a row's continuation where verifying it is estimated to beat both plain
    decoding and the drafted tree, as it does for one sequence (`AdaptiveBudget.lookup_choice`)."""
    if not setup.lookup_length:
        return {}
    chains = {}
    max_length = setup.generation_config.max_length
    for index in state.active:
        row = state.rows[index]
        context = row.input_ids[0].cpu().numpy()
        tracker = state.lookups.setdefault(index, LookupTracker())
        for kind, matched in tracker.resolve(context):
            state.controller.lookup.record(kind, matched)
        candidates = find_continuations(context, setup.options.lookup_max_match, setup.lookup_length)
        for kind, continuation in candidates:
            tracker.propose(context, kind, continuation)
        room = row.room(max_length)
        chosen, length = state.controller.lookup_choice([(kind, min(c.size, room)) for kind, c in candidates])
        if length:
            chains[index] = candidates[chosen][1][:length].tolist()
    return chains


def plain_batch_step(setup: DecodeSetup, state: BatchState, chains: dict[int, list[int]]) -> None:
    """One ordinary decoding step for every row (each row's last token, through the ragged cache), with the
    context-lookup chain of the rows that have one."""
    tick = setup.clock()
    trees = [Tree.chain([int(state.rows[index].input_ids[0, -1])] + chains.get(index, [])) for index in state.active]
    rows = len(trees)
    _, forward_seconds = verify_batch(setup, state, trees)
    seconds = setup.clock() - tick
    nodes = max(len(tree) for tree in trees)
    if chains:  # a verify step for the rows with a lookup chain
        state.stats.verify_steps += 1
        state.stats.lookup_time += seconds
        record_lookups(state, chains, nodes, (seconds - forward_seconds) / rows)
        state.controller.record_forward("verify", nodes, forward_seconds / rows)  # costs are per row
    else:
        state.stats.plain_steps += 1
        state.stats.plain_time += seconds
        state.controller.record_plain_step(forward_seconds / rows)


def record_lookups(state: BatchState, chains: dict[int, list[int]], nodes: int, overhead: float) -> None:
    """Count the step's lookup chains and give the controller their overhead per row (the forward is recorded
    once, by the step)."""
    for _ in chains:
        state.stats.lookup_steps += 1
        state.controller.record_lookup_step(overhead, nodes)


def tree_batch_step(setup: DecodeSetup, state: BatchState, budget: int, chains: dict[int, list[int]]) -> None:
    """Draft once for every row, build each row's tree with the step's budget (at most what its length limit
    lets in) and graft its context-lookup chain on it, if it has one; verify all trees in one forward."""
    stats = state.stats
    tick = setup.clock()
    draft_logits = run_batch_draft(setup, state, budget)
    draft_seconds = setup.clock() - tick
    stats.draft_time += draft_seconds

    tick = setup.clock()
    policy = setup.policies[0]
    max_length = setup.generation_config.max_length
    drafted, trees = [], []
    for position, index in enumerate(state.active):
        row = state.rows[index]
        row_budget = min(budget, row.room(max_length))
        if row_budget == 0:
            tree = Tree.chain([int(row.input_ids[0, -1])])
        else:
            options = {"budget": row_budget} if setup.adaptive else {}
            tree = policy(draft_logits[position], row.input_ids[0], setup.draft.draft_to_target, **options)
        drafted.append(tree)
        trees.append(graft(tree, chains[index]) if index in chains else tree)
    tree_seconds = setup.clock() - tick
    stats.tree_time += tree_seconds

    tick = setup.clock()
    paths, forward_seconds = verify_batch(setup, state, trees)
    verify_seconds = setup.clock() - tick
    stats.verify_time += verify_seconds
    stats.verify_steps += 1
    rows = len(trees)
    overhead = (draft_seconds + tree_seconds + verify_seconds - forward_seconds) / rows
    nodes = max(len(tree) for tree in trees)
    record_lookups(state, chains, nodes, overhead)
    for tree, path in zip(drafted, paths):
        stats.tree_sizes.append(len(tree))
        stats.budgets.append(budget)
        stats.tree_kinds.append("drawn" if isinstance(policy, SampledChainPolicy) else "tree")
        # the drafted tree's own evidence: the path up to where it leaves the drafted nodes for a grafted chain
        drafted_path = [node for node in path if node < len(tree)]
        state.controller.record_step(tree, drafted_path, budget, overhead)
    state.controller.record_forward("verify", nodes, forward_seconds / rows)  # one forward, costs per row


def run_batch_draft(setup: DecodeSetup, state: BatchState, budget: int) -> torch.Tensor:
    """The draft's logits `[B, L, V_d]` for every active row, in one forward: each row's waiting positions
    (right-aligned, holes before them where a row has fewer than another), then the mask rows."""
    draft = setup.draft
    rows = [state.rows[index] for index in state.active]
    waiting = [torch.cat(row.waiting) if len(row.waiting) > 1 else row.waiting[0] for row in rows]
    longest = max(features.shape[0] for features in waiting)
    num_masks = min(budget, draft.config.draft_length) - 1
    device = waiting[0].device
    features = waiting[0].new_zeros(len(rows), longest, waiting[0].shape[-1])
    input_ids = torch.zeros(len(rows), longest, dtype=torch.long, device=device)
    for position, (row, row_features) in enumerate(zip(rows, waiting)):
        count = row_features.shape[0]
        features[position, longest - count :] = row_features
        input_ids[position, longest - count :] = row.input_ids[0, -count:]
        row.waiting = []
    lengths = torch.tensor([row_features.shape[0] for row_features in waiting], device=device)
    new_valid = torch.arange(longest, device=device)[None, :] >= (longest - lengths)[:, None]  # [B, T]
    step_valid = torch.cat([new_valid, new_valid.new_ones(len(rows), num_masks)], dim=-1)  # [B, T + M]
    if state.draft_valid is None:
        state.draft_valid = new_valid[:, :0]
    size = longest + num_masks
    causal = torch.ones(size, size, dtype=torch.bool, device=device).tril()
    visible = causal[None] & (step_valid[:, None, :] | torch.eye(size, dtype=torch.bool, device=device)[None])
    mask = ragged.rows_mask(state.draft_valid, visible, draft.dtype)
    positions = state.draft_valid.sum(-1, keepdim=True) + (step_valid.long().cumsum(-1) - 1).clamp(min=0)
    logits = draft(
        features, input_ids=input_ids, cache=state.draft_cache, num_masks=num_masks, position_ids=positions,
        attention_mask=mask,
    ).logits
    if num_masks > 0:
        state.draft_cache.crop(-num_masks)
    state.draft_valid = torch.cat([state.draft_valid, new_valid], dim=-1)
    return logits


def verify_batch(setup: DecodeSetup, state: BatchState, trees: list[Tree]) -> tuple[list[list[int]], float]:
    """One target forward over every active row's tree; each row accepts its own path (committed token by token)
    and keeps its path's cache columns; rows that stopped leave the batch. Returns the paths and the seconds of
    the forward."""
    tokens, ancestors = ragged.padded_trees(trees)
    past_len = state.valid.shape[1]
    tick = setup.clock()
    logits, features = ragged.forward_rows(
        setup.model, tokens, ancestors, ragged.padded_depths(trees), state.valid, state.cache, state.windows,
        setup.feature_layers,
    )
    forward_seconds = setup.clock() - tick
    paths = []
    for position, (index, tree) in enumerate(zip(state.active, trees)):
        row = state.rows[index]
        acceptance = accept(
            tree, logits[position, : len(tree)], row.with_padding(), row.processors,
            setup.generation_config.do_sample,
        )
        paths.append(acceptance.path)
        row.waiting.append(features[position, acceptance.path])
        if len(tree) > 1:
            state.stats.accepted_lengths.append(len(acceptance.tokens))
        for token, token_scores, token_logits in zip(acceptance.tokens, acceptance.scores, acceptance.logits):
            if commit(setup, state, row, token, token_scores, token_logits):
                break
    state.valid = torch.cat([state.valid, ragged.keep_paths(state.cache, past_len, paths)], dim=-1)
    drop_finished(state)
    return paths, forward_seconds


def commit(setup: DecodeSetup, state: BatchState, row: Row, token: int, token_scores, token_logits) -> bool:
    """Append one token to `row` (with its processed scores and raw logits `[1, V]`); returns (and records in
    `row.done`) whether the row ends here. A row ends where the stopping criteria, on the row alone, first say
    stop, when finished rows are padded; otherwise at the length where the last row of the batch stopped (vanilla
    `generate` decodes every row until then)."""
    row.input_ids = append_token(row, token, token_scores, token_logits, setup.generation_config)
    state.stats.new_tokens += 1
    length = row.pad_prefix.shape[1] + row.input_ids.shape[1]
    if row.stopped_at is None and bool(setup.stopping_criteria(row.with_padding(), None).all()):
        row.stopped_at = length
        if state.pads_finished_rows:
            row.length_limit = length
        elif all(other.stopped_at is not None for other in state.rows):
            for other in state.rows:
                other.length_limit = length
    row.done = row.length_limit is not None and length >= row.length_limit
    return row.done


def drop_finished(state: BatchState) -> None:
    """Rows that ended leave the batch: their cache rows go, and the columns no remaining row uses."""
    for row in state.rows:  # rows already past the length where the batch's last row stopped end there too
        if row.length_limit is not None and row.pad_prefix.shape[1] + row.input_ids.shape[1] >= row.length_limit:
            row.done = True
    keep = [position for position, index in enumerate(state.active) if not state.rows[index].done]
    if len(keep) == len(state.active):
        return
    state.active = [state.active[position] for position in keep]
    if not keep:
        return
    device = state.valid.device
    rows = torch.tensor(keep, dtype=torch.long, device=device)
    state.valid = ragged.select(state.cache, state.valid, rows)
    if state.draft_valid is not None:
        state.draft_valid = ragged.select(state.draft_cache, state.draft_valid, rows)


def finish_batch(setup: DecodeSetup, state: BatchState) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """Every row with its padding, then `pad_token_id` up to the longest row: `generate`'s output form."""
    config = setup.generation_config
    for row in state.rows:  # a row that ran past the length where the batch ended (no EOS padding) is cut there
        if row.length_limit is not None:
            row.input_ids = row.input_ids[:, : row.length_limit - row.pad_prefix.shape[1]]
            new_tokens = row.input_ids.shape[1] - row.prompt_length
            del row.scores[new_tokens:], row.logits[new_tokens:]
    width = max(row.with_padding().shape[1] for row in state.rows)
    pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    sequences = torch.stack([
        torch.nn.functional.pad(row.with_padding()[0], (0, width - row.with_padding().shape[1]), value=pad_token_id)
        for row in state.rows
    ])
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=per_step(state.rows, "scores") if config.output_scores else None,
        logits=per_step(state.rows, "logits") if config.output_logits else None,
    )


def per_step(rows: list[Row], name: str) -> tuple[torch.Tensor, ...]:
    """Each row's per-token `[1, V]` tensors named `name`, as one `[B, V]` tensor per step (zeros for a row past its
    end)."""
    steps = max(len(getattr(row, name)) for row in rows)
    template = next(getattr(row, name)[0] for row in rows if getattr(row, name))
    return tuple(
        torch.cat([getattr(row, name)[step] if step < len(getattr(row, name)) else torch.zeros_like(template)
                   for row in rows])
        for step in range(steps)
    )
