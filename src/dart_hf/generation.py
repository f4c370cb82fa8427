"""The DART decode loop: prefill, then plain, lookup and tree steps, each committing through `verify`.

Two entry points reach `dart_generate`, both through `generate`'s own preparation (generation config, logits
processors, stopping criteria, cache; `dart_hf.routing` sends the first one here):

    target.generate(**inputs, assistant_model=draft)                      # after draft.bind(target)
    target.generate(**inputs, custom_generate=dart_generate, dart_draft=draft)

The loop reads top to bottom in `_decode`: a `DecodeSetup` (what the call decodes with) and a `DecodeState` (what
changes step by step), then one function per kind of step that the `StepPlanner` decides. Every step ends in
`commit`, token by token, so processors, stopping criteria and the streamer see what vanilla `generate` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import sliding_window
from .batch import decode_batch
from .budget import FixedBudget, budget_controller
from .features import forward_with_features, takes_logits_to_keep
from .hardware import device_clock
from .modeling_dart import DartDraftModel
from .options import (
    DecodingOptions,
    check_generation_config,
    check_fresh_cache,
    check_prompt_not_empty,
    decoding_mode,
    strip_left_padding,
)
from .planner import Step, StepPlanner
from .stats import DartStats
from .tree import BeamSearchTreePolicy, SampledChainPolicy, Tree, TopKTreePolicy, TreePolicy
from .verify import accept, append_token, choose_token, compact_cache, forward_tree


def dart_generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    dart_draft: DartDraftModel | None = None,
    dart_streamer=None,
    tree_policy: TreePolicy | None = None,
    tree_options: dict | None = None,
    tree_budget: int | None = None,
    tree_top_k: int | None = None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """DART tree decoding, called by `generate` as a `custom_generate` function (greedy or sampling, batch size 1).

    dart_draft: a `DartDraftModel` that fits `model` (bound to it, or to a model of the same shape: a copy, a
        fine-tune); it drafts with `model`'s embeddings for this call.
    dart_streamer: the user's streamer (`generate` drops `streamer` for custom functions; the router renames it).
    tree_policy: builds each tree from the draft logits, used as given (no adaptive budget); default: the one the
        options describe.
    tree_options: per-call overrides of the draft config's tree fields, named without the `tree_` prefix
        (`{"budget": 30, "ngram_weight": 0.3, "policy": "topk", "adaptive": False, "lookup_length": 0}`), plus
        `use_ngram=False` to ignore the draft's N-gram table; tree_budget / tree_top_k are shortcuts. Every option,
        its default and its meaning: `dart_hf.options.DecodingOptions`.

    With `adaptive` (default on) the budget is the largest tree; each step uses the budget that the measured forward
    costs and acceptance say is fastest, down to plain decoding steps when drafting loses (`dart_hf.budget`), and
    weighs verifying a context-lookup chain instead (`dart_hf.lookup`). When sampling, `sample_drafts` > 0 drafts a
    chain of drawn tokens instead of the deterministic tree, or whichever of the two is faster with
    `compare_policies`. `draft.stats` reports what the call did (`DartStats`).
    """
    draft = _checked_draft(dart_draft)
    options = DecodingOptions.resolve(draft.config, tree_options, tree_budget, tree_top_k)
    with draft.generating_with(model):
        return _decode(
            model, draft, input_ids, logits_processor, stopping_criteria, generation_config,
            dart_streamer if dart_streamer is not None else streamer, dart_streamer is not None,
            options, tree_policy, model_kwargs,
        )


@dataclass
class DecodeSetup:
    """What one call decodes with, fixed for the call. policies: the tree policies a step may draft with (the
    planner's `Step.arm` indexes them); adaptive: the controller picks the budgets (False with a user's
    `tree_policy`); streamer_gets_prompt: the streamer was forwarded by the router and also receives the prompt,
    as `generate` gives it to its own streamers; feature_layers: the target's hidden states the draft reads;
    last_logits_only: the forward arguments that skip the output layer but at the last position (a prompt's worth of
    logits at prefill), where the model takes them."""

    model: PreTrainedModel
    draft: DartDraftModel
    logits_processor: LogitsProcessorList
    stopping_criteria: StoppingCriteriaList
    generation_config: GenerationConfig
    streamer: object | None
    streamer_gets_prompt: bool
    options: DecodingOptions
    policies: list[TreePolicy]
    adaptive: bool
    clock: object  # `hardware.device_clock`: on an accelerator it waits for the device before each reading
    feature_layers: list[int]
    last_logits_only: dict

    @property
    def lookup_length(self) -> int:
        """The longest context-lookup chain a step may verify (0 without the adaptive controller)."""
        return self.options.lookup_chain_length() if self.adaptive else 0

    @property
    def max_budgets(self) -> list[int]:
        """The largest tree of each policy (nodes below the root)."""
        return [getattr(policy, "budget", self.draft.config.tree_budget) for policy in self.policies]


@dataclass
class DecodeState:
    """What changes step by step. input_ids: the committed tokens `[1, S]` without the left padding `pad_prefix`
    `[1, P]`; cache: the target's KV cache over them (plus the tree in flight); draft_cache: the draft's; waiting:
    target features `[1, T_i, 3H]` of positions the draft has not read yet, joined only when it runs; scores,
    logits: per committed token `[1, V]`, kept when `return_dict_in_generate` asks for them."""

    input_ids: torch.Tensor
    pad_prefix: torch.Tensor
    cache: DynamicCache
    stats: DartStats
    draft_cache: DynamicCache = field(default_factory=DynamicCache)
    waiting: list[torch.Tensor] = field(default_factory=list)
    planner: StepPlanner | None = None
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    stopped: bool = False

    def with_padding(self) -> torch.Tensor:
        """The sequence as vanilla `generate` holds it `[1, P + S]`: what processors, criteria and the caller see
        (min_new_tokens and the like count from the padded prompt; penalties read the pad ids)."""
        return torch.cat([self.pad_prefix, self.input_ids], dim=-1) if self.pad_prefix.shape[1] else self.input_ids

    def room(self, max_length: int) -> int:
        """Tokens the length limit lets in after the next one."""
        return max(max_length - self.pad_prefix.shape[1] - self.input_ids.shape[1] - 1, 0)


def _decode(
    model: PreTrainedModel,
    draft: DartDraftModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer,
    streamer_gets_prompt: bool,
    options: DecodingOptions,
    tree_policy: TreePolicy | None,
    model_kwargs: dict,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """The decode loop of `dart_generate`, with `draft` bound to `model`."""
    check_generation_config(input_ids, generation_config)
    adaptive = options.adaptive and tree_policy is None
    policies = [tree_policy] if tree_policy is not None else step_policies(draft, options, generation_config)
    setup = DecodeSetup(
        model, draft, logits_processor, stopping_criteria, generation_config, streamer, streamer_gets_prompt,
        options, policies, adaptive, device_clock(model.device), list(draft.config.feature_layers),
        {"logits_to_keep": 1} if takes_logits_to_keep(model) else {},
    )
    if input_ids.shape[0] > 1:
        return decode_batch(setup, input_ids, model_kwargs)
    state = new_state(setup, input_ids, model_kwargs)
    start = setup.clock()
    prefill(setup, state)
    state.planner = step_planner(setup)
    while not state.stopped:
        step = state.planner.next_step(state.input_ids[0], state.room(generation_config.max_length))
        if step.kind == "lookup":
            lookup_step(setup, state, step)
        elif step.kind == "plain":
            plain_step(setup, state, step)
        else:
            tree_step(setup, state, step)
    state.stats.total_time = setup.clock() - start
    state.planner.finish()
    return finish(setup, state)


def new_state(setup: DecodeSetup, input_ids: torch.Tensor, model_kwargs: dict) -> DecodeState:
    """The state before the prefill: the prompt split from its left padding, the fresh cache `generate` made, and
    `draft.stats` for this call. Refuses a cache that cannot hold trees and windows a tree would overrun."""
    cache = model_kwargs.get("cache")
    check_fresh_cache(cache)
    longest_verify = max(*setup.max_budgets, setup.lookup_length)
    _check_sliding_window(setup.model, cache, setup.generation_config.max_length, longest_verify)
    pad_prefix, input_ids = strip_left_padding(input_ids, model_kwargs.get("attention_mask"))
    check_prompt_not_empty(input_ids)
    state = DecodeState(input_ids, pad_prefix, cache, DartStats())
    setup.draft.stats = state.stats
    if setup.streamer is not None and setup.streamer_gets_prompt:
        setup.streamer.put(state.with_padding().cpu())
    return state


def step_planner(setup: DecodeSetup) -> StepPlanner:
    """The planner of the call: the adaptive controller (calibrating the costs on first use) with context lookup,
    or a `FixedBudget` at the one policy's budget."""
    if not setup.adaptive:
        return StepPlanner(FixedBudget(setup.max_budgets[0]))
    draft, lookup_length = setup.draft, setup.lookup_length
    controller, evidence = budget_controller(
        draft.controller_state, setup.model, draft, setup.max_budgets, lookup_length,
        decoding_mode(setup.generation_config),
    )
    return StepPlanner(controller, lookup_length, setup.options.lookup_max_match, evidence, draft.step_observers)


