"""The verify forward of SmolLM2-135M on this machine, in isolation: what `dart_hf.attention` and padding change.

1. Attention: a forward over 1 and 5 nodes at several context lengths, through Transformers' sdpa (which copies the
   cached keys and values per query head of their group) and through `dart_hf.attention.grouped_query_sdpa`.
2. Padding: a forward over n nodes run with m >= n rows (`forward_tree(..., rows=m)`), for the sizes where this
   CPU's float32 matmuls are slow.

Every case runs interleaved with the others, the order reversed every other round; medians, as multiples of a
one-token forward at the same context.

    python benchmarks/bench_tree_forward.py --out benchmarks/results/bench_tree_forward.json
"""

import argparse
import contextlib
import time
from pathlib import Path

import torch
from _common import report
from transformers import DynamicCache

from dart_hf import verify
from dart_hf.tree import Tree
from dart_hf.zoo import load_target

FEATURE_LAYERS = [2, 15, 27]
PADDING_CASES = [
    (1, 1), (2, 2), (2, 5), (3, 3), (3, 4), (3, 5), (4, 4), (4, 5), (5, 5), (7, 7), (7, 8), (9, 9), (9, 13), (13, 13)
]


def chain(nodes: int, vocab_size: int) -> Tree:
    return Tree.chain(torch.randint(0, vocab_size, (nodes,)))


def median_seconds(target, cache, cases: dict, rounds: int) -> dict:
    """cases: name -> (tree, rows, attention context manager factory). Median seconds per case."""
    times = {name: [] for name in cases}
    for round_index in range(rounds):
        for name in list(cases) if round_index % 2 == 0 else list(cases)[::-1]:
            tree, rows, attention = cases[name]
            verify.grouped_query_sdpa = attention
            start = time.perf_counter()
            verify.forward_tree(target, tree, cache, FEATURE_LAYERS, rows)
            times[name].append(time.perf_counter() - start)
            cache.crop(-max(rows or 0, len(tree)))
    return {name: sorted(seconds)[len(seconds) // 2] for name, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[200, 600, 1000])
    parser.add_argument("--padding-context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    target, _ = load_target("smollm2-135m-instruct")
    vocab_size = target.config.vocab_size
    routed, copying = verify.grouped_query_sdpa, (lambda model: contextlib.nullcontext())

    def prefilled(length: int) -> DynamicCache:
        cache = DynamicCache(config=target.config)
        with torch.no_grad():
            target(input_ids=torch.randint(0, vocab_size, (1, length)), cache=cache, use_cache=True)
        return cache

    results = {"attention": {}, "padding": {}}
    for context in args.contexts:
        cases = {
            f"{nodes} nodes, {name}": (chain(nodes, vocab_size), None, attention)
            for nodes in (1, 5) for name, attention in (("transformers sdpa", copying), ("grouped-query sdpa", routed))
        }
        seconds = median_seconds(target, prefilled(context), cases, args.rounds)
        one_token = seconds["1 nodes, transformers sdpa"]
        results["attention"][context] = {name: value / one_token for name, value in seconds.items()}
        results["attention"][context]["one token, ms"] = one_token * 1000
        print(context, {name: round(value, 3) for name, value in results["attention"][context].items()}, flush=True)

    cases = {f"{nodes} nodes in {rows} rows": (chain(nodes, vocab_size), rows, routed) for nodes, rows in PADDING_CASES}
    seconds = median_seconds(target, prefilled(args.padding_context), cases, args.rounds)
    one_token = seconds["1 nodes in 1 rows"]
    results["padding"] = {name: value / one_token for name, value in seconds.items()}
    results["padding"]["one token, ms"] = one_token * 1000
    verify.grouped_query_sdpa = routed
    report(results, args.out)


if __name__ == "__main__":
    main()
