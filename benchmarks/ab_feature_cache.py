"""The feature cache's target forwards, as `build_feature_cache` runs them against how it ran them before, interleaved:

- "in order, every logit": batches in the examples' order, the output layer over every position;
- "by length, last logit": batches of examples sorted by length (less padding), the output layer over each
  example's last position only (`logits_to_keep=1`; the cache keeps no logits).

The target is a zoo model in float32 (the recipe's dtype on a CPU without bfloat16 instructions), the examples
the first `--examples` training examples of a self-distilled file (every 20th line is held out, as the recipes
do). Besides the seconds, the rows each arm runs through the target (padding included) over the whole file, in
shards of 256 as the cache builds them.

    python benchmarks/ab_feature_cache.py --target qwen2.5-coder-1.5b-instruct \\
        --data data/qwen_coder/selfdistill.jsonl --examples 24 --rounds 2 \\
        --out benchmarks/results/ab_feature_cache_qwen_coder_1.5b.json
"""

import argparse
import json
import time
from pathlib import Path

import torch

from _common import report
from dart_hf.features import forward_with_features
from dart_hf.hardware import device_description
from dart_hf.modeling_dart import default_feature_layers
from dart_hf.training.feature_cache import output_layer_input, right_padded
from dart_hf.zoo import load_target

SHARD_SIZE, BATCH_SIZE = 256, 8


def batches(lengths: list[int], by_length: bool) -> list[list[int]]:
    """The example indices of each batch, shard by shard, in order or sorted by length within each shard."""
    result = []
    for start in range(0, len(lengths), SHARD_SIZE):
        shard = list(range(start, min(start + SHARD_SIZE, len(lengths))))
        if by_length:
            shard.sort(key=lambda i: lengths[i])
        result += [shard[i : i + BATCH_SIZE] for i in range(0, len(shard), BATCH_SIZE)]
    return result


def padded_rows(lengths: list[int], by_length: bool) -> int:
    return sum(max(lengths[i] for i in batch) * len(batch) for batch in batches(lengths, by_length))


@torch.no_grad()
def run_arm(target, sequences: list[list[int]], layers: list[int], new: bool) -> float:
    lengths = [len(s) for s in sequences]
    start = time.perf_counter()
    for batch in batches(lengths, by_length=new):
        input_ids, attention_mask = right_padded([sequences[i] for i in batch])
        if new:
            output_layer_input(target, input_ids, attention_mask, layers)
        else:
            forward_with_features(target, layers, input_ids=input_ids, attention_mask=attention_mask)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--data", type=Path, default=Path("data/qwen_coder/selfdistill.jsonl"))
    parser.add_argument("--examples", type=int, default=24, help="how many training examples each arm runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    records = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    training = [r["prompt_ids"] + r["response_ids"] for i, r in enumerate(records) if i % 20]
    target, _ = load_target(args.target, dtype=torch.float32)
    layers = default_feature_layers(target.config.get_text_config().num_hidden_layers)
    sample = training[: args.examples]
    run_arm(target, sample[:BATCH_SIZE], layers, new=True)  # warm-up
    arms = {"in order, every logit": False, "by length, last logit": True}
    seconds = {name: [] for name in arms}
    for round_index in range(args.rounds):
        for name in list(arms) if round_index % 2 == 0 else list(arms)[::-1]:
            seconds[name].append(run_arm(target, sample, layers, arms[name]))
            print(round_index, name, round(seconds[name][-1], 1), flush=True)
    lengths = [len(s) for s in training]
    results = {
        "target": args.target, "dtype": "float32", "machine": device_description("cpu"),
        "threads": torch.get_num_threads(), "examples": len(sample), "rounds": args.rounds,
        "seconds": seconds,
        "speedup (total seconds)": sum(seconds["in order, every logit"]) / sum(seconds["by length, last logit"]),
        "rows through the target over the whole file": {
            "examples": len(training), "tokens": sum(lengths),
            "in order": padded_rows(lengths, False), "by length": padded_rows(lengths, True),
        },
        "rows through the target for the sample": {
            "in order": padded_rows(lengths[: len(sample)], False),
            "by length": padded_rows(lengths[: len(sample)], True),
        },
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