def prefill(setup: DecodeSetup, state: DecodeState) -> None:
    """The target's forward over the prompt: commits the first new token; the prompt's features wait for the
    draft."""
    tick = setup.clock()
    features, _ = forward_and_commit(setup, state, state.input_ids)
    state.waiting.append(features)
    state.stats.prefill_time = setup.clock() - tick


def plain_step(setup: DecodeSetup, state: DecodeState, step: Step) -> None:
    """One ordinary decoding step over the last token; its features wait for the draft's next step."""
    tick = setup.clock()
    features, forward_seconds = forward_and_commit(setup, state, state.input_ids[:, -1:])
    state.waiting.append(features)
    state.stats.plain_steps += 1
    state.stats.plain_time += setup.clock() - tick
    state.planner.record_plain(step, forward_seconds)


def lookup_step(setup: DecodeSetup, state: DecodeState, step: Step) -> None:
    """Verify the step's context-lookup tokens as a chain after the last committed token, without drafting."""
    tick = setup.clock()
    chain = Tree.chain([int(state.input_ids[0, -1])] + step.chain.tolist())
    _, forward_seconds, accept_seconds = verify(setup, state, chain)
    state.stats.lookup_steps += 1
    state.stats.lookup_time += setup.clock() - tick
    state.planner.record_lookup(step, accept_seconds, forward_seconds)


