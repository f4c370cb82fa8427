"""Recipe for the SmolLM2-135M-Instruct draft: data (resumable), then training. Every step can be rerun: the
self-distilled file is appended to, and training can warm-start from the previous draft (--init-draft).

    python examples/train_smollm2_draft.py --distill-minutes 30 --max-steps 1500 --output model_cards/... 
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from dart_hf.prompts import read_set_file

DATA = Path("data/smollm2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill-minutes", type=float, default=0, help="self-distil for this long first (resumable)")
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--eval-steps", type=int, default=250, help="evaluate and checkpoint this often")
    parser.add_argument("--init-draft", default=None, help="warm-start from this draft")
    parser.add_argument("--output", default="drafts/smollm2-135m-instruct-dart")
    parser.add_argument("--ngram-only", action="store_true", help="only (re)build the N-gram table in --output")
    args = parser.parse_args()
    if args.ngram_only:
        return build_ngram_table(Path(args.output))
    DATA.mkdir(parents=True, exist_ok=True)
    if args.distill_minutes > 0:
        command = [sys.executable, "-m", "dart_hf.cli", "self-distill", "--target", "smollm2-135m-instruct",
                   "--prompt-set", "alpaca-demo", "--prompt-set", "chitchat", "--output", str(DATA / "selfdistill.jsonl"),
                   "--max-new-tokens", "128", "--batch-size", "24"]
        process = subprocess.Popen(command)
        try:
            process.wait(timeout=args.distill_minutes * 60)
        except subprocess.TimeoutExpired:
            process.terminate()  # safe: every finished batch is already on disk
            process.wait()
    # the Alpaca demo replies, used as they are (teacher-labelled): Apache-2.0, inside the llamafactory sdist
    replies = DATA / "alpaca_demo_replies.json"
    replies.write_bytes(read_set_file("alpaca-demo"))
    lines = (DATA / "selfdistill.jsonl").read_text().strip().split("\n")
    held_out = [line for index, line in enumerate(lines) if index % 20 == 0]  # spread over prompt lengths
    train = [line for index, line in enumerate(lines) if index % 20 != 0]
    (DATA / "heldout.jsonl").write_text("\n".join(held_out) + "\n")
    (DATA / "train.jsonl").write_text("\n".join(train) + "\n")
    config = {
        "target": "smollm2-135m-instruct", "train_files": [str(DATA / "train.jsonl")],
        "existing_files": [str(replies)], "existing_ratio": 1.0, "eval_files": [str(DATA / "heldout.jsonl")],
        "output_dir": args.output, "max_steps": args.max_steps, "per_device_train_batch_size": 8,
        "learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_steps": 50, "max_grad_norm": 0.5,
        "draft_vocab_size": 16384, "anchors_per_sequence": 24, "max_length": 320, "feature_dropout": 0.1,
        "eval_strategy": "steps", "eval_steps": args.eval_steps, "save_steps": args.eval_steps, "save_total_limit": 2,
        "logging_steps": 25, "report_to": "none", "use_cpu": True,
        "early_stopping_patience": 3, "dataloader_num_workers": 0, "seed": 0,
    }
    if args.init_draft:
        config["init_draft"] = args.init_draft
    (DATA / "train_config.json").write_text(json.dumps(config, indent=2))
    start = time.time()
    subprocess.run([sys.executable, "-m", "dart_hf.cli", "train", str(DATA / "train_config.json")], check=True)
    print(f"trained in {(time.time() - start) / 60:.1f} min -> {args.output}")
    build_ngram_table(Path(args.output))


def build_ngram_table(output: Path) -> None:
    """The draft's N-gram table: the target's own replies (training split of the self-distilled file) plus the
    Alpaca demo replies (Apache-2.0), prompts included; saved as `ngram.safetensors` beside the draft."""
    from dart_hf import NgramTable
    from dart_hf.training import conversation_examples, load_conversations, load_examples
    from dart_hf.zoo import load_target

    _, tokenizer = load_target("smollm2-135m-instruct")
    examples = load_examples([DATA / "train.jsonl"])
    examples += conversation_examples(tokenizer, load_conversations(DATA / "alpaca_demo_replies.json"))
    table = NgramTable.from_sequences(
        (e["prompt_ids"] + e["response_ids"] for e in examples), vocab_size=len(tokenizer), order=3
    )
    table.metadata["source"] = "self-distilled train split + Alpaca demo replies"
    table.save(output / "ngram.safetensors")
    print(f"N-gram table: {table.describe()} -> {output / 'ngram.safetensors'}")


if __name__ == "__main__":
    main()
