"""Tiny random targets and test drafts shared by the test modules."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

from dart_hf import DartDraftModel
from dart_hf.costs import ForwardCosts
from dart_hf.modeling_dart import DartDraftOutput

VOCAB_SIZE = 128
FLAT_COSTS = ForwardCosts([1, 65], [0.010, 0.011])  # a tree costs about what one token does (a GPU's shape)
CONFIG_CLASSES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}


def tiny_target(
    arch: str = "llama", dtype: torch.dtype = torch.float32, attn: str = "sdpa", seed: int = 0, **overrides
) -> PreTrainedModel:
    """A 6-layer random causal LM of the given architecture (no EOS, so it always runs to max_new_tokens)."""
    fields = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    fields.update(overrides)
    config = CONFIG_CLASSES[arch](**fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
    return model.eval()


def prompts(count: int, seed: int = 0, min_len: int = 3, max_len: int = 20) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=generator)
    return [torch.randint(1, VOCAB_SIZE, (1, int(n)), generator=generator) for n in lengths]


def char_tokenizer():
    """A character-level tokenizer over the tiny targets' 128-token vocabulary (token i is one character)."""
    import string

    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    characters = list(string.ascii_letters + string.digits + string.punctuation + " ")
    characters += [chr(code) for code in range(0xC0, 0xC0 + 128 - len(characters))]
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(characters)}, merges=[]))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=characters[0], pad_token=characters[0])
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


class OracleDraft(DartDraftModel):
    """A draft that knows the true continuation: levels < `correct_levels` put it first, the other levels put it
    last (so it can never be in the tree there). Every step then accepts exactly `correct_levels` drafted tokens
    plus the bonus token. The real draft forward still runs, so the draft cache is exercised as in real use."""

    def set_reference(self, sequence: torch.Tensor, correct_levels: int) -> None:
        self.reference = sequence[0].tolist()
        self.correct_levels = correct_levels

    def forward(self, target_hidden_states, input_ids=None, cache=None, **kwargs) -> DartDraftOutput:
        past_len = cache.get_seq_length() if cache is not None else 0
        output = super().forward(target_hidden_states, input_ids=input_ids, cache=cache, **kwargs)
        last_real_position = past_len + target_hidden_states.shape[1] - 1
        logits = torch.randn_like(output.logits)
        for level in range(logits.shape[1]):
            position = last_real_position + 2 + level
            token = self.reference[position] if position < len(self.reference) else 0
            logits[0, level, token] = 50.0 if level < self.correct_levels else -50.0
        return DartDraftOutput(logits=logits, cache=output.cache)


def force_costs(draft: DartDraftModel, costs: ForwardCosts) -> None:
    """Pin the draft's controller to these target forward costs and a free draft forward, with steps timed as
    taking no overhead (`ControllerState.pin`): its decisions then depend on the text alone, not on this machine."""
    draft.controller_state.pin(costs)


def cli_failure(capsys, argv: list[str], exit_code: int = 1) -> str:
    """Run `dart-hf argv`, expect it to fail with `exit_code` in at most two lines and no traceback; return them."""
    import re

    import pytest

    from dart_hf.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == exit_code
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    # progress bars (loading, counting) share stderr; the failure itself is what dart-hf and argparse print
    lines = [line for line in re.split(r"[\r\n]|\x1b\[A", stderr) if line.startswith(("dart-hf", "usage:"))]
    assert 1 <= len(lines) <= 2, lines
    return "\n".join(lines)