def tree_step(setup: DecodeSetup, state: DecodeState, step: Step) -> None:
    """Draft, build the step's tree with its policy, verify it."""
    stats = state.stats
    tick = setup.clock()
    draft_logits = run_draft(setup, state, step.budget)
    draft_seconds = setup.clock() - tick
    stats.draft_time += draft_seconds

    tick = setup.clock()
    policy = setup.policies[step.arm]
    budget = {"budget": step.budget} if setup.adaptive else {}  # a fixed policy builds its own budget's tree
    tree = policy(draft_logits[0], state.input_ids[0], setup.draft.draft_to_target, **budget)
    tree_seconds = setup.clock() - tick
    stats.tree_time += tree_seconds

    tick = setup.clock()
    path, forward_seconds, accept_seconds = verify(setup, state, tree)
    stats.verify_time += setup.clock() - tick
    stats.tree_sizes.append(len(tree))
    stats.budgets.append(step.budget)
    stats.tree_kinds.append("drawn" if isinstance(policy, SampledChainPolicy) else "tree")
    state.planner.record_tree(step, tree, path, draft_seconds + tree_seconds + accept_seconds, forward_seconds)


def run_draft(setup: DecodeSetup, state: DecodeState, budget: int) -> torch.Tensor:
    """The draft's logits `[1, L, V_d]` for the levels a tree of `budget` can reach: rows for the positions the
    target processed since the last draft step, each with the token that follows it, then mask rows (a chain of
    `budget` nodes at most; the draft's attention is causal, so fewer mask rows leave the kept levels' logits
    unchanged)."""
    features = torch.cat(state.waiting, dim=1) if len(state.waiting) > 1 else state.waiting[0]
    state.waiting = []
    num_masks = min(budget, setup.draft.config.draft_length) - 1
    input_ids = state.input_ids[:, -features.shape[1] :]
    logits = setup.draft(features, input_ids=input_ids, cache=state.draft_cache, num_masks=num_masks).logits
    if num_masks > 0:
        state.draft_cache.crop(-num_masks)
    return logits


