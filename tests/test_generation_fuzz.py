"""Randomized equivalence: DART's greedy output against vanilla `generate` over drawn combinations of options.

Each case draws its `generate` options from its own seed, so a failure names the seed that reproduces it alone:

    python -m pytest tests/test_generation_fuzz.py -k "case_17-"

The suite runs `DART_FUZZ_CASES` cases (default 240) from seed `DART_FUZZ_FIRST_SEED` (default 0); run more by hand
with, e.g., `DART_FUZZ_CASES=3000 DART_FUZZ_FIRST_SEED=240 python -m pytest tests/test_generation_fuzz.py -q`.

What a case draws: the target (two architectures) and draft (untrained, or an oracle that knows the next 1-8 tokens,
so that whole paths of several tokens are accepted), left padding whose pad id is a real token or the EOS, every
logits processor Transformers builds from a generation config, greedy or sampling at top_k=1 with every warper
(deterministic: the argmax is the only token left), a `prefix_allowed_tokens_fn` and a custom processor that read
the sequence length, EOS ids, `max_new_tokens` from 1 (or `max_length`), stop strings and a custom stopping
criterion, `return_dict_in_generate` with scores and logits, a streamer, and DART's own choices (adaptive or fixed
trees of any budget, beam or top-k trees, context lookup on or off, `dart_chain`, the `custom_generate` entry).
"""

from __future__ import annotations

import functools
import os
import random

import pytest
import torch
from transformers import (
    LogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    WatermarkingConfig,
)

from _helpers import FLAT_COSTS, VOCAB_SIZE, OracleDraft, char_tokenizer, force_costs, tiny_target
from dart_hf import DartDraftModel, dart_generate

CASES = int(os.environ.get("DART_FUZZ_CASES", "240"))
FIRST_SEED = int(os.environ.get("DART_FUZZ_FIRST_SEED", "0"))
ARCHITECTURES = ("llama", "qwen3")


@functools.cache
def target_for(arch: str):
    return tiny_target(arch, seed=ARCHITECTURES.index(arch) + 40)


@functools.cache
def drafts_for(arch: str) -> tuple[DartDraftModel, OracleDraft]:
    target = target_for(arch)
    untrained, oracle = DartDraftModel.from_target(target), OracleDraft.from_target(target)
    for draft in (untrained, oracle):
        force_costs(draft, FLAT_COSTS)  # decisions depend on the text alone, not on this machine's timings
    return untrained, oracle


class LengthDependentBoost(LogitsProcessor):
    """Adds to the logit of token (sequence length mod vocabulary): right only if it sees vanilla's exact prefix."""

    def __call__(self, input_ids, scores):
        boosted = scores.clone()
        boosted[:, input_ids.shape[-1] % scores.shape[-1]] += 3.0
        return boosted


class StopAfterToken(StoppingCriteria):
    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class Recorder:
    """A streamer that keeps what it was given."""

    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.tolist())

    def tokens(self) -> list[int]:
        """Every streamed id in order (Transformers' assisted decoding streams several per call, vanilla one)."""
        return [token for chunk in self.chunks for token in torch.tensor(chunk).flatten().tolist()]

    def end(self):
        self.ended = True


def allowed_by_length(batch_id: int, input_ids: torch.Tensor) -> list[int]:
    """A `prefix_allowed_tokens_fn` whose answer depends on the prefix's length and last token."""
    length, last = input_ids.shape[-1], int(input_ids[-1])
    return [token for token in range(VOCAB_SIZE) if (token + length) % 3 != 0 or token == last]


def draw_prompt(rng: random.Random) -> list[int]:
    if rng.random() < 0.3:  # repeating text, where context lookup proposes chains
        unit = [rng.randrange(1, VOCAB_SIZE) for _ in range(rng.randint(2, 5))]
        return (unit * 8)[: rng.randint(6, 30)]
    return [rng.randrange(1, VOCAB_SIZE) for _ in range(rng.randint(1, 24))]


@functools.cache
def free_run(arch: str, prompt: tuple[int, ...], length: int = 24) -> list[int]:
    """Tokens the target writes after `prompt` without options: where EOS, stop and suppressed ids come from, so
    that they matter."""
    ids = torch.tensor([prompt])
    return target_for(arch).generate(ids, max_new_tokens=length, do_sample=False)[0, len(prompt):].tolist()


