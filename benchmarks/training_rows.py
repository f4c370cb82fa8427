"""What computing logits only for the supervised rows saves in a training step: `draft_rows` with and without
`supervised_only`, on batches of the SmolLM2 recipe's self-distilled replies, each variant run twice per batch
in alternating order (forward, loss and backward; the frozen target in bfloat16 as in the recipe). Prints the
rows each computes, the loss (the same for both) and the time ratio.

    python benchmarks/training_rows.py [--batches 4] [--batch-size 8]
"""

import argparse
import random
import time

import torch

from dart_hf.training import DartDataCollator, load_examples
from dart_hf.training.trainer import draft_rows, draft_vocabulary, rows_loss
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4, help="batches spread over the range of lengths")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=24)
    args = parser.parse_args()

    target, tokenizer = load_target("smollm2-135m-instruct")
    draft = load_draft("smollm2-135m-instruct-dart", target).float().train()  # before the teacher leaves float32
    teacher = target.to(torch.bfloat16)
    examples = load_examples(["data/smollm2/selfdistill_benchlike.jsonl"])
    examples = sorted(random.Random(0).sample(examples, 8 * args.batch_size),
                      key=lambda e: len(e["prompt_ids"]) + len(e["response_ids"]))
    collator = DartDataCollator(pad_token_id=tokenizer.pad_token_id, max_length=1024)
    vocab_ids = draft_vocabulary(draft)
    seconds = {False: 0.0, True: 0.0}
    for index in torch.linspace(0, 7, args.batches).round().int().tolist():
        batch = collator(examples[index * args.batch_size : (index + 1) * args.batch_size])
        for supervised_only in (False, True, True, False):
            torch.manual_seed(0)  # the same anchors for both
            start = time.perf_counter()
            rows = draft_rows(draft, teacher, batch, args.anchors, supervised_only=supervised_only)
            loss = rows_loss(rows, 0.6, vocab_ids)
            loss.backward()
            seconds[supervised_only] += time.perf_counter() - start
            draft.zero_grad()
            print(f"{batch['input_ids'].shape[1]:4d} tokens, supervised_only={supervised_only!s:5}: "
                  f"{rows.draft_logits.shape[1]} rows, loss {loss.item():.5f}")
    print(f"time, supervised rows only / every row: {seconds[True] / seconds[False]:.3f}")


if __name__ == "__main__":
    main()