def forward_and_commit(setup: DecodeSetup, state: DecodeState, new_ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """One ordinary target forward over `new_ids` `[1, T]` (the prompt at prefill, else the last token), then commit
    the next token. Returns the features of those T positions `[1, T, 3H]` and the seconds of the forward."""
    tick = setup.clock()
    outputs, features = forward_with_features(
        setup.model, setup.feature_layers, input_ids=new_ids, cache=state.cache, use_cache=True,
        **setup.last_logits_only,
    )
    token_logits = outputs.logits[:, -1].to(dtype=torch.float32, copy=True)
    forward_seconds = setup.clock() - tick
    token_scores = setup.logits_processor(state.with_padding(), token_logits)
    token = choose_token(token_scores[0], setup.generation_config.do_sample)
    state.stopped = commit(setup, state, token, token_scores, token_logits)
    return features, forward_seconds


def verify(setup: DecodeSetup, state: DecodeState, tree: Tree) -> tuple[list[int], float, float]:
    """One target forward over `tree`; keep the accepted path's cache rows, commit its tokens. Returns the accepted
    path (node indices, root first), the seconds of the forward and the seconds spent after it (acceptance, cache
    compaction)."""
    past_length = state.cache.get_seq_length()
    rows, weight_major = state.planner.forward_layout(len(tree))
    tick = setup.clock()
    tree_logits, tree_features = forward_tree(
        setup.model, tree, state.cache, setup.feature_layers, rows, weight_major
    )
    forward_done = setup.clock()
    acceptance = accept(
        tree, tree_logits, state.with_padding(), setup.logits_processor, setup.generation_config.do_sample
    )
    compact_cache(state.cache, past_length, acceptance.path)
    accept_seconds = setup.clock() - forward_done
    state.waiting.append(tree_features[acceptance.path].unsqueeze(0))
    state.stats.verify_steps += 1
    state.stats.accepted_lengths.append(len(acceptance.tokens))
    for token, token_scores, token_logits in zip(acceptance.tokens, acceptance.scores, acceptance.logits):
        state.stopped = commit(setup, state, token, token_scores, token_logits)
        if state.stopped:
            break
    return acceptance.path, forward_done - tick, accept_seconds


def commit(
    setup: DecodeSetup, state: DecodeState, token: int, token_scores: torch.Tensor, token_logits: torch.Tensor
) -> bool:
    """Append one token (with its processed scores and raw logits `[1, V]`); return True when generation must
    stop."""
    state.input_ids = append_token(state, token, token_scores, token_logits, setup.generation_config)
    state.stats.new_tokens += 1
    if setup.streamer is not None:
        setup.streamer.put(state.input_ids.new_tensor([token]).cpu())
    return bool(setup.stopping_criteria(state.with_padding(), None).all())


def finish(setup: DecodeSetup, state: DecodeState) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """End the streamer; the sequence with its padding, in `generate`'s output form."""
    if setup.streamer is not None:
        setup.streamer.end()
    sequences = state.with_padding()
    config = setup.generation_config
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(state.scores) if config.output_scores else None,
        logits=tuple(state.logits) if config.output_logits else None,
        cache=state.cache,
    )


