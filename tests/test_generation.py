"""Greedy losslessness of DART tree decoding against vanilla `generate`, stats, and generate() options."""

import itertools

import pytest
import torch
from transformers import MaxLengthCriteria, StoppingCriteria, StoppingCriteriaList

from _helpers import OracleDraft, char_tokenizer, prompts, tiny_target
from dart_hf import DartDraftModel, dart_generate

NEW_TOKENS = 64


def vanilla(target, prompt, **kwargs):
    return target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_untrained_draft_is_lossless(arch, dtype, attn):
    target = tiny_target(arch, dtype=dtype, attn=attn)
    draft = DartDraftModel.from_target(target)
    for prompt in prompts(4, seed=1):
        expected = vanilla(target, prompt)
        got = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=draft)
        assert torch.equal(got, expected)
        assert draft.stats.new_tokens == NEW_TOKENS
    # DART leaves no hooks behind (Transformers' output capture would slow every later forward, vanilla's too)
    assert not getattr(target, "_output_capturing_hooks_installed", False)
    assert all(not module._forward_hooks for module in target.modules())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("correct_levels", [3, 8])
def test_oracle_draft_is_lossless_and_tau_is_exact(arch, dtype, attn, correct_levels):
    target = tiny_target(arch, dtype=dtype, attn=attn, seed=2)
    draft = OracleDraft.from_target(target)
    for prompt in prompts(3, seed=3):
        expected = vanilla(target, prompt)
        # the oracle also knows the tokens past max_new_tokens, so the last step is as exact as the others
        longer = target.generate(prompt, max_new_tokens=NEW_TOKENS + 8, do_sample=False)
        draft.set_reference(longer, correct_levels)
        got = target.generate(  # the full tree every step (the adaptive budget is tested in test_budget.py)
            prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=draft, tree_options={"adaptive": False}
        )
        assert torch.equal(got, expected)
        stats = draft.stats
        # every step accepts `correct_levels` drafted tokens plus the bonus token (the last may be cut by max length)
        assert stats.accepted_lengths == [correct_levels + 1] * stats.verify_steps
        assert stats.verify_steps == -(-(NEW_TOKENS - 1) // (correct_levels + 1))
        assert stats.tau == correct_levels + 1


def test_custom_generate_entry_point_matches_assistant_model():
    target = tiny_target("qwen3")
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=4)[0]
    expected = vanilla(target, prompt)
    got = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, do_sample=False, custom_generate=dart_generate, dart_draft=draft
    )
    assert torch.equal(got, expected)


def test_tree_options_per_call_and_stats_times():
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target)
    draft.config.tree_adaptive = False  # every step a tree of the given budget, never a plain or lookup step
    prompt = prompts(1, seed=5)[0]
    expected = vanilla(target, prompt)
    for budget, top_k in [(1, 1), (8, 2), (120, 40)]:
        got = target.generate(
            prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, tree_budget=budget, tree_top_k=top_k
        )
        assert torch.equal(got, expected)
        assert max(draft.stats.tree_sizes) <= budget + 1
    stats = draft.stats
    assert stats.draft_time > 0 and stats.tree_time > 0 and stats.verify_time > 0
    assert stats.total_time >= stats.draft_time + stats.tree_time + stats.verify_time


def test_eos_list_max_length_and_logits_processor():
    target = tiny_target("llama", seed=6)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=6)[0]
    free_run = vanilla(target, prompt)[0, prompt.shape[1] :].tolist()
    eos = [free_run[10], free_run[20]]
    kwargs_list = [
        dict(max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=0),
        dict(max_new_tokens=NEW_TOKENS, eos_token_id=free_run[5], pad_token_id=0),
        dict(max_length=prompt.shape[1] + 17),
        dict(max_new_tokens=NEW_TOKENS, repetition_penalty=1.3, no_repeat_ngram_size=2),
        dict(max_new_tokens=NEW_TOKENS, min_new_tokens=30, eos_token_id=free_run[5], pad_token_id=0),
    ]
    for kwargs in kwargs_list:
        expected = target.generate(prompt, do_sample=False, **kwargs)
        got = target.generate(prompt, do_sample=False, assistant_model=draft, **kwargs)
        assert torch.equal(got, expected), kwargs


