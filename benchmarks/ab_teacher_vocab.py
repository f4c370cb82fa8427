"""A training step from the feature cache with the target's logits over its whole vocabulary against over the
reduced draft vocabulary only (`draft_rows(..., teacher_vocab=...)`, what `DartTrainer` does), interleaved.

The loss restricts the target's distribution to the draft vocabulary either way, so both compute the same loss and
gradients (tests/test_training.py); what differs is the output layer's product over the label positions and the
size of the logits the loss reads. Shapes are Qwen2.5-Coder-1.5B-Instruct's (hidden 1536, 151,936-token
vocabulary) with random weights, since from the cache only the target's output layer runs (4 layers stand in for
its 28); the draft has a 32,768-token vocabulary; the cached batch holds random features.

    python benchmarks/ab_teacher_vocab.py [--rounds 4] [--batch-size 8] [--dtype float32|bfloat16] [--out FILE]
"""

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from _common import report
from dart_hf import DartDraftModel
from dart_hf.hardware import cpu_info
from dart_hf.training import DartDataCollator
from dart_hf.training.trainer import draft_rows, draft_vocabulary, rows_loss


def cached_batch(batch_size: int, prompt: int, reply: int, hidden: int, vocab: int) -> dict:
    """A collated batch as `CachedFeatureDataset` gives it: token ids with random cached features."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(batch_size):
        length = prompt + reply
        examples.append({
            "prompt_ids": torch.randint(vocab, (prompt,), generator=generator).tolist(),
            "response_ids": torch.randint(vocab, (reply,), generator=generator).tolist(),
            "target_features": torch.randn(length, 3 * hidden, generator=generator).bfloat16(),
            "target_last_hidden": torch.randn(length, hidden, generator=generator).bfloat16(),
        })
    return DartDataCollator(max_length=prompt + reply)(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="timed steps of each arm, alternating")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--reply-tokens", type=int, default=256)
    parser.add_argument("--anchors", type=int, default=24)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the target's dtype")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=4,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=False)
    target = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype)).eval()
    draft = DartDraftModel.from_target(target, draft_vocab_size=32768,
                                       draft_to_target_ids=torch.randperm(151936)[:32768].sort().values).train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-5)
    batch = cached_batch(args.batch_size, args.prompt_tokens, args.reply_tokens, 1536, 151936)
    arms = {"full vocabulary": None, "draft vocabulary": draft_vocabulary(draft)}

    def step(teacher_vocab) -> float:
        start = time.perf_counter()
        rows = draft_rows(draft, target, batch, args.anchors, supervised_only=True, teacher_vocab=teacher_vocab)
        rows_loss(rows, 0.6, draft_vocabulary(draft)).backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    for teacher_vocab in arms.values():  # untimed warm-up of each arm
        step(teacher_vocab)
    times = {name: [] for name in arms}
    for round_ in range(args.rounds):
        order = list(arms.items()) if round_ % 2 == 0 else list(arms.items())[::-1]
        for name, teacher_vocab in order:
            times[name].append(step(teacher_vocab))
            print(f"round {round_}: {name} {times[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    report({
        "cpu": cpu_info().describe(), "threads": torch.get_num_threads(), "args": vars(args) | {"out": str(args.out)},
        "step_seconds": times, "median_step_seconds": medians,
        "full_over_draft_vocabulary": medians["full vocabulary"] / medians["draft vocabulary"],
    }, args.out)


if __name__ == "__main__":
    main()
