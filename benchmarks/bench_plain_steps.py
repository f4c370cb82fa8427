"""What DART costs when it decodes plainly: vanilla `generate` against DART with every step forced to a plain
step (no tree ever), on the same prompts, interleaved in pairs with the order alternating. The ratio is what
the adaptive budget's fallback can at best reach on a set where drafting never pays.

    python benchmarks/bench_plain_steps.py --set mbpp --prompts 10 --repeats 2
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
    args = parser.parse_args()

    target, tokenizer = load_target("smollm2-135m-instruct")
    draft = load_draft("smollm2-135m-instruct-dart", target)
    budget.AdaptiveBudget.next_budget = lambda self: 0  # every step plain

    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    warm_up = chat_inputs(tokenizer, "Hello there")
    target.generate(**warm_up, assistant_model=draft, **kwargs)  # first-call setup and calibration, untimed
    prompts = [p for name in (args.set or ["mbpp"]) for p in load_prompts(name, args.prompts)]
    ratios, vanilla_total, dart_total = [], 0.0, 0.0
    for index, prompt in enumerate(prompts * args.repeats):
        inputs = chat_inputs(tokenizer, prompt)
        seconds, outputs = {}, {}
        for method in ("vanilla", "dart") if index % 2 == 0 else ("dart", "vanilla"):
            extra = {"assistant_model": draft} if method == "dart" else {}
            start = time.perf_counter()
            outputs[method] = target.generate(**inputs, **kwargs, **extra)
            seconds[method] = time.perf_counter() - start
        assert torch.equal(outputs["dart"], outputs["vanilla"])
        ratios.append(seconds["dart"] / seconds["vanilla"])
        vanilla_total += seconds["vanilla"]
        dart_total += seconds["dart"]
    print(f"all-plain DART / vanilla time: total {dart_total / vanilla_total:.3f}, "
          f"median per prompt {statistics.median(ratios):.3f} ({len(ratios)} pairs)")


if __name__ == "__main__":
    main()