def test_custom_stopping_criteria():
    class StopAfterToken(StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    target = tiny_target("qwen2", seed=7)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=7)[0]
    stop_token = vanilla(target, prompt)[0, prompt.shape[1] + 12].item()
    criteria = StoppingCriteriaList([StopAfterToken(stop_token)])
    expected = vanilla(target, prompt, stopping_criteria=criteria)
    got = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, stopping_criteria=criteria, assistant_model=draft
    )
    assert torch.equal(got, expected)


def test_return_dict_scores_and_logits_match_vanilla():
    target = tiny_target("llama", dtype=torch.float64, seed=8)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=8)[0]
    kwargs = dict(
        max_new_tokens=20, do_sample=False, return_dict_in_generate=True, output_scores=True, output_logits=True
    )
    expected = target.generate(prompt, **kwargs)
    got = target.generate(prompt, assistant_model=draft, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) == 20
    for ours, theirs in zip(got.scores + got.logits, expected.scores + expected.logits):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_streamer_receives_prompt_then_each_token_once():
    class Recorder:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended = True

    target = tiny_target("llama", seed=9)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=9)[0]
    reference, ours = Recorder(), Recorder()
    expected = vanilla(target, prompt, streamer=reference)
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, streamer=ours)
    assert torch.equal(got, expected)
    assert ours.chunks == reference.chunks and ours.ended


def test_left_padded_single_sequence():
    target = tiny_target("llama", dtype=torch.float64, seed=10)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=10)[0]
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), prompt], dim=-1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(prompt)], dim=-1)
    expected = target.generate(padded, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = target.generate(padded, attention_mask=mask, max_new_tokens=NEW_TOKENS, assistant_model=draft)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("options", [
    dict(min_new_tokens=5), dict(min_length=12), dict(begin_suppress_tokens="first"), dict(no_repeat_ngram_size=2),
    dict(repetition_penalty=1.5), dict(forced_eos_token_id=7, max_length=20),
])
@pytest.mark.parametrize("pad_is_eos", [False, True])
@pytest.mark.parametrize("tree_options", [{}, {"adaptive": False}])
def test_left_padding_with_length_dependent_processors(options, pad_is_eos, tree_options):
    """Processors count from the padded prompt and read the pad ids, as vanilla's do."""
    target = tiny_target("llama", seed=10)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=10)[0]
    free = target.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1]:].tolist()
    eos = free[2]  # vanilla writes it early: min_new_tokens and the like hold it back
    pad = eos if pad_is_eos else free[0]
    options = dict(options)
    if options.get("begin_suppress_tokens") == "first":
        options["begin_suppress_tokens"] = [free[0]]
    padded = torch.cat([torch.full((1, 4), pad), prompt], dim=-1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(prompt)], dim=-1)
    kwargs = dict(attention_mask=mask, do_sample=False, eos_token_id=eos, pad_token_id=pad, **options)
    kwargs.setdefault("max_new_tokens", 16)
    expected = target.generate(padded, **kwargs)
    got = target.generate(padded, assistant_model=draft, tree_options=tree_options, **kwargs)
    assert got.tolist() == expected.tolist()


def test_dart_chain_refuses_what_assisted_decoding_cannot_stop_at_exactly():
    target = tiny_target("llama", seed=11)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=11)[0]
    chain = dict(max_new_tokens=8, assistant_model=draft, dart_chain=True)
    with pytest.raises(ValueError, match="once per accepted chunk.*Drop dart_chain"):
        target.generate(prompt, stop_strings=["ab"], tokenizer=char_tokenizer(), **chain)
    with pytest.raises(ValueError, match="once per accepted chunk.*Drop dart_chain"):
        target.generate(prompt, stopping_criteria=StoppingCriteriaList([MaxLengthCriteria(30)]), **chain)
    with pytest.raises(ValueError, match="guidance_scale=1.5.*Drop dart_chain"):
        target.generate(prompt, guidance_scale=1.5, **chain)
    # without dart_chain all three run, identical to vanilla
    for options in (dict(stop_strings=["ab"], tokenizer=char_tokenizer()), dict(guidance_scale=1.5)):
        expected = target.generate(prompt, max_new_tokens=8, do_sample=False, **options)
        assert torch.equal(target.generate(prompt, max_new_tokens=8, assistant_model=draft, **options), expected)


