"""Batched DART decoding: every row token-identical to vanilla batched `generate` on the same left-padded batch
(three architectures, one with sliding windows, rows of different lengths accepting different numbers of tokens,
rows stopping early while others go on), sampling's exact law per row, `num_return_sequences`, scores and logits
per row, and the refusals."""

import os
import random
from collections import Counter

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, TextStreamer

from _helpers import FLAT_COSTS, VOCAB_SIZE, char_tokenizer, force_costs, prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.batch import StepRates, graft
from dart_hf.costs import ForwardCosts
from dart_hf.modeling_dart import DartDraftOutput
from dart_hf.tree import Tree
import test_generation_fuzz as fuzz
from test_sampling import NEW_TOKENS, SAMPLES, SETTINGS, chi_square, exact_joint, peaked_target

WINDOW = 16


def gemma3_windowed(seed: int = 0) -> transformers.PreTrainedModel:
    """A 6-layer random Gemma 3 (five windowed layers of WINDOW positions, then a full one)."""
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, eos_token_id=None, bos_token_id=None,
        pad_token_id=0, sliding_window=WINDOW,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


TARGETS = {
    "llama": lambda: tiny_target("llama"),
    "qwen3": lambda: tiny_target("qwen3", seed=1),
    "gemma3_windowed": gemma3_windowed,
}