def draw_case(seed: int) -> dict:
    """The options of case `seed`: `generate` kwargs (`kwargs`), the prompt, padding and DART's own choices."""
    rng = random.Random(seed)
    arch = rng.choice(ARCHITECTURES)
    prompt = draw_prompt(rng)
    written = list(free_run(arch, tuple(prompt)))
    kwargs: dict = {}
    dart: dict = {"oracle_levels": rng.choice([0, 0, 1, 3, 8]), "chain": rng.random() < 0.12}
    dart["entry"] = "assistant_model"
    extras: dict = {"streamer": False, "processor": False, "stop_after": None, "stop_string": None}

    eos = None
    kind = rng.random()
    if kind < 0.35:
        eos = rng.choice(written[: rng.randint(1, len(written))])
    elif kind < 0.6:
        eos = [rng.choice(written), rng.randrange(VOCAB_SIZE)]
    kwargs["eos_token_id"] = eos
    first_eos = eos if isinstance(eos, int) else (eos[0] if eos else None)

    num_pad = rng.choice([0, 0, 1, 2, 4, 7])
    pad_id = first_eos if first_eos is not None and rng.random() < 0.5 else rng.choice([0, written[0]])
    kwargs["pad_token_id"] = pad_id

    if rng.random() < 0.8:
        kwargs["max_new_tokens"] = rng.choice([1, 2, 3, rng.randint(4, 40)])
    else:
        kwargs["max_length"] = num_pad + len(prompt) + rng.randint(1, 40)

    def maybe(probability: float) -> bool:
        return rng.random() < probability

    if eos is not None and maybe(0.4):
        kwargs["min_new_tokens"] = rng.randint(1, 12)
    if eos is not None and maybe(0.25):
        kwargs["min_length"] = num_pad + len(prompt) + rng.randint(1, 12)
    if maybe(0.3):
        kwargs["begin_suppress_tokens"] = [written[0]] + ([rng.randrange(VOCAB_SIZE)] if maybe(0.5) else [])
    if maybe(0.2):
        kwargs["suppress_tokens"] = rng.sample(written, k=min(2, len(written)))
    if maybe(0.3):
        kwargs["no_repeat_ngram_size"] = rng.randint(1, 3)
    if maybe(0.3):
        kwargs["repetition_penalty"] = rng.choice([0.7, 1.3, 2.0])
    if maybe(0.15):
        kwargs["encoder_repetition_penalty"] = rng.choice([0.8, 1.5])
    if maybe(0.15):
        kwargs["encoder_no_repeat_ngram_size"] = rng.randint(1, 2)
    if maybe(0.2):
        kwargs["bad_words_ids"] = [[written[1]], [written[2], written[3]]]
    if maybe(0.2):
        kwargs["sequence_bias"] = {(written[0],): -4.0, (written[4], written[5]): 6.0}
    if maybe(0.15):
        kwargs["forced_bos_token_id"] = rng.randrange(VOCAB_SIZE)
    if maybe(0.15):
        kwargs["forced_eos_token_id"] = rng.randrange(VOCAB_SIZE)
    if eos is not None and maybe(0.2):
        kwargs["exponential_decay_length_penalty"] = (rng.randint(0, 6), rng.choice([1.2, 2.0]))
    if maybe(0.1):
        kwargs["remove_invalid_values"] = True
    if maybe(0.15):
        kwargs["renormalize_logits"] = True
    if maybe(0.15):
        kwargs["watermarking_config"] = WatermarkingConfig(bias=4.0, context_width=rng.randint(1, 3))
    if maybe(0.15):
        kwargs["prefix_allowed_tokens_fn"] = allowed_by_length
    if maybe(0.2):
        extras["processor"] = True
    if not dart["chain"] and maybe(0.08):  # classifier-free guidance: runs the target itself, one call per token
        kwargs["guidance_scale"] = rng.choice([0.5, 1.5])

    if maybe(0.35):  # sampling with only the argmax left: deterministic, through DART's sampling paths
        kwargs.update(do_sample=True, top_k=1)
        for name, values in (("temperature", [0.5, 1.3]), ("top_p", [0.5, 0.9]), ("min_p", [0.05]),
                             ("typical_p", [0.8]), ("epsilon_cutoff", [3e-4]), ("eta_cutoff", [3e-4])):
            if maybe(0.3):
                kwargs[name] = rng.choice(values)
    else:
        kwargs["do_sample"] = False

    # Transformers' assisted decoding (the `dart_chain` path) checks stopping criteria once per accepted chunk and can
    # run past a stop inside it: with dart_chain, stop strings and criteria are refused (test_generation.py)
    if not dart["chain"] and maybe(0.2):
        extras["stop_after"] = rng.choice(written)
    if not dart["chain"] and maybe(0.15):
        extras["stop_string"] = char_tokenizer().decode(written[2:4])
    if maybe(0.3):
        kwargs.update(return_dict_in_generate=True, output_scores=maybe(0.8), output_logits=maybe(0.6))
    if maybe(0.2):
        extras["streamer"] = True

    if not dart["chain"] and maybe(0.15):
        dart["entry"] = "custom_generate"
    tree_options: dict = {}
    if maybe(0.4):
        tree_options["adaptive"] = False
    if maybe(0.4):
        tree_options["budget"] = rng.choice([1, 2, 5, 16, 40])
    if maybe(0.2):
        tree_options["policy"] = "topk"
    if maybe(0.2):
        tree_options["lookup_length"] = rng.choice([0, 3])
    if maybe(0.2):
        tree_options["use_ngram"] = False
    dart["tree_options"] = tree_options
    return dict(seed=seed, arch=arch, prompt=prompt, num_pad=num_pad, pad_id=pad_id, kwargs=kwargs, extras=extras,
                dart=dart)