def test_other_assistants_still_reach_transformers():
    target = tiny_target("llama", seed=11)
    DartDraftModel.from_target(target)  # installs the router
    prompt = prompts(1, seed=11)[0]
    expected = vanilla(target, prompt)
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=3)
    assert torch.equal(got, expected)


def test_bad_generate_inputs_get_clear_errors():
    target = tiny_target("llama", seed=12)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=12)[0]
    with pytest.raises(ValueError, match="beam search"):
        target.generate(prompt, max_new_tokens=4, num_beams=2, assistant_model=draft)
    with pytest.raises(ValueError, match="drop use_cache=False"):
        target.generate(prompt, max_new_tokens=4, use_cache=False, assistant_model=draft)
    with pytest.raises(ValueError, match="static"):
        target.generate(prompt, max_new_tokens=4, cache_implementation="static", assistant_model=draft)
    with pytest.raises(ValueError, match="no tokenizer was passed"):
        target.generate(prompt, max_new_tokens=4, stop_strings=["x"], assistant_model=draft)
    with pytest.raises(ValueError, match="needs the draft"):
        target.generate(prompt, max_new_tokens=4, custom_generate=dart_generate)


@pytest.mark.parametrize("options,name", [
    ({"tree_budget": -3}, "tree_budget"), ({"tree_budget": 0}, "tree_budget"), ({"tree_budget": 2.5}, "tree_budget"),
    ({"tree_top_k": 0}, "tree_top_k"), ({"tree_options": {"budget": True}}, "tree_budget"),
    ({"tree_options": {"beam_width": -1}}, "tree_beam_width"),
])
@pytest.mark.parametrize("chain", [False, True])
def test_a_tree_size_that_is_not_a_positive_integer_gets_an_error_naming_the_fix(options, name, chain):
    target = tiny_target("llama", seed=12)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=12)[0]
    if chain and "tree_options" not in options:
        options = {"tree_options": {name.removeprefix("tree_"): next(iter(options.values()))}}
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got .*Pass an integer >= 1"):
        target.generate(prompt, max_new_tokens=4, assistant_model=draft, dart_chain=chain, **options)


def test_bad_lookup_options_get_errors_naming_the_fix():
    target = tiny_target("llama", seed=12)
    draft = DartDraftModel.from_target(target)
    with pytest.raises(ValueError, match="lookup_length must be an integer >= 0 \\(0 turns context lookup off\\)"):
        target.generate(prompts(1)[0], max_new_tokens=4, assistant_model=draft, tree_options={"lookup_length": -1})
    with pytest.raises(ValueError, match="lookup_max_match must be a positive integer, got 0. Pass an integer >= 1"):
        target.generate(prompts(1)[0], max_new_tokens=4, assistant_model=draft, tree_options={"lookup_max_match": 0})


@pytest.mark.parametrize("chain", [False, True])
def test_an_empty_prompt_gets_an_error_naming_the_fix(chain):
    target = tiny_target("llama", seed=12)
    draft = DartDraftModel.from_target(target)
    empty = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="prompt is empty.*Pass a non-empty prompt"):
        target.generate(empty, max_new_tokens=4, assistant_model=draft, dart_chain=chain)
    if not chain:  # all padding: empty once the padding is stripped
        padding = torch.zeros(1, 3, dtype=torch.long)
        with pytest.raises(ValueError, match="prompt is empty"):
            target.generate(padding, attention_mask=torch.zeros_like(padding), max_new_tokens=4, assistant_model=draft)


