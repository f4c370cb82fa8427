"""The DART decode loop (prefill, draft, tree, verify, commit) and its routing from `target.generate`.

Two entry points reach `dart_generate`, both through `generate`'s own preparation (generation config, logits
processors, stopping criteria, cache):

    target.generate(**inputs, assistant_model=draft)                      # after draft.bind(target)
    target.generate(**inputs, custom_generate=dart_generate, dart_draft=draft)
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import torch
from transformers import (
    DynamicCache,
    GenerationConfig,
    LogitsProcessorList,
    PreTrainedModel,
    StoppingCriteriaList,
    StopStringCriteria,
)
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import sliding_window
from .budget import (
    AdaptiveBudget,
    PolicyChoice,
    calibrate_draft_costs,
    calibrate_forward_costs,
    calibration_key,
)
from .features import forward_with_features, takes_logits_to_keep
from .hardware import device_clock
from .lookup import LookupTracker, find_continuations
from .modeling_dart import DartDraftModel
from .tree import BeamSearchTreePolicy, SampledChainPolicy, Tree, TopKTreePolicy, TreePolicy, check_positive_int
from .verify import accept, compact_cache, forward_tree

# `tree_options` that steer the decode loop rather than the tree policy (the chain path has no use for them)
DECODING_OPTIONS = ("adaptive", "lookup_length", "lookup_max_match", "sample_drafts", "compare_policies")


@dataclass
class DartStats:
    """What one DART `generate` call did. Times are wall-clock seconds.

    tau (mean acceptance length) = tokens committed by verify steps / verify steps, the bonus token included;
    the token that follows the prompt comes from the prefill and is not counted in tau. Verify steps include the
    `lookup_steps` (a context-lookup chain verified instead of a drafted tree); `budgets`, `tree_sizes` and
    `tree_kinds` are the drafted trees' ("drawn": a chain of drawn tokens; "tree": a deterministic tree).
    """

    verify_steps: int = 0
    new_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    tree_sizes: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    tree_kinds: list[str] = field(default_factory=list)
    plain_steps: int = 0
    lookup_steps: int = 0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    tree_time: float = 0.0
    verify_time: float = 0.0
    plain_time: float = 0.0
    lookup_time: float = 0.0
    total_time: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (bonus token included); 0 without verify steps."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def chosen_budget(self) -> int | None:
        """The tree budget used most often (the adaptive controller's choice), None without verify steps."""
        return max(set(self.budgets), key=self.budgets.count) if self.budgets else None

    @property
    def plain_fraction(self) -> float:
        """Share of the decoding steps that fell back to plain decoding (drafting did not pay)."""
        return self.plain_steps / max(self.plain_steps + self.verify_steps, 1)

    @property
    def lookup_fraction(self) -> float:
        """Share of the decoding steps that verified a context-lookup chain."""
        return self.lookup_steps / max(self.plain_steps + self.verify_steps, 1)


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
    tree_policy: builds each tree from the draft logits; default: the draft config's policy (`tree_*` fields).
    tree_options: per-call overrides of the config's tree fields, named without the `tree_` prefix
        (`{"budget": 30, "ngram_weight": 0.3, "policy": "topk", "adaptive": False, "lookup_length": 0}`), plus
        `use_ngram=False` to ignore the draft's N-gram table; tree_budget / tree_top_k are shortcuts. When sampling,
        `sample_drafts` (the config's `tree_sample_drafts`, default 0.7) > 0 drafts a chain of drawn tokens
        (`sampled_chain_policy`) instead of the tree policy's deterministic tree; 0 keeps the tree. With
        `compare_policies` (the config's `tree_compare_policies`, default on) and `adaptive`, each sampling step
        drafts with whichever of the two the measured costs and acceptance make faster (`dart_hf.budget.PolicyChoice`:
        the drawn chain where trees are dear, as on a CPU, the deterministic tree where they cost about one token).

    With `adaptive` (the config's `tree_adaptive`, default on) the budget is the largest tree; each step uses the
    budget that the measured forward costs and acceptance say is fastest, down to plain decoding steps when
    drafting loses (`dart_hf.budget`; `draft.stats` reports the choice). A `tree_policy` object is used as given.
    Adaptive decoding also weighs context lookup (`dart_hf.lookup`): when the last `lookup_max_match` tokens or
    fewer occurred earlier, up to `lookup_length` tokens that followed them, verified as a chain instead of a
    drafted tree when their measured acceptance makes that the fastest step (`lookup_length=0` turns it off).
    """
    draft = _checked_draft(dart_draft)
    with draft.generating_with(model):
        return _decode(
            model, draft, input_ids, logits_processor, stopping_criteria, generation_config,
            dart_streamer if dart_streamer is not None else streamer, forward_streamer=dart_streamer is not None,
            tree_policy=tree_policy, tree_options=tree_options, tree_budget=tree_budget, tree_top_k=tree_top_k,
            **model_kwargs,
        )


def _decode(
    model: PreTrainedModel,
    draft: DartDraftModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer,
    forward_streamer: bool,
    tree_policy: TreePolicy | None,
    tree_options: dict | None,
    tree_budget: int | None,
    tree_top_k: int | None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """The decode loop of `dart_generate`, with `draft` bound to `model`. forward_streamer: the streamer was
    forwarded by the router (it then also receives the prompt, as `generate` gives it to its own streamers)."""
    _check_generation_options(input_ids, generation_config)
    config = draft.config
    options = dict(tree_options or {})
    adaptive = options.pop("adaptive", config.tree_adaptive) and tree_policy is None
    lookup_length = options.pop("lookup_length", config.tree_lookup_length)
    lookup_max_match = options.pop("lookup_max_match", config.tree_lookup_max_match)
    if isinstance(lookup_length, bool) or not isinstance(lookup_length, int) or lookup_length < 0:
        raise ValueError(f"lookup_length must be an integer >= 0 (0 turns context lookup off), got {lookup_length!r}.")
    check_positive_int("lookup_max_match", lookup_max_match, config.tree_lookup_max_match)
    lookup_length = lookup_length if adaptive else 0  # whether a lookup pays is the controller's call
    sample_drafts = options.pop("sample_drafts", config.tree_sample_drafts)
    if not sample_drafts >= 0:
        raise ValueError(f"sample_drafts must be >= 0 (0 keeps deterministic trees when sampling), got {sample_drafts}.")
    compare_policies = options.pop("compare_policies", config.tree_compare_policies)
    policies = [tree_policy]  # the policies a step may draft with (the controller's `arm` says which)
    if tree_policy is None:
        options.update({k: v for k, v in (("budget", tree_budget), ("top_k", tree_top_k)) if v is not None})
        tree_policy = build_tree_policy(draft, eos_token_id=generation_config.eos_token_id, **options)
        policies = [tree_policy]
        if generation_config.do_sample and sample_drafts:  # drawn drafts; beside the tree, whichever is faster
            chain = sampled_chain_policy(draft, tree_policy, sample_drafts, generation_config)
            policies = [chain, tree_policy] if adaptive and compare_policies else [chain]
    cache = model_kwargs.get("cache")
    if not isinstance(cache, DynamicCache) or cache.get_seq_length() > 0:
        raise ValueError(
            "DART tree decoding needs a fresh DynamicCache; a static cache or a cache that already holds a prefix "
            "is not supported (drop `cache_implementation` / `past_key_values`)."
        )
    max_budgets = [getattr(policy, "budget", config.tree_budget) for policy in policies]
    _check_sliding_window(model, cache, generation_config.max_length, max(*max_budgets, lookup_length))

    pad_prefix, input_ids = _strip_left_padding(input_ids, model_kwargs.get("attention_mask"))
    check_prompt_not_empty(input_ids)
    def with_padding() -> torch.Tensor:
        """The sequence as vanilla `generate` holds it `[1, P + S]`: what processors, criteria and the caller see
        (min_new_tokens and the like count from the padded prompt; penalties read the pad ids)."""
        return torch.cat([pad_prefix, input_ids], dim=-1) if pad_prefix.shape[1] else input_ids

    if streamer is not None and forward_streamer:
        streamer.put(with_padding().cpu())
    stats = DartStats()
    draft.stats = stats
    clock = device_clock(model.device)  # on an accelerator, waits for the device before each reading
    feature_layers = list(config.feature_layers)
    keep_scores = generation_config.return_dict_in_generate and generation_config.output_scores
    keep_logits = generation_config.return_dict_in_generate and generation_config.output_logits
    scores, raw_logits = [], []

    def commit(token: int, token_scores: torch.Tensor, token_logits: torch.Tensor) -> bool:
        """Append one token; return True when generation must stop."""
        nonlocal input_ids
        input_ids = torch.cat([input_ids, input_ids.new_tensor([[token]])], dim=-1)
        stats.new_tokens += 1
        if keep_scores:
            scores.append(token_scores)
        if keep_logits:
            raw_logits.append(token_logits)
        if streamer is not None:
            streamer.put(input_ids.new_tensor([token]).cpu())
        return bool(stopping_criteria(with_padding(), None).all())

    # only the last position's logits are used: skip the output layer elsewhere (a prompt's worth at prefill)
    last_logits_only = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}

    def plain_step(new_ids: torch.Tensor) -> tuple[torch.Tensor, bool, float]:
        """One ordinary decoding step over `new_ids` `[1, T]` (the prompt at prefill, else the last token): commit
        the next token; return the features of those T positions `[1, T, 3H]`, whether generation stops and the
        seconds of the forward."""
        tick = clock()
        outputs, step_features = forward_with_features(
            model, feature_layers, input_ids=new_ids, cache=cache, use_cache=True, **last_logits_only
        )
        token_logits = outputs.logits[:, -1].to(dtype=torch.float32, copy=True)
        forward_seconds = clock() - tick
        token_scores = logits_processor(with_padding(), token_logits)
        token = choose_token(token_scores[0], generation_config.do_sample)
        return step_features, commit(token, token_scores, token_logits), forward_seconds

    start = clock()
    prompt_features, stopped, _ = plain_step(input_ids)
    waiting = [prompt_features]  # features `[1, T_i, 3H]` the draft has not read yet, joined only when it runs
    stats.prefill_time = clock() - start

    mode = decoding_mode(generation_config)
    controller = adaptive_budget(draft, model, max_budgets, lookup_length, mode) if adaptive else None
    lookups = LookupTracker() if lookup_length else None
    draft_cache = DynamicCache()

    def verify(tree: Tree) -> tuple[list[int], float, float]:
        """One target forward over `tree`; keep the accepted path's cache rows and commit its tokens. Returns the
        accepted path, the seconds of the forward and the seconds spent after it (acceptance, cache compaction)."""
        nonlocal stopped
        past_len = cache.get_seq_length()
        tick = clock()
        rows = controller.costs.rows(len(tree)) if controller is not None else None  # padded where that is faster
        weight_major = controller is not None and controller.costs.weight_major(rows)  # the faster layout there
        tree_logits, tree_features = forward_tree(model, tree, cache, feature_layers, rows, weight_major)
        forward_done = clock()
        acceptance = accept(tree, tree_logits, with_padding(), logits_processor, generation_config.do_sample)
        compact_cache(cache, past_len, acceptance.path)
        accept_seconds = clock() - forward_done
        waiting.append(tree_features[acceptance.path].unsqueeze(0))
        stats.verify_steps += 1
        stats.accepted_lengths.append(len(acceptance.tokens))
        for token, token_scores, token_logits in zip(acceptance.tokens, acceptance.scores, acceptance.logits):
            stopped = commit(token, token_scores, token_logits)
            if stopped:
                break
        return acceptance.path, forward_done - tick, accept_seconds

    while not stopped:
        if lookups is not None:  # score earlier continuations on what was committed since, then look up this one
            context = input_ids[0].cpu().numpy()
            for kind, matched in lookups.resolve(context):
                controller.lookup.record(kind, matched)
            candidates = find_continuations(context, lookup_max_match, lookup_length)
            for kind, continuation in candidates:
                lookups.propose(context, kind, continuation)
            # a chain of k tokens commits up to k + 1: verifying more than the length limit lets in is waste
            room = max(generation_config.max_length - pad_prefix.shape[1] - input_ids.shape[1] - 1, 0)
            chosen, length = controller.lookup_choice([(kind, min(c.size, room)) for kind, c in candidates])
            if length:  # verify the chosen continuation's first `length` tokens as a chain, without drafting
                tick = clock()
                chain = [int(context[-1])] + candidates[chosen][1][:length].tolist()
                _, forward_seconds, accept_seconds = verify(Tree.chain(chain))
                stats.lookup_steps += 1
                stats.lookup_time += clock() - tick
                controller.record_lookup_step(accept_seconds, length + 1, forward_seconds)
                continue

        budget = controller.next_budget() if controller is not None else max_budgets[0]
        if budget == 0:  # plain decoding step; its features wait for the draft's next step
            tick = clock()
            step_features, stopped, forward_seconds = plain_step(input_ids[:, -1:])
            waiting.append(step_features)
            stats.plain_steps += 1
            stats.plain_time += clock() - tick
            controller.record_plain_step(forward_seconds)
            continue

        # draft: rows for the positions the target processed since the last draft step, each with the token that
        # follows it, then mask rows for the levels a tree of this budget can reach (a chain of `budget` nodes at
        # most; the draft's attention is causal, so fewer mask rows leave the kept levels' logits unchanged)
        tick = clock()
        features = torch.cat(waiting, dim=1) if len(waiting) > 1 else waiting[0]
        waiting = []
        num_masks = min(budget, config.draft_length) - 1
        draft_logits = draft(
            features, input_ids=input_ids[:, -features.shape[1] :], cache=draft_cache, num_masks=num_masks
        ).logits
        if num_masks > 0:
            draft_cache.crop(-num_masks)
        draft_seconds = clock() - tick
        stats.draft_time += draft_seconds

        tick = clock()
        if controller is not None:
            step_policy = policies[controller.arm]
            tree = step_policy(draft_logits[0], input_ids[0], draft.draft_to_target, budget=budget)
        else:
            step_policy = policies[0]
            tree = step_policy(draft_logits[0], input_ids[0], draft.draft_to_target)
        tree_seconds = clock() - tick
        stats.tree_time += tree_seconds

        tick = clock()
        path, forward_seconds, accept_seconds = verify(tree)
        stats.verify_time += clock() - tick
        stats.tree_sizes.append(len(tree))
        stats.budgets.append(budget)
        stats.tree_kinds.append("drawn" if isinstance(step_policy, SampledChainPolicy) else "tree")
        if controller is not None:
            controller.record_step(tree, path, budget, draft_seconds + tree_seconds + accept_seconds, forward_seconds)
    stats.total_time = clock() - start
    if controller is not None:  # probes are spaced over the decoding stream: the next call goes on counting
        evidence = draft.controller_state.evidence.current
        evidence.plain_run, evidence.lost_probes = controller.plain_run, controller.lost_probes

    if streamer is not None:
        streamer.end()
    sequences = with_padding()
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=sequences,
            scores=tuple(scores) if keep_scores else None,
            logits=tuple(raw_logits) if keep_logits else None,
            cache=cache,
        )
    return sequences


def choose_token(scores: torch.Tensor, do_sample: bool) -> int:
    """The next token from processed scores `[V]`: sampled from their softmax, or the argmax (greedy)."""
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1))
    return int(scores.argmax())


def adaptive_budget(
    draft: DartDraftModel,
    target: PreTrainedModel,
    max_budgets: list[int],
    max_chain: int = 0,
    mode: tuple = ("greedy",),
) -> AdaptiveBudget | PolicyChoice:
    """The budget controller for one `generate` call in decoding `mode` (`decoding_mode`), from the draft's
    `controller_state`: the target's forward costs (calibrated once per model and machine for trees up to the
    largest of `max_budgets` or `max_chain` lookup tokens), the draft's own forward costs per level
    (`calibrate_draft_costs`, once per draft), and `mode`'s evidence (acceptance, lookup outcomes, plain steps since
    the last probe) with the recent forwards' timings.
    One largest budget per tree policy: an `AdaptiveBudget` for one, a `PolicyChoice` between two (the drawn chain,
    then the deterministic tree), each with its own acceptance evidence. The tree beats the chain only with more
    nodes than the chain has levels, so it is weighed only where a tree of twice as many nodes costs at most two
    one-token forwards (a GPU); on a CPU, where it costs more, the chain alone drafts (weighing both measured 1-2%
    slower there: docs/HISTORY.md)."""
    if len(max_budgets) > 2:
        raise ValueError(f"adaptive_budget weighs at most two tree policies, got {len(max_budgets)}.")
    state = draft.controller_state
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
        return chain
    return PolicyChoice(controllers)


def decoding_mode(generation_config: GenerationConfig) -> tuple:
    """What decides a tree's acceptance besides the text: greedy, or sampling with its temperature and truncation
    (T=1 accepts far fewer drafted tokens than greedy decoding of the same text)."""
    if not generation_config.do_sample:
        return ("greedy",)
    warpers = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
    return ("sample",) + tuple(getattr(generation_config, name, None) for name in warpers)


def build_tree_policy(draft: DartDraftModel, eos_token_id: int | list[int] | None = None, **options) -> TreePolicy:
    """The tree policy of the draft's config (`tree_*` fields), with `options` (names without `tree_`) on top.
    eos_token_id: the ids the beam search ranks last (default: the draft config's)."""
    fields = ("policy", "budget", "top_k", "beam_width", "level_decay", "logit_decay", "ngram_weight",
              "ngram_at_root", "full_softmax")
    use_ngram = options.pop("use_ngram", True)  # False: search without the draft's N-gram table
    unknown = set(options) - set(fields)
    if unknown:
        valid = [*fields, "use_ngram", *DECODING_OPTIONS]
        raise ValueError(f"Unknown tree option(s) {sorted(unknown)}; valid options: {valid}.")
    settings = {name: options.get(name, getattr(draft.config, f"tree_{name}")) for name in fields}
    policy = settings.pop("policy")
    if policy == "topk":
        return TopKTreePolicy(budget=settings["budget"], top_k=settings["top_k"])
    if policy != "beam":
        raise ValueError(f"Unknown tree policy {policy!r}; use 'beam' or 'topk'.")
    ngram = draft.ngram if use_ngram else None
    if ngram is not None:
        ngram.check_fits(draft.config.vocab_size)
    eos = draft.config.eos_token_id if eos_token_id is None else eos_token_id
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    return BeamSearchTreePolicy(ngram=ngram, eos_token_ids=eos_ids, **settings)


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


class GenerateRouter:
    """`target.generate` after `draft.bind(target)`: an `assistant_model` that is a `DartDraftModel` goes to
    `dart_generate` (through `generate`'s own preparation), or with `dart_chain=True` to Transformers' own assisted
    decoding fed by `DartCandidateGenerator`; everything else goes to the model's own `generate` unchanged.

    It holds its model by reference, as an attribute rather than a closure, so that `copy.deepcopy(model)` and
    pickling give the copy a router of the copy (a closure over the original's bound `generate` would make the copy
    generate with the original's weights). `previous` is an instance-level `generate` it replaced (None: the
    class's)."""

    def __init__(self, model: PreTrainedModel, previous=None):
        self.model = model
        self.previous = previous

    def __reduce__(self):
        return type(self), (self.model, self.previous)

    @property
    def __wrapped__(self):  # `inspect.signature` and `help` see the model's own `generate`
        return self.own_generate

    @property
    def own_generate(self):
        """The model's `generate` without DART routing, bound to the model."""
        return self.previous if self.previous is not None else type(self.model).generate.__get__(self.model)

    def __call__(self, *args, assistant_model=None, **kwargs):
        generate = self.own_generate
        if not isinstance(assistant_model, DartDraftModel):
            return generate(*args, assistant_model=assistant_model, **kwargs)
        if kwargs.get("custom_generate") is not None:
            raise ValueError("Pass either `assistant_model=<DART draft>` or `custom_generate=`, not both.")
        if kwargs.pop("dart_chain", False):  # Transformers' own assisted decoding, with DART's chain candidates
            from .candidates import dart_candidate_generator

            _check_chain_options(kwargs, self.model.generation_config)

            tree_options = dict(kwargs.pop("tree_options", None) or {})
            for option in DECODING_OPTIONS:
                tree_options.pop(option, None)
            generation_config = kwargs.get("generation_config") or self.model.generation_config
            eos = kwargs.get("eos_token_id", generation_config.eos_token_id)
            policy = build_tree_policy(assistant_model, eos_token_id=eos, **tree_options)
            with assistant_model.generating_with(self.model), dart_candidate_generator(
                self.model, assistant_model, policy
            ):
                return generate(*args, assistant_model=assistant_model, **kwargs)
        # `generate` drops `streamer` and `tokenizer` for custom functions: forward the streamer under another
        # name, and turn `stop_strings` (which needs the tokenizer) into a stopping criterion here
        streamer = kwargs.pop("streamer", None)
        _move_stop_strings_to_criteria(kwargs)
        return generate(
            *args, custom_generate=dart_generate, dart_draft=assistant_model, dart_streamer=streamer, **kwargs
        )


def install_generate_router(target: PreTrainedModel) -> None:
    """Route `target.generate(..., assistant_model=<DART draft>)` to DART (`GenerateRouter`); idempotent."""
    current = vars(target).get("generate")
    if isinstance(current, GenerateRouter) and current.model is target:
        return
    if isinstance(current, GenerateRouter):  # copied onto another instance by hand: route for this one
        current = current.previous
    target.generate = GenerateRouter(target, previous=current)


def remove_generate_router(target: PreTrainedModel) -> None:
    """Give `target` back the `generate` it had before `install_generate_router`."""
    current = vars(target).get("generate")
    if not isinstance(current, GenerateRouter):
        return
    del target.generate
    if current.previous is not None:
        target.generate = current.previous


def _check_chain_options(kwargs: dict, model_config: GenerationConfig) -> None:
    """Refuse what Transformers' assisted decoding (the `dart_chain` path) does not reproduce exactly: it checks
    stop strings and stopping criteria once per accepted chunk of tokens (a stop inside the chunk is run past), and
    it scores a whole chunk per call, which classifier-free guidance's one-token-per-call cache does not follow."""
    generation_config = kwargs.get("generation_config") or model_config
    stop_strings = kwargs.get("stop_strings", generation_config.stop_strings)
    fix = "Drop dart_chain: DART's tree decoding runs them exactly, token by token as vanilla `generate` does."
    if stop_strings or kwargs.get("stopping_criteria"):
        raise ValueError(
            "dart_chain=True runs Transformers' assisted decoding, which checks stop strings and stopping criteria "
            f"once per accepted chunk of tokens and can run past them. {fix}"
        )
    guidance_scale = kwargs.get("guidance_scale", generation_config.guidance_scale)
    if guidance_scale is not None and guidance_scale != 1:
        raise ValueError(
            "dart_chain=True runs Transformers' assisted decoding, whose chunks classifier-free guidance "
            f"(guidance_scale={guidance_scale}) does not score as vanilla `generate` does. {fix}"
        )


def _move_stop_strings_to_criteria(kwargs: dict) -> None:
    tokenizer = kwargs.pop("tokenizer", None)
    stop_strings = kwargs.pop("stop_strings", None)
    generation_config = kwargs.get("generation_config")
    if stop_strings is None and generation_config is not None and generation_config.stop_strings is not None:
        generation_config = copy.deepcopy(generation_config)
        stop_strings, generation_config.stop_strings = generation_config.stop_strings, None
        kwargs["generation_config"] = generation_config
    if stop_strings is None:
        return
    if tokenizer is None:
        raise ValueError(
            "There are one or more stop strings, either in the arguments to `generate` or in the model's generation "
            "config, but no tokenizer was passed: pass `tokenizer=tokenizer` to `generate`."
        )
    criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
    criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=stop_strings))
    kwargs["stopping_criteria"] = criteria


def _checked_draft(draft: DartDraftModel | None) -> DartDraftModel:
    if not isinstance(draft, DartDraftModel):
        raise ValueError(
            "dart_generate needs the draft: call `target.generate(..., custom_generate=dart_generate, "
            "dart_draft=draft)` with a DartDraftModel, or `target.generate(..., assistant_model=draft)` after "
            f"`draft.bind(target)`. Got dart_draft={type(draft).__name__}."
        )
    return draft


def _check_generation_options(input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
    if generation_config.num_beams != 1:
        raise ValueError(f"DART tree decoding cannot run beam search (num_beams={generation_config.num_beams}).")
    if generation_config.num_return_sequences != 1:
        raise ValueError("DART tree decoding returns one sequence: set num_return_sequences=1.")
    if generation_config.use_cache is False:
        raise ValueError(
            "DART tree decoding keeps the target's KV cache to verify each tree against it: drop use_cache=False."
        )
    if generation_config.cache_implementation not in (None, "dynamic"):
        raise ValueError(
            f"DART tree decoding needs a DynamicCache; cache_implementation={generation_config.cache_implementation!r} "
            "is not supported."
        )
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"DART tree decoding supports batch size 1 only for now (got a batch of {input_ids.shape[0]}); "
            "batching is not supported yet: generate one sequence per call."
        )


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


def check_prompt_not_empty(input_ids: torch.Tensor) -> None:
    """Raise a ValueError with the fix when `input_ids` `[1, S]` (padding stripped) holds no token."""
    if input_ids.shape[-1] == 0:
        raise ValueError(
            "The prompt is empty (or all padding): DART decoding starts from at least one prompt token. Pass a "
            "non-empty prompt, e.g. one that begins with the tokenizer's BOS token."
        )


def _strip_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a left-padded single sequence into (padding `[1, P]`, real tokens `[1, S - P]`)."""
    if attention_mask is None or bool(attention_mask.all()):
        return input_ids[:, :0], input_ids
    num_pad = int((attention_mask[0] == 0).sum())
    if bool(attention_mask[0, :num_pad].any()) or not bool(attention_mask[0, num_pad:].all()):
        raise ValueError("DART tree decoding accepts left padding only: the attention_mask must be 0...0 1...1.")
    return input_ids[:, :num_pad], input_ids[:, num_pad:]