def left_padded(rows: list[torch.Tensor], pad_token_id: int = 0) -> dict:
    """input_ids and attention_mask of `rows` (`[1, S_i]` each), left-padded to the longest."""
    width = max(row.shape[1] for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, width - row.shape[1] :] = row[0]
        attention_mask[index, width - row.shape[1] :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


class BatchOracleDraft(DartDraftModel):
    """A draft that knows each row's true continuation (`references`, the rows of vanilla's output without padding):
    a row at position p gets its true next tokens at the first `(p + row) % 4` levels and wrong ones below, so rows
    of one step accept different numbers of tokens. A row is recognised by its position and last token (a tie
    picks the first reference: that row's draft is then wrong, which is allowed)."""

    def forward(self, target_hidden_states, input_ids=None, cache=None, position_ids=None, **kwargs):
        output = super().forward(target_hidden_states, input_ids=input_ids, cache=cache, position_ids=position_ids,
                                 **kwargs)
        logits = torch.randn_like(output.logits)
        real = target_hidden_states.shape[1]
        for row in range(logits.shape[0]):
            last = int(position_ids[row, real - 1])  # the last real row's position; its next token is at last + 1
            token = int(input_ids[row, -1])
            reference = next((ref for ref in self.references if len(ref) > last + 1 and ref[last + 1] == token), [])
            correct = (last + row) % 4
            for level in range(logits.shape[1]):
                position = last + 2 + level
                true = reference[position] if position < len(reference) else 0
                logits[row, level, true] = 50.0 if level < correct else -50.0
        return DartDraftOutput(logits=logits, cache=output.cache)


def real_rows(sequences: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    return [row[mask.shape[0] - int(mask.sum()) :].tolist() for row, mask in zip(sequences, attention_mask)]


@pytest.mark.parametrize("arch", list(TARGETS))
def test_greedy_batches_are_token_identical_to_vanilla_batched_generate(arch):
    """Batches of 2 to 8 prompts of 3 to 30 tokens, 40 new tokens (past the window of the windowed target): a fixed
    tree every step with rows accepting 0 to 3 drafted tokens each, then the adaptive default."""
    target = TARGETS[arch]()
    torch.manual_seed(0)
    draft = BatchOracleDraft.from_target(target)
    ragged_steps = 0
    for batch_size, seed in ((2, 1), (5, 2), (8, 3)):
        batch = left_padded(prompts(batch_size, seed=seed, min_len=3, max_len=30))
        expected = target.generate(**batch, max_new_tokens=40, do_sample=False)
        draft.references = real_rows(expected, batch["attention_mask"])
        for options in ({"adaptive": False, "budget": 8}, {}):
            output = target.generate(**batch, max_new_tokens=40, assistant_model=draft, tree_options=options)
            assert torch.equal(output, expected), (arch, batch_size, options)
        fixed = target.generate(**batch, max_new_tokens=40, assistant_model=draft,
                                tree_options={"adaptive": False, "budget": 8})
        assert torch.equal(fixed, expected)
        lengths = draft.stats.accepted_lengths
        steps = [lengths[start : start + batch_size] for start in range(0, len(lengths) - batch_size, batch_size)]
        ragged_steps += sum(len(set(step)) > 1 for step in steps)
        assert max(lengths) >= 3  # drafted tokens were accepted
    assert ragged_steps > 0  # rows of one step accepted different numbers of tokens


def test_rows_that_stop_early_leave_the_batch_and_the_rest_go_on():
    """EOS: a target whose EOS is a token it often emits; rows end at different steps and are padded after their
    EOS as vanilla pads them; stop strings per row; max_length reached by every row at once."""
    target = tiny_target("llama", seed=2)
    batch = left_padded(prompts(6, seed=5, min_len=2, max_len=25))
    probe = target.generate(**batch, max_new_tokens=30, do_sample=False)
    eos = Counter(probe[:, batch["input_ids"].shape[1] :].flatten().tolist()).most_common(1)[0][0]
    torch.manual_seed(0)
    draft = BatchOracleDraft.from_target(target)
    expected = target.generate(**batch, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    lengths = [(row[batch["input_ids"].shape[1] :] == eos).nonzero() for row in expected]
    assert len({int(found[0]) if len(found) else -1 for found in lengths}) > 2  # rows end at different steps
    draft.references = real_rows(expected, batch["attention_mask"])
    output = target.generate(**batch, max_new_tokens=30, assistant_model=draft, eos_token_id=eos, pad_token_id=0,
                             tree_options={"adaptive": False, "budget": 8})
    assert torch.equal(output, expected)

    tokenizer = char_tokenizer()
    stops = ["ab", "x", "Q"]
    expected = target.generate(**batch, max_new_tokens=30, do_sample=False, stop_strings=stops, tokenizer=tokenizer)
    output = target.generate(**batch, max_new_tokens=30, assistant_model=draft, stop_strings=stops,
                             tokenizer=tokenizer, tree_options={"adaptive": False, "budget": 8})
    assert torch.equal(output, expected)


def test_scores_and_logits_per_row_match_vanilla_until_each_row_ends():
    target = tiny_target("qwen3", seed=1)
    batch = left_padded(prompts(3, seed=7))
    probe = target.generate(**batch, max_new_tokens=12, do_sample=False)
    eos = int(probe[0, -4])
    expected = target.generate(**batch, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0,
                               return_dict_in_generate=True, output_scores=True, output_logits=True,
                               repetition_penalty=1.3)
    draft = BatchOracleDraft.from_target(target)
    draft.references = real_rows(expected.sequences, batch["attention_mask"])
    output = target.generate(**batch, max_new_tokens=12, assistant_model=draft, eos_token_id=eos, pad_token_id=0,
                             return_dict_in_generate=True, output_scores=True, output_logits=True,
                             repetition_penalty=1.3, tree_options={"adaptive": False, "budget": 8})
    assert torch.equal(output.sequences, expected.sequences)
    prompt_width = batch["input_ids"].shape[1]
    for row in range(3):
        new = expected.sequences[row, prompt_width:].tolist()
        length = new.index(eos) + 1 if eos in new else len(new)
        for step in range(length):
            torch.testing.assert_close(output.scores[step][row], expected.scores[step][row])
            torch.testing.assert_close(output.logits[step][row], expected.logits[step][row])
        for step in range(length, len(output.scores)):
            assert not output.scores[step][row].any()


def test_sampling_follows_the_exact_law_per_row():
    """A batch of 3 left-padded prompts, deterministic 61-node trees every step: each row's first three sampled
    tokens follow the target's exact joint distribution after that row's prompt."""
    target = peaked_target()
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    rows = [torch.tensor([[1, 5, 2]]), torch.tensor([[3, 3, 1, 6, 2, 7]]), torch.tensor([[4]])]
    batch = left_padded(rows)
    kwargs, processors = SETTINGS["temperature"]
    torch.manual_seed(0)
    observed, accepted = [Counter() for _ in rows], []
    for _ in range(SAMPLES):
        output = target.generate(**batch, max_new_tokens=NEW_TOKENS, do_sample=True, assistant_model=draft,
                                 tree_options={"adaptive": False, "sample_drafts": 0}, **kwargs)
        for row in range(len(rows)):
            observed[row][tuple(output[row, batch["input_ids"].shape[1] :].tolist())] += 1
        accepted += draft.stats.accepted_lengths
    assert sum(length >= 2 for length in accepted) >= SAMPLES // 10  # drafted tokens were accepted, often
    for row, prompt in enumerate(rows):
        statistic, critical = chi_square(observed[row], exact_joint(target, processors, prompt), SAMPLES)
        assert statistic < critical, (row, statistic, critical)


def test_num_return_sequences_samples_each_sequence_from_the_exact_law():
    target = peaked_target()
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, feature_layers=[1, 2, 3])
    prompt = torch.tensor([[1, 5, 2]])
    kwargs, processors = SETTINGS["temperature"]
    torch.manual_seed(1)
    observed = Counter()
    for _ in range(SAMPLES // 4):
        output = target.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=True, num_return_sequences=4,
                                 assistant_model=draft, **kwargs)
        assert output.shape == (4, prompt.shape[1] + NEW_TOKENS)
        for row in output:
            observed[tuple(row[prompt.shape[1] :].tolist())] += 1
    statistic, critical = chi_square(observed, exact_joint(target, processors, prompt), 4 * (SAMPLES // 4))
    assert statistic < critical, (statistic, critical)


def test_the_controller_prices_steps_at_the_batch_size_and_falls_back_to_plain_batched_steps():
    """Costs where a tree of 9 nodes per row costs five one-token forwards: with a draft that is never right,
    the controller decodes the batch in plain steps after its first tries; the output stays identical."""
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target)
    force_costs(draft, ForwardCosts([1, 2, 9, 65], [0.010, 0.013, 0.05, 0.4]))
    batch = left_padded(prompts(4, seed=9))
    expected = target.generate(**batch, max_new_tokens=60, do_sample=False)
    output = target.generate(**batch, max_new_tokens=60, assistant_model=draft, tree_options={"lookup_length": 0})
    assert torch.equal(output, expected)
    assert draft.stats.plain_steps > 3 * len(set(draft.stats.budgets) or {0})
    assert draft.stats.plain_fraction > 0.5


def test_batches_refuse_a_streamer_and_padding_on_the_right():
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target)
    batch = left_padded(prompts(2, seed=1, min_len=3, max_len=8))
    with pytest.raises(ValueError, match="streamer"):
        target.generate(**batch, max_new_tokens=4, assistant_model=draft, streamer=TextStreamer(char_tokenizer()))
    right = {"input_ids": batch["input_ids"].flip(-1), "attention_mask": batch["attention_mask"].flip(-1)}
    with pytest.raises(ValueError, match="left padding only"):
        target.generate(**right, max_new_tokens=4, assistant_model=draft)


def test_context_lookup_chains_per_row_stay_identical_to_vanilla():
    """Tiny random targets fall into loops, so each row's own context predicts it: with a forward that costs about
    the same for any size, the controller verifies rows' lookup chains (grafted on their trees, or alone on plain
    steps), and every row stays identical to vanilla."""
    target = tiny_target("qwen2", seed=4)
    draft = DartDraftModel.from_target(target)
    force_costs(draft, FLAT_COSTS)
    batch = left_padded(prompts(4, seed=11, min_len=3, max_len=12))
    expected = target.generate(**batch, max_new_tokens=80, do_sample=False)
    output = target.generate(**batch, max_new_tokens=80, assistant_model=draft)
    assert torch.equal(output, expected)
    assert draft.stats.lookup_steps > 0
    assert max(draft.stats.accepted_lengths) > 3


def test_a_lookup_chain_is_grafted_along_the_drafted_nodes_that_carry_it():
    tree = Tree.from_parents(torch.tensor([1, 5, 6, 7]), [-1, 0, 0, 1])  # root 1; children 5, 6; 5 -> 7
    tree.ranks = torch.tensor([0, 1, 2, 3])
    grafted = graft(tree, [5, 7, 9, 4])
    assert grafted.tokens.tolist() == [1, 5, 6, 7, 9, 4]
    assert grafted.parents.tolist() == [-1, 0, 0, 1, 3, 4]
    assert grafted.ranks.tolist() == [0, 1, 2, 3, 4, 5]
    assert graft(tree, [8]).parents.tolist() == [-1, 0, 0, 1, 0]


FUZZ_CASES = int(os.environ.get("DART_BATCH_FUZZ_CASES", "40"))


def draw_batch_case(seed: int) -> tuple:
    """Case `seed`: a target, a left-padded batch of 2 to 5 drawn prompts, `generate` options drawn as
    `test_generation_fuzz` draws them for one sequence (every processor with per-row state among them), and
    DART's own choices."""
    rng = random.Random(seed)
    arch = rng.choice(fuzz.ARCHITECTURES)
    rows = [fuzz.draw_prompt(rng) for _ in range(rng.randint(2, 5))]
    written = list(fuzz.free_run(arch, tuple(rows[0])))
    kwargs = {"pad_token_id": rng.choice([0, written[0]])}
    if rng.random() < 0.5:
        kwargs["eos_token_id"] = rng.choice(written[: rng.randint(1, len(written))])
        if rng.random() < 0.3:
            kwargs["min_new_tokens"] = rng.randint(1, 8)
    kwargs["max_new_tokens"] = rng.choice([1, 2, rng.randint(3, 30)])
    options = {
        "no_repeat_ngram_size": rng.randint(1, 3), "repetition_penalty": rng.choice([0.7, 1.3]),
        "encoder_repetition_penalty": rng.choice([0.8, 1.5]), "encoder_no_repeat_ngram_size": rng.randint(1, 2),
        "bad_words_ids": [[written[1]], [written[2], written[3]]],
        "sequence_bias": {(written[0],): -4.0, (written[4], written[5]): 6.0},
        "prefix_allowed_tokens_fn": fuzz.allowed_by_length, "guidance_scale": rng.choice([0.5, 1.5]),
        "watermarking_config": transformers.WatermarkingConfig(bias=4.0, context_width=rng.randint(1, 3)),
    }
    for name, value in options.items():
        if rng.random() < 0.2:
            kwargs[name] = value
    if rng.random() < 0.3:
        kwargs.update(do_sample=True, top_k=1, temperature=rng.choice([0.5, 1.3]))
    else:
        kwargs["do_sample"] = False
    if rng.random() < 0.2:
        kwargs.update(stop_strings=[char_tokenizer().decode(written[2:4])], tokenizer=char_tokenizer())
    tree_options = rng.choice([{}, {"lookup_length": 0}, {"adaptive": False, "budget": rng.choice([1, 4, 16])}])
    return arch, rows, kwargs, tree_options, rng.random() < 0.5


@pytest.mark.parametrize("seed", range(FUZZ_CASES), ids=lambda seed: f"case_{seed}")
def test_drawn_batches_are_token_identical_to_vanilla(seed):
    arch, rows, kwargs, tree_options, oracle = draw_batch_case(seed)
    target = fuzz.target_for(arch)
    batch = left_padded([torch.tensor([row]) for row in rows], pad_token_id=kwargs["pad_token_id"])
    expected = target.generate(**batch, **kwargs)
    torch.manual_seed(seed)
    draft = (BatchOracleDraft if oracle else DartDraftModel).from_target(target)
    draft.references = real_rows(expected, batch["attention_mask"])
    force_costs(draft, FLAT_COSTS)
    output = target.generate(**batch, **kwargs, assistant_model=draft, tree_options=tree_options)
    assert torch.equal(output, expected), (seed, arch, kwargs, tree_options)


def test_step_rates_let_measured_throughput_decide_and_back_off_a_losing_probe():
    rates = StepRates()
    assert rates.drafting_allowed()  # no measurement of drafting yet
    rates.record(True, 0.2, 4)
    rates.record(True, 0.2, 4)
    assert not rates.drafting_allowed()  # then plain steps, to measure them
    rates.record(False, 0.1, 4)
    rates.record(False, 0.1, 4)
    assert rates.drafting_allowed() is False  # drafting 0.05 s per token, plain 0.025: plain
    for _ in range(rates.drafting_wait - 1):
        rates.record(False, 0.1, 4)
    assert rates.drafting_allowed()  # a probe of drafting after the wait
    rates.record(True, 0.2, 4)  # it loses: the next wait is twice as long
    assert rates.drafting_wait == 32 and not rates.drafting_allowed()
    winning = StepRates()
    for _ in range(2):
        winning.record(True, 0.1, 8)
        winning.record(False, 0.1, 4)
    assert winning.drafting_allowed()
    for _ in range(winning.explore_every):
        winning.record(True, 0.1, 8)
    assert not winning.drafting_allowed()  # a plain step now and then keeps plain steps measured