def test_a_draft_generates_with_any_target_it_fits_and_refuses_one_it_does_not():
    # `custom_generate` needs no binding: the draft runs with the model that generates, and stays as it was
    target = tiny_target("llama", seed=14)
    draft = DartDraftModel(DartDraftModel.from_target(target).config)  # never bound
    other = tiny_target("llama", seed=15)
    prompt = prompts(1, seed=14)[0]
    got = other.generate(prompt, max_new_tokens=NEW_TOKENS, custom_generate=dart_generate, dart_draft=draft)
    assert torch.equal(got, vanilla(other, prompt))
    with pytest.raises(RuntimeError, match="not bound to a target.*draft.bind\\(target\\)"):
        draft.target
    wider = tiny_target("llama", seed=16, hidden_size=48)
    with pytest.raises(ValueError, match="hidden size of 32, but the target has 48.*from_target"):
        wider.generate(prompt, max_new_tokens=4, custom_generate=dart_generate, dart_draft=draft)


def perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`model` with its output layer redrawn, so that it generates other tokens."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.copy_(torch.randn(head.shape, generator=generator, dtype=head.dtype))
    return model


def test_a_deep_copy_of_a_bound_target_generates_with_its_own_weights():
    import copy

    target = tiny_target("llama", seed=17)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=17)[0]
    original = vanilla(target, prompt)
    clone = perturbed(copy.deepcopy(target), seed=18)
    clone_vanilla = type(clone).generate(clone, prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert not torch.equal(clone_vanilla, original)  # the copy's own tokens differ from the original's
    assert torch.equal(vanilla(clone, prompt), clone_vanilla)
    got = clone.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=draft)
    assert torch.equal(got, clone_vanilla)
    chained = clone.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=draft, dart_chain=True)
    assert torch.equal(chained, clone_vanilla)
    assert draft.target is target  # the draft stays bound to the original, which still generates its own tokens
    assert torch.equal(target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft), original)


def test_unbind_gives_the_target_its_own_generate_back():
    target = tiny_target("llama", seed=19)
    draft = DartDraftModel.from_target(target)
    assert "generate" in vars(target)
    draft.unbind()
    assert "generate" not in vars(target)  # the class's `generate` again
    with pytest.raises(RuntimeError, match="not bound to a target"):
        draft.target
    prompt = prompts(1, seed=19)[0]
    with pytest.raises(AttributeError, match="draft.bind\\(target\\)"):  # no routing: a classic assistant
        target.generate(prompt, max_new_tokens=4, assistant_model=draft)
    draft.bind(target)
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft)
    assert torch.equal(got, vanilla(target, prompt))


def test_routing_survives_to_a_second_bind_and_a_second_target():
    first, second = tiny_target("llama", seed=20), perturbed(tiny_target("llama", seed=20), seed=21)
    draft = DartDraftModel.from_target(first)
    router = vars(first)["generate"]
    draft.bind(first)
    assert vars(first)["generate"] is router  # binding again installs nothing new
    first.to(torch.float64)
    draft.to(torch.float64)
    assert vars(first)["generate"] is router
    second.to(torch.float64)
    draft.bind(second)  # one draft, two targets: each generates with its own weights
    prompt = prompts(1, seed=20)[0]
    for model in (first, second, first):
        got = model.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft)
        assert torch.equal(got, vanilla(model, prompt))
    assert draft.target is second


def test_a_pickled_bound_target_routes_for_itself():
    import pickle

    target = tiny_target("llama", seed=22)
    draft = DartDraftModel.from_target(target)
    restored = pickle.loads(pickle.dumps(target))
    assert vars(restored)["generate"].model is restored
    perturbed(restored, seed=23)
    prompt = prompts(1, seed=22)[0]
    got = restored.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft)
    assert torch.equal(got, vanilla(restored, prompt))
    assert not torch.equal(got, vanilla(target, prompt))


def test_generate_with_a_target_that_was_never_bound():
    target = tiny_target("llama", seed=15)
    draft = DartDraftModel(DartDraftModel.from_target(tiny_target("llama", seed=16)).config)
    with pytest.raises(AttributeError, match="not bound to the DART draft.*draft.bind\\(target\\)"):
        target.generate(prompts(1, seed=15)[0], max_new_tokens=4, assistant_model=draft)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("policy", ["beam", "topk"])
