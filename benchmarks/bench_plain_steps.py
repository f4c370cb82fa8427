"""What DART costs when it decodes plainly: vanilla `generate` against DART with every step forced to a plain
step (no tree ever), on the same prompts, interleaved in pairs with the order alternating. The ratio is what
the adaptive budget's fallback can at best reach on a set where drafting never pays. With `--sample` (T=1) both
methods of a pair draw from the same seed, so plain steps sample the very same tokens as vanilla: the outputs
are checked to be identical in both modes.

    python benchmarks/bench_plain_steps.py --set mbpp --prompts 10 --repeats 2
    python benchmarks/bench_plain_steps.py --set mt-bench --set alpaca-eval --prompts 12 --sample
"""

import argparse
import statistics
import time

import torch

from dart_hf import budget
from dart_hf.bench import chat_inputs
from dart_hf.prompts import load_prompts
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=None, help="benchmark prompt set(s); default mbpp")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per set")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the prompts")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sample", action="store_true", help="T=1 sampling instead of greedy")
    args = parser.parse_args()

    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    draft = load_draft("smollm2-135m-instruct-dart", target)
    budget.AdaptiveBudget.next_budget = lambda self: 0  # every step plain (and no context lookup, below)

    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.sample, pad_token_id=tokenizer.pad_token_id)
    warm_up = chat_inputs(tokenizer, "Hello there")
    no_lookup = {"lookup_length": 0}
    # first-call setup and calibration, untimed
    target.generate(**warm_up, assistant_model=draft, tree_options=no_lookup, **kwargs)
    prompts = [p for name in (args.set or ["mbpp"]) for p in load_prompts(name, args.prompts)]
    seconds = {"vanilla": [], "dart": []}
    for index, prompt in enumerate(prompts * args.repeats):
        inputs = chat_inputs(tokenizer, prompt)
        outputs = {}
        for method in ("vanilla", "dart") if index % 2 == 0 else ("dart", "vanilla"):
            extra = {"assistant_model": draft, "tree_options": no_lookup} if method == "dart" else {}
            torch.manual_seed(index)  # sampling: the same random stream for both methods of a pair
            start = time.perf_counter()
            outputs[method] = target.generate(**inputs, **kwargs, **extra)
            seconds[method].append(time.perf_counter() - start)
        assert torch.equal(outputs["dart"], outputs["vanilla"])
    ratios = [d / v for v, d in zip(seconds["vanilla"], seconds["dart"])]
    total = sum(seconds["dart"]) / sum(seconds["vanilla"])
    print(f"all-plain DART / vanilla time: total {total:.3f}, "
          f"median per prompt {statistics.median(ratios):.3f} ({len(ratios)} pairs)")


if __name__ == "__main__":
    main()
