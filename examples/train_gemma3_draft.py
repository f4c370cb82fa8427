"""Recipe for a first Gemma 3 270M draft (a base model: text continuation), bounded in CPU time: data
(resumable), training, N-gram table. Every step can be rerun: the self-distilled file is appended to.

    python examples/train_gemma3_draft.py --prompts 1400 --distill-minutes 45 --max-steps 240 --eval-steps 120 \
        --output drafts/gemma3-270m
    python benchmarks/bench_sliding_window.py --draft drafts/gemma3-270m/checkpoint-240   # against vanilla
    python examples/train_gemma3_draft.py --alphas drafts/gemma3-270m/checkpoint-240   # held-out alpha_1..8

Prompts are the first PROMPT_TOKENS tokens (`<bos>` included) of texts of the kinds the Gemma benchmark continues
(`benchmarks/bench_sliding_window.py`: news, code, maths, open-ended questions), taken from the training prompt
sets only, mixed in KIND_MIX's proportions in a seeded order; the target continues each greedily for NEW_TOKENS
tokens in bfloat16 (2.1x the tokens per second of float32 on an AVX512-BF16 CPU; the float32 target still labels
every token with its own distributions during training).
"""

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from dart_hf.files import extend_lines
from dart_hf.prompts import load_prompts, training_prompts

DATA = Path("data/gemma3")
TARGET = "gemma3-270m"
PROMPT_TOKENS = 96  # as the benchmark cuts its prompts
NEW_TOKENS = 256
MAX_LENGTH = PROMPT_TOKENS + NEW_TOKENS
# per 20 prompts: the benchmark's five sets are news (CNN/DailyMail), code (HumanEval), maths (GSM8K) and two of
# open-ended questions (MT-Bench, AlpacaEval)
KIND_MIX = {"news": 4, "code": 4, "math": 4, "open-ended": 8}


MIN_CHARS = 60  # shorter texts (a lone word or character, as some OpenAI evals prompts are) teach nothing


def prompt_pools() -> dict[str, list[str]]:
    """Each kind's texts of MIN_CHARS or more, from training sets only (none is a benchmark prompt), each in a
    `random.Random(0)` shuffle."""
    pools = {
        "news": load_prompts("xsum"),
        "code": load_prompts("python-stdlib"),
        "math": training_prompts(["math-train"]),
        "open-ended": training_prompts(["arena-hard", "ifeval", "alpaca-demo", "openai-evals"]),
    }
    rng = random.Random(0)
    for kind, pool in pools.items():
        pools[kind] = [text for text in pool if len(text) >= MIN_CHARS]
        rng.shuffle(pools[kind])
    return pools


def prompt_file(count: int) -> Path:
    """`data/gemma3/prompts.jsonl` (the self-distilled file's ids index it): the first `count` prompts of the
    kinds interleaved in KIND_MIX's proportions. A larger count appends; lines already written never move."""
    path = DATA / "prompts.jsonl"
    pools = prompt_pools()
    taken, lines = dict.fromkeys(pools, 0), []
    while len(lines) < count:
        for kind, share in KIND_MIX.items():
            for text in pools[kind][taken[kind] : taken[kind] + share]:
                lines.append(json.dumps({"kind": kind, "messages": [{"role": "user", "content": text}]}))
            taken[kind] += share
    lines = lines[:count]
    extend_lines(path, lines)
    return path


def self_distill(prompts: Path, output: Path, minutes: float) -> None:
    """`dart-hf self-distill` of `prompts` into `output` for at most `minutes`; stopping it is safe: every
    finished batch is already on disk, and a rerun resumes."""
    command = [sys.executable, "-m", "dart_hf.cli", "self-distill", "--target", TARGET, str(prompts),
               "--output", str(output), "--prompt-tokens", str(PROMPT_TOKENS), "--max-new-tokens", str(NEW_TOKENS),
               "--batch-size", "16", "--dtype", "bfloat16"]
    process = subprocess.Popen(command)
    try:
        process.wait(timeout=minutes * 60)
    except subprocess.TimeoutExpired:
        process.terminate()
        process.wait()


