"""Training throughput of `DartTrainer` on this machine for a target shaped like SmolLM2-135M.

The target has SmolLM2-135M's architecture (Llama, 30 layers, hidden 576, 9 / 3 heads, 49,152-token vocabulary)
with random weights: the cost of a step does not depend on the weights. Sequences are 64 prompt + 192 response
tokens; the draft uses a reduced 8,192-token vocabulary and 32 sampled anchors per batch.

    python benchmarks/bench_training.py [--steps 12] [--batch-size 4] [--out benchmarks/results/training.json]
    python benchmarks/bench_training.py --feature-cache   # from the offline feature cache (built first, timed)
    python benchmarks/bench_training.py --device cuda --attention flex   # on a GPU (FlexAttention or dense mask)
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback, TrainingArguments

from _common import report
from dart_hf import DartDraftModel
from dart_hf.hardware import device_clock
from dart_hf.training import CachedFeatureDataset, DartDataCollator, DartTrainer, build_feature_cache


class StepTimer(TrainerCallback):
    """Each training step's seconds, read with the device clock (it waits for a GPU's queued work)."""

    def __init__(self, device: str):
        self.clock = device_clock(device)
        self.times = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = self.clock()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(self.clock() - self.start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--feature-cache", action="store_true", help="train from the offline feature cache")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--attention", choices=["auto", "flex", "dense"], default="auto",
                        help="the prefix-shared layout's attention (auto: flex on CUDA, dense on CPU)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0,
    )
    target = LlamaForCausalLM(config).to(args.device).eval()
    draft = DartDraftModel.from_target(
        target, feature_norm=True, draft_vocab_size=args.draft_vocab, draft_to_target_ids=torch.arange(args.draft_vocab)
    ).train()
    examples = [
        {"prompt_ids": torch.randint(0, 49152, (64,)).tolist(), "response_ids": torch.randint(0, 49152, (192,)).tolist()}
        for _ in range(args.batch_size * args.steps)
    ]
    dataset, cache_seconds = examples, None
    if args.feature_cache:
        start = time.perf_counter()
        cache = build_feature_cache(
            target, examples, list(draft.config.feature_layers), tempfile.mkdtemp(), progress=False
        )
        cache_seconds = time.perf_counter() - start
        dataset = CachedFeatureDataset(examples, cache)
    timer = StepTimer(args.device)
    trainer = DartTrainer(
        model=draft,
        args=TrainingArguments(
            output_dir="/tmp/dart-bench-training", per_device_train_batch_size=args.batch_size, max_steps=args.steps,
            report_to=[], remove_unused_columns=False, use_cpu=args.device == "cpu", save_strategy="no",
            disable_tqdm=True,
            logging_steps=args.steps,
        ),
        train_dataset=dataset, data_collator=DartDataCollator(), callbacks=[timer], target=target,
        anchors_per_sequence=args.anchors, training_attention=args.attention,
    )
    trainer.train()
    steady = sorted(timer.times[2:])  # the first steps include one-time setup
    median = steady[len(steady) // 2]
    tokens = args.batch_size * 256
    results = {
        "device": str(trainer.args.device),
        "attention": trainer.training_attention,
        "torch_threads": torch.get_num_threads(),
        "feature_cache": args.feature_cache,
        "cache_build_tokens_per_second": len(examples) * 256 / cache_seconds if cache_seconds else None,
        "batch_size": args.batch_size,
        "sequence_tokens": 256,
        "response_tokens": 192,
        "anchors_per_batch": args.anchors,
        "draft_vocab": args.draft_vocab,
        "step_seconds_median": median,
        "tokens_per_second": tokens / median,
        "response_tokens_per_second": args.batch_size * 192 / median,
        "sequences_per_second": args.batch_size / median,
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