def test_ngram_pruned_trees_are_lossless(arch, policy):
    import numpy as np

    from dart_hf import NgramTable

    target = tiny_target(arch, dtype=torch.float64, seed=17)
    draft = DartDraftModel.from_target(target)
    draft.config.tree_lookup_length = 0  # the trees are under test; lookup chains would replace some
    corpus = [vanilla(target, prompt)[0].tolist() for prompt in prompts(3, seed=18)]
    rng = np.random.default_rng(0)
    corpus += [rng.integers(0, 128, 40).tolist() for _ in range(50)]
    draft.ngram = NgramTable.from_sequences(corpus, vocab_size=128, progress=False)
    for prompt in prompts(3, seed=18) + prompts(2, seed=19):
        expected = vanilla(target, prompt)
        got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, tree_options={"policy": policy})
        assert torch.equal(got, expected)
    got = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft,
        tree_options={
            "budget": 20, "ngram_at_root": True, "full_softmax": True, "ngram_weight": 1.0, "adaptive": False
        },
    )
    assert torch.equal(got, expected) and max(draft.stats.tree_sizes) <= 21
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, tree_options={"use_ngram": False})
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="Unknown tree option"):
        target.generate(prompt, max_new_tokens=4, assistant_model=draft, tree_options={"beam": 3})
    # drawn drafts are a sampling option: greedy decoding keeps the deterministic tree, and stays exact
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, tree_options={"sample_drafts": 2})
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="sample_drafts must be >= 0"):
        target.generate(prompt, max_new_tokens=4, assistant_model=draft, tree_options={"sample_drafts": -1})


def test_stop_strings_text_streamer_and_generation_config_objects():
    from threading import Thread

    from transformers import GenerationConfig, TextIteratorStreamer

    target = tiny_target("llama", seed=20)
    draft = DartDraftModel.from_target(target)
    tokenizer = char_tokenizer()
    prompt = prompts(1, seed=20)[0]
    free_run = vanilla(target, prompt)[0, prompt.shape[1] :].tolist()
    stop = tokenizer.convert_ids_to_tokens(free_run[15])
    expected = vanilla(target, prompt, stop_strings=[stop], tokenizer=tokenizer)
    got = target.generate(
        prompt, max_new_tokens=NEW_TOKENS, stop_strings=[stop], tokenizer=tokenizer, assistant_model=draft
    )
    assert torch.equal(got, expected) and got.shape[1] < prompt.shape[1] + NEW_TOKENS

    config = GenerationConfig(max_new_tokens=30, do_sample=False, stop_strings=[stop], pad_token_id=0)
    expected = target.generate(prompt, generation_config=config, tokenizer=tokenizer)
    got = target.generate(prompt, generation_config=config, tokenizer=tokenizer, assistant_model=draft)
    assert torch.equal(got, expected) and config.stop_strings == [stop]  # the caller's config is left unchanged

    texts = []
    for assistant in (None, draft):
        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
        kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, streamer=streamer, assistant_model=assistant)
        thread = Thread(target=target.generate, args=(prompt,), kwargs=kwargs)
        thread.start()
        texts.append("".join(streamer))
        thread.join()
    assert texts[0] == texts[1] and texts[0].strip()


def test_sampling_options_run_and_commit_only_allowed_tokens():
    target = tiny_target("qwen3", seed=21)
    draft = DartDraftModel.from_target(target)
    prompt = prompts(1, seed=21)[0]
    torch.manual_seed(0)
    out = target.generate(
        prompt, max_new_tokens=40, do_sample=True, top_k=1, assistant_model=draft,
        return_dict_in_generate=True, output_scores=True,
    )
    # top_k=1 leaves one token per step: sampling must then equal greedy decoding
    assert torch.equal(out.sequences, vanilla(target, prompt)[:, : prompt.shape[1] + 40])
    assert len(out.scores) == 40 and all(int(torch.isfinite(s).sum()) == 1 for s in out.scores)