def split_held_out(path: Path) -> None:
    """Every 20th self-distilled line to `heldout.jsonl`, the others to `train.jsonl`."""
    lines = path.read_text().strip().split("\n")
    (DATA / "heldout.jsonl").write_text("\n".join(line for i, line in enumerate(lines) if i % 20 == 0) + "\n")
    (DATA / "train.jsonl").write_text("\n".join(line for i, line in enumerate(lines) if i % 20) + "\n")


def train(output: str, max_steps: int, eval_steps: int, draft_vocab_size: int) -> None:
    config = {
        "target": TARGET, "train_files": [str(DATA / "train.jsonl")], "eval_files": [str(DATA / "heldout.jsonl")],
        "output_dir": output, "max_steps": max_steps, "per_device_train_batch_size": 8,
        "learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_steps": 20, "max_grad_norm": 0.5,
        "draft_vocab_size": draft_vocab_size, "anchors_per_sequence": 24, "max_length": MAX_LENGTH,
        "feature_dropout": 0.1, "train_sampling_strategy": "group_by_length",
        "eval_strategy": "steps", "eval_steps": eval_steps, "save_steps": eval_steps, "save_total_limit": 3,
        # one held-out example at a time: every reply token is an anchor there, and the teacher's 262,144-token
        # logits over all those rows take gigabytes per example
        "per_device_eval_batch_size": 1,
        "logging_steps": 10, "report_to": "none", "use_cpu": True, "target_dtype": "bfloat16",
        "early_stopping_patience": 3, "dataloader_num_workers": 0, "seed": 1,
    }
    (DATA / "train_config.json").write_text(json.dumps(config, indent=2))
    start = time.time()
    subprocess.run([sys.executable, "-m", "dart_hf.cli", "train", str(DATA / "train_config.json")], check=True)
    print(f"trained in {(time.time() - start) / 60:.1f} min -> {output}")


def build_ngram_table(folder: Path) -> None:
    """The draft's trigram table from the training split (prompts and replies), saved beside the draft."""
    from dart_hf import NgramTable
    from dart_hf.training import load_examples

    examples = load_examples([DATA / "train.jsonl"])
    table = NgramTable.from_sequences((e["prompt_ids"] + e["response_ids"] for e in examples),
                                      vocab_size=262144, order=3)
    table.metadata["source"] = "Gemma 3 270M's greedy continuations (training split), prompts included"
    table.save(folder / "ngram.safetensors")
    print(f"N-gram table: {table.describe()} -> {folder / 'ngram.safetensors'}")


def held_out_alphas(draft_folder: str) -> dict:
    """alpha_1..8 and chain tau of `draft_folder` on the held-out continuations, the float32 target as teacher."""
    from dart_hf.training import DartDataCollator, evaluate_draft, load_examples
    from dart_hf.zoo import load_draft, load_target

    target, _ = load_target(TARGET, dtype=torch.float32)
    draft = load_draft(draft_folder, target)
    examples = load_examples([DATA / "heldout.jsonl"])
    return evaluate_draft(draft, target, examples, DartDataCollator(max_length=MAX_LENGTH))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1400, help="how many prompts the data may use")
    parser.add_argument("--distill-minutes", type=float, default=0, help="self-distil for this long first (resumable)")
    parser.add_argument("--max-steps", type=int, default=0, help="train for this many steps (0: no training)")
    parser.add_argument("--eval-steps", type=int, default=100, help="evaluate and checkpoint this often")
    parser.add_argument("--draft-vocab-size", type=int, default=16384)
    parser.add_argument("--output", default="drafts/gemma3-270m")
    parser.add_argument("--ngram", type=Path, default=None, help="only build the N-gram table into this folder")
    parser.add_argument("--alphas", default=None, help="only report this draft's held-out alpha_1..8")
    args = parser.parse_args()
    if args.ngram:
        return build_ngram_table(args.ngram)
    if args.alphas:
        return print(json.dumps(held_out_alphas(args.alphas), indent=2))
    DATA.mkdir(parents=True, exist_ok=True)
    if args.distill_minutes > 0:
        self_distill(prompt_file(args.prompts), DATA / "selfdistill.jsonl", args.distill_minutes)
    if args.max_steps > 0:
        split_held_out(DATA / "selfdistill.jsonl")
        train(args.output, args.max_steps, args.eval_steps, args.draft_vocab_size)
        build_ngram_table(Path(args.output))


if __name__ == "__main__":
    main()