def run_generate(case: dict, draft: DartDraftModel | None):
    """`generate` for `case`, vanilla (draft None) or with DART; returns (output, streamed chunks or None)."""
    target = target_for(case["arch"])
    num_pad, prompt = case["num_pad"], case["prompt"]
    input_ids = torch.tensor([[case["pad_id"]] * num_pad + prompt])
    attention_mask = torch.tensor([[0] * num_pad + [1] * len(prompt)])
    kwargs = dict(case["kwargs"])
    extras = case["extras"]
    if extras["processor"]:
        kwargs["logits_processor"] = [LengthDependentBoost()]
    criteria = StoppingCriteriaList()
    if extras["stop_after"] is not None:
        criteria.append(StopAfterToken(extras["stop_after"]))
    if extras["stop_string"] is not None and case["dart"]["entry"] == "custom_generate":
        # `generate` drops the tokenizer before a custom function: there, stop strings go in as a criterion
        criteria.append(StopStringCriteria(tokenizer=char_tokenizer(), stop_strings=[extras["stop_string"]]))
    elif extras["stop_string"] is not None:
        kwargs.update(stop_strings=[extras["stop_string"]], tokenizer=char_tokenizer())
    if criteria:
        kwargs["stopping_criteria"] = criteria
    recorder = Recorder() if extras["streamer"] else None
    if recorder is not None:
        kwargs["streamer"] = recorder
    if draft is not None:
        dart = case["dart"]
        if dart["chain"]:
            kwargs.update(assistant_model=draft, dart_chain=True)
        elif dart["entry"] == "custom_generate":
            kwargs.update(custom_generate=dart_generate, dart_draft=draft, dart_streamer=kwargs.pop("streamer", None))
        else:
            kwargs["assistant_model"] = draft
        if dart["tree_options"]:
            kwargs["tree_options"] = dict(dart["tree_options"])
    torch.manual_seed(0)
    output = target.generate(input_ids, attention_mask=attention_mask, **kwargs)
    return output, (recorder.tokens() if recorder is not None else None)


def draft_for(case: dict, expected: torch.Tensor) -> DartDraftModel:
    untrained, oracle = drafts_for(case["arch"])
    if not case["dart"]["oracle_levels"]:
        return untrained
    # the oracle reads positions of the unpadded sequence; past the end it proposes token 0
    oracle.set_reference(expected[:, case["num_pad"]:], case["dart"]["oracle_levels"])
    return oracle


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + CASES), ids=lambda seed: f"case_{seed}")
def test_dart_matches_vanilla_on_drawn_generate_options(seed):
    case = draw_case(seed)
    try:
        expected, expected_chunks = run_generate(case, None)
    except RuntimeError:  # the options left no token to sample from: DART must not write one either
        with pytest.raises(RuntimeError):
            run_generate(case, draft_for(case, torch.tensor([case["prompt"]])))
        return
    expected_ids = expected.sequences if hasattr(expected, "sequences") else expected
    got, got_chunks = run_generate(case, draft_for(case, expected_ids))
    got_ids = got.sequences if hasattr(got, "sequences") else got
    context = f"case {seed}: {case}"
    assert got_ids.tolist() == expected_ids.tolist(), context
    assert got_chunks == expected_chunks, context
    if hasattr(expected, "sequences"):
        for name in ("scores", "logits"):
            ours, theirs = getattr(got, name), getattr(expected, name)
            assert (ours is None) == (theirs is None), f"{name} {context}"
            if theirs is not None:
                assert len(ours) == len(theirs), f"{name} {context}"
                for step, (a, b) in enumerate(zip(ours, theirs)):
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"{name}[{step}] {context}")


def test_the_drawn_cases_cover_every_option():
    """The draw reaches each option often enough to matter (a guard against a draw that silently stops varying)."""
    cases = [draw_case(seed) for seed in range(FIRST_SEED, FIRST_SEED + CASES)]
    for name in ("min_new_tokens", "min_length", "begin_suppress_tokens", "no_repeat_ngram_size", "repetition_penalty",
                 "bad_words_ids", "sequence_bias", "watermarking_config", "prefix_allowed_tokens_fn", "top_p",
                 "return_dict_in_generate", "max_length", "exponential_decay_length_penalty", "forced_eos_token_id",
                 "guidance_scale"):
        assert sum(name in case["kwargs"] for case in cases) >= CASES // 20, name
    assert sum(case["num_pad"] > 0 and case["pad_id"] == case["kwargs"]["eos_token_id"] for case in cases) >= 5
    assert sum(case["dart"]["chain"] for case in cases) >= CASES // 20
    assert sum(case["dart"]["oracle_levels"] > 0 for case in cases) >= CASES // 4