def test_context_lookup_engages_on_repeating_text_and_is_lossless():
    from _helpers import FLAT_COSTS, force_costs

    target = tiny_target("llama", seed=8)  # random models fall into loops: their text repeats itself
    draft = DartDraftModel.from_target(target)  # untrained: its trees are almost never accepted
    force_costs(draft, FLAT_COSTS)
    lookup_steps, longest = 0, 0
    for prompt in prompts(3, seed=9):
        expected = vanilla(target, prompt)
        assert torch.equal(target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft), expected)
        lookup_steps += draft.stats.lookup_steps
        longest = max(longest, *draft.stats.accepted_lengths)
    assert lookup_steps > 0 and longest >= 4  # chains were verified, and long ones accepted
    got = target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft, tree_options={"lookup_length": 0})
    assert torch.equal(got, expected) and draft.stats.lookup_steps == 0


def test_each_kind_of_lookup_is_judged_on_its_own_evidence(monkeypatch):
    """Evidence that continuations hold after matches whose earlier occurrences agree, and after disagreeing ones
    only when taken from the earliest occurrence: the chains verified are exactly those kinds, losslessly."""
    from _helpers import FLAT_COSTS, force_costs

    from dart_hf.budget import AdaptiveBudget
    from dart_hf.controller_state import LookupEvidence

    target = tiny_target("llama", seed=8)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, FLAT_COSTS)
    evidence = draft.controller_state.evidence.current.lookup = LookupEvidence(window=10**4, half_life=float("inf"))
    for match, ambiguous, which in itertools.product((1, 2, 3), (False, True), ("latest", "earliest")):
        for _ in range(1000):
            evidence.record((match, ambiguous, which), 0 if ambiguous and which == "latest" else 10)
    offered, verified = [], []  # the kinds of every candidate, and of every chain verified
    choose = AdaptiveBudget.lookup_choice

    def recording_lookup_choice(self, candidates):
        index, length = choose(self, candidates)
        offered.extend(kind for kind, available in candidates if available)
        if length:
            verified.append(candidates[index][0])
        return index, length

    monkeypatch.setattr(AdaptiveBudget, "lookup_choice", recording_lookup_choice)
    for prompt in prompts(3, seed=9):
        expected = vanilla(target, prompt)
        assert torch.equal(target.generate(prompt, max_new_tokens=NEW_TOKENS, assistant_model=draft), expected)
    assert any(ambiguous and which == "latest" for _, ambiguous, which in offered)  # they came up
    assert not any(ambiguous and which == "latest" for _, ambiguous, which in verified)  # and never won
    assert any(ambiguous for _, ambiguous, _ in verified) and any(not ambiguous for _, ambiguous, _ in verified)


def test_lookup_chains_stop_at_the_length_limit(monkeypatch):
    """A chain of k tokens commits up to k + 1, so near the end only what max_new_tokens still lets in is verified:
    no forward ever computes positions past max_length (the budget-1 trees reach it at most)."""
    from _helpers import FLAT_COSTS, force_costs

    import dart_hf.generation as generation
    from dart_hf.controller_state import LookupEvidence
    from dart_hf.verify import forward_tree

    target = tiny_target("llama", seed=8)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, FLAT_COSTS)
    evidence = draft.controller_state.evidence.current.lookup = LookupEvidence(window=10**4, half_life=float("inf"))
    for kind in itertools.product((1, 2, 3), (False, True), ("latest", "earliest")):  # every kind of lookup
        for _ in range(1000):  # continuations are known to hold: every match is verified, as long as it is
            evidence.record(kind, 10)
    cache_lengths = []

    def recording_forward_tree(model, tree, cache, feature_layers, rows=None, weight_major=False):
        outputs = forward_tree(model, tree, cache, feature_layers, rows, weight_major)
        cache_lengths.append(cache.get_seq_length())
        return outputs

    monkeypatch.setattr(generation, "forward_tree", recording_forward_tree)
    lookup_steps = 0
    for prompt in prompts(3, seed=9):
        for max_new_tokens in (5, 9, 14):
            cache_lengths.clear()
            got = target.generate(
                prompt, max_new_tokens=max_new_tokens, assistant_model=draft, tree_options={"budget": 1}
            )
            assert torch.equal(got, vanilla(target, prompt)[:, : prompt.shape[1] + max_new_tokens])
            assert max(cache_lengths, default=0) <= prompt.shape[1] + max_new_tokens
            lookup_steps += draft.stats.lookup_steps
    assert lookup_steps > 0
