"""An interleaved A/B of decoding option sets: the shipped SmolLM2 draft under each set of `tree_options`, side by
side with vanilla `generate`.

Each arm is a `name=JSON` pair (the `tree_options` its calls pass, `{}` for the defaults) and runs its own copy of
the draft, so each keeps its own controller state (calibrations and evidence). All arms and vanilla run
interleaved prompt by prompt over the benchmark sets (`dart_hf.bench.run_benchmark` with arms: the order
reversed on every other prompt, after an untimed warm-up); every greedy output is checked against vanilla's.
Prints the benchmark's table: per set and overall, each arm's speedup over vanilla with its 95% bootstrap
interval, tau, the share of plain steps and the draft's agreement.

    python benchmarks/ab_options.py --prompts-per-set 10 defaults='{}' no_lookup='{"lookup_length": 0}'
    python benchmarks/ab_options.py --dtype bfloat16 --max-new-tokens 128 --prompts-per-set 5 adaptive='{}' \
        fixed_32='{"budget": 32, "adaptive": false}'
"""

import argparse
import json
from pathlib import Path

import torch
from _common import report

from dart_hf.bench import BENCHMARK_SETS, markdown_table, run_benchmark
from dart_hf.zoo import load_draft, load_target


def parse_arm(text: str) -> tuple[str, dict]:
    name, separator, options = text.partition("=")
    if not separator or not name:
        example = "no_lookup='{\"lookup_length\": 0}'"
        raise argparse.ArgumentTypeError(f"An arm is name=JSON, e.g. {example}; got {text!r}.")
    return name, json.loads(options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", type=parse_arm, help="name=JSON tree options, one per arm")
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart", help="shipped draft name or folder")
    parser.add_argument("--prompts-per-set", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sets", nargs="+", default=None, help="benchmark sets (default: all)")
    parser.add_argument("--sample", action="store_true", help="T=1 sampling instead of greedy decoding")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the target's dtype (bfloat16: outputs are counted as identical or not, not asserted)")
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = parser.parse_args()
    target, tokenizer = load_target("smollm2-135m-instruct", dtype=getattr(torch, args.dtype))
    arms = {name: (load_draft(args.draft, target), options) for name, options in args.arms}
    sets = [name for name in BENCHMARK_SETS if args.sets is None or name in args.sets]
    results = run_benchmark(target, tokenizer, None, sets, args.prompts_per_set, args.max_new_tokens,
                            do_sample=args.sample, methods=["vanilla"], arms=arms)
    print(markdown_table(results))
    report(results, args.out)


if __name__ == "__main__":
    main()