def step_policies(
    draft: DartDraftModel, options: DecodingOptions, generation_config: GenerationConfig
) -> list[TreePolicy]:
    """The tree policies a call's steps may draft with: the options' tree; when sampling with `sample_drafts`, the
    drawn chain instead, or the chain then the tree when the adaptive controller weighs both (`compare_policies`)."""
    tree_policy = draft_tree_policy(draft, options, eos_token_id=generation_config.eos_token_id)
    if not (generation_config.do_sample and options.sample_drafts):
        return [tree_policy]
    chain = sampled_chain_policy(draft, tree_policy, options.sample_drafts, generation_config)
    return [chain, tree_policy] if options.adaptive and options.compare_policies else [chain]


def draft_tree_policy(
    draft: DartDraftModel, options: DecodingOptions | None = None, eos_token_id: int | list[int] | None = None
) -> TreePolicy:
    """The tree policy `options` describe (default: the draft config's), searching with the draft's N-gram table
    unless `use_ngram` is off. eos_token_id: the ids the beam search ranks last (default: the draft config's)."""
    options = options if options is not None else DecodingOptions.from_config(draft.config)
    if options.policy == "topk":
        return TopKTreePolicy(budget=options.budget, top_k=options.top_k)
    ngram = draft.ngram if options.use_ngram else None
    if ngram is not None:
        ngram.check_fits(draft.config.vocab_size)
    eos = draft.config.eos_token_id if eos_token_id is None else eos_token_id
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    return BeamSearchTreePolicy(
        budget=options.budget, top_k=options.top_k, beam_width=options.beam_width, level_decay=options.level_decay,
        logit_decay=options.logit_decay, ngram_weight=options.ngram_weight, ngram_at_root=options.ngram_at_root,
        full_softmax=options.full_softmax, ngram=ngram, eos_token_ids=eos_ids,
    )


def sampled_chain_policy(
    draft: DartDraftModel, tree_policy: TreePolicy, sample_drafts: float, generation_config: GenerationConfig
) -> SampledChainPolicy:
    """The drafted chain of sampling mode: tokens drawn at `sample_drafts` times the user's temperature (the
    target's distribution is that much flatter, and so is the draft's best guess at it), at most one per level,
    with the budget, top-k and N-gram table (with its weight) of `tree_policy`, the tree it replaces."""
    temperature = generation_config.temperature if generation_config.temperature else 1.0
    return SampledChainPolicy(
        budget=min(tree_policy.budget, draft.config.draft_length), temperature=sample_drafts * temperature,
        vocab_size=draft.config.vocab_size, ngram=getattr(tree_policy, "ngram", None),
        ngram_weight=getattr(tree_policy, "ngram_weight", 0.0), top_k=tree_policy.top_k,
    )


def _checked_draft(draft: DartDraftModel | None) -> DartDraftModel:
    if not isinstance(draft, DartDraftModel):
        raise ValueError(
            "dart_generate needs the draft: call `target.generate(..., custom_generate=dart_generate, "
            "dart_draft=draft)` with a DartDraftModel, or `target.generate(..., assistant_model=draft)` after "
            f"`draft.bind(target)`. Got dart_draft={type(draft).__name__}."
        )
    return draft


def _check_sliding_window(model: PreTrainedModel, cache: DynamicCache, max_length: int, tree_budget: int) -> None:
    """Sliding-window layers are verified exactly at any length (`dart_hf.sliding_window`) where the model takes
    their masks; the Triton tree-attention kernel has no window, so with it they are exact only while the whole
    generation plus one tree fits inside the window."""
    sliding_window.check_supported(model, cache)
    if model.config._attn_implementation != "dart_tree":
        return
    for layer in sliding_window.sliding_layers(cache):
        if max_length + tree_budget >= layer.sliding_window:
            raise ValueError(
                f"The target has sliding-window attention (window {layer.sliding_window}) and runs the Triton "
                "tree-attention kernel (attn_implementation='dart_tree'), which has no window: exact only while "
                f"max_length + tree_budget stays below the window, got {max_length} + {tree_budget}. Use "
                "attn_implementation='sdpa' (any length), or lower max_new_tokens or tree_budget."
            )


