"""Two or more DART drafts for SmolLM2-135M-Instruct side by side with vanilla `generate`: is a newly trained
checkpoint faster than the shipped one?

Each draft is an arm of `dart_hf.bench.run_benchmark` with its own controller state; all run interleaved prompt by
prompt over the benchmark sets (the order reversed on every other prompt) after an untimed warm-up, and every
output is checked against vanilla's.
A draft is the shipped name (`smollm2-135m-instruct-dart`) or a checkpoint folder.

    python benchmarks/ab_drafts.py --prompts-per-set 16 smollm2-135m-instruct-dart drafts/next/checkpoint-320
"""

import argparse
from pathlib import Path

import torch
from _common import report

from dart_hf.bench import BENCHMARK_SETS, markdown_table, run_benchmark
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafts", nargs="+", help="shipped draft names or checkpoint folders")
    parser.add_argument("--prompts-per-set", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args()
    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    # bfloat16 as shipped (a training checkpoint is float32): every draft runs as it would from the package
    drafts = {name: load_draft(name, target, dtype=torch.bfloat16) for name in args.drafts}
    arms = {name: (draft, {}) for name, draft in drafts.items()}
    results = run_benchmark(target, tokenizer, None, BENCHMARK_SETS, args.prompts_per_set, args.max_new_tokens,
                            methods=["vanilla"], arms=arms)
    print(markdown_table(results))
    report(results, args.out)


if __name__ == "__main__":
    main()
