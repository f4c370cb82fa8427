"""The verify forward of SmolLM2-135M (or another zoo target, `--target`) on this machine, in isolation: what `dart_hf.attention`, padding and
`dart_hf.weight_major` change.

1. Attention: a forward over 1 and 5 nodes at several context lengths, through Transformers' sdpa (which copies the
   cached keys and values per query head of their group) and through `dart_hf.attention.grouped_query_sdpa`.
2. Padding: a forward over n nodes run with m >= n rows (`forward_tree(..., rows=m)`), for the sizes where this
   CPU's float32 matmuls are slow.
3. Layouts: a forward over n nodes with the linear layers' usual products and weight first
   (`forward_tree(..., weight_major=True)`).
4. Dtypes: a forward over n nodes with the target in float32 and in bfloat16 (what a tree costs where the hardware
   multiplies bfloat16 natively), each as a multiple of a one-token forward in its own dtype.

Every case runs interleaved with the others, the order reversed every other round; medians, as multiples of a
one-token forward at the same context.

    python benchmarks/bench_tree_forward.py --out benchmarks/results/bench_tree_forward.json
    python benchmarks/bench_tree_forward.py --parts layouts --out benchmarks/results/bench_weight_major.json
    python benchmarks/bench_tree_forward.py --parts dtypes --out benchmarks/results/bench_dtypes.json
    python benchmarks/bench_tree_forward.py --target qwen2.5-coder-1.5b-instruct --parts layouts --rounds 6 \
        --out benchmarks/results/bench_weight_major_qwen_coder_1.5b.json
"""

import argparse
import contextlib
import time
from pathlib import Path

import torch
from _common import report
from transformers import DynamicCache

from dart_hf import verify
from dart_hf.hardware import device_description
from dart_hf.modeling_dart import default_feature_layers
from dart_hf.tree import Tree
from dart_hf.zoo import load_target

PADDING_CASES = [
    (1, 1), (2, 2), (2, 5), (3, 3), (3, 4), (3, 5), (4, 4), (4, 5), (5, 5), (7, 7), (7, 8), (9, 9), (9, 13), (13, 13)
]
LAYOUT_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 25]
DTYPE_SIZES = [1, 4, 8, 16, 32, 64]


def chain(nodes: int, vocab_size: int) -> Tree:
    return Tree.chain(torch.randint(0, vocab_size, (nodes,)))


def median_seconds(cases: dict, rounds: int, feature_layers: list[int]) -> dict:
    """cases: name -> (target, its prefilled cache, tree, rows, attention context manager factory, weight_major).
    Median seconds per case."""
    times = {name: [] for name in cases}
    for round_index in range(rounds):
        for name in list(cases) if round_index % 2 == 0 else list(cases)[::-1]:
            target, cache, tree, rows, attention, weight_major = cases[name]
            verify.grouped_query_sdpa = attention
            start = time.perf_counter()
            verify.forward_tree(target, tree, cache, feature_layers, rows, weight_major)
            times[name].append(time.perf_counter() - start)
            cache.crop(-max(rows or 0, len(tree)))
    return {name: sorted(seconds)[len(seconds) // 2] for name, seconds in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct", help="a zoo name or a model folder")
    parser.add_argument("--contexts", type=int, nargs="+", default=[200, 600, 1000])
    parser.add_argument("--padding-context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--parts", nargs="+", default=["attention", "padding", "layouts"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    target, _ = load_target(args.target, dtype=torch.float32)
    vocab_size = target.config.get_text_config().vocab_size
    feature_layers = default_feature_layers(target.config.get_text_config().num_hidden_layers)
    routed, copying = verify.grouped_query_sdpa, (lambda model: contextlib.nullcontext())

    def prefilled(length: int, model=target) -> DynamicCache:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=torch.randint(0, vocab_size, (1, length)), cache=cache, use_cache=True)
        return cache

    results = {part: {} for part in args.parts}
    for context in args.contexts if "attention" in args.parts else []:
        cache = prefilled(context)
        cases = {
            f"{nodes} nodes, {name}": (target, cache, chain(nodes, vocab_size), None, attention, False)
            for nodes in (1, 5) for name, attention in (("transformers sdpa", copying), ("grouped-query sdpa", routed))
        }
        seconds = median_seconds(cases, args.rounds, feature_layers)
        one_token = seconds["1 nodes, transformers sdpa"]
        results["attention"][context] = {name: value / one_token for name, value in seconds.items()}
        results["attention"][context]["one token, ms"] = one_token * 1000
        print(context, {name: round(value, 3) for name, value in results["attention"][context].items()}, flush=True)

    if "padding" in args.parts:
        cache = prefilled(args.padding_context)
        cases = {
            f"{nodes} nodes in {rows} rows": (target, cache, chain(nodes, vocab_size), rows, routed, False)
            for nodes, rows in PADDING_CASES
        }
        seconds = median_seconds(cases, args.rounds, feature_layers)
        one_token = seconds["1 nodes in 1 rows"]
        results["padding"] = {name: value / one_token for name, value in seconds.items()}
        results["padding"]["one token, ms"] = one_token * 1000

    if "layouts" in args.parts:
        cache = prefilled(args.padding_context)
        cases = {
            f"{nodes} nodes, {name}": (target, cache, chain(nodes, vocab_size), None, routed, weight_major)
            for nodes in LAYOUT_SIZES for name, weight_major in (("usual", False), ("weight-major", True))
        }
        seconds = median_seconds(cases, args.rounds, feature_layers)
        one_token = seconds["1 nodes, usual"]
        results["layouts"] = {name: value / one_token for name, value in seconds.items()}
        results["layouts"]["one token, ms"] = one_token * 1000

    if "dtypes" in args.parts:
        models = {"float32": target, "bfloat16": load_target(args.target, dtype=torch.bfloat16)[0]}
        caches = {name: prefilled(args.padding_context, model) for name, model in models.items()}
        cases = {
            f"{nodes} nodes, {name}": (model, caches[name], chain(nodes, vocab_size), None, routed, False)
            for nodes in DTYPE_SIZES for name, model in models.items()
        }
        seconds = median_seconds(cases, args.rounds, feature_layers)
        results["dtypes"] = {}
        for name in models:
            one_token = seconds[f"1 nodes, {name}"]
            results["dtypes"][name] = {nodes: seconds[f"{nodes} nodes, {name}"] / one_token for nodes in DTYPE_SIZES}
            results["dtypes"][name]["one token, ms"] = one_token * 1000
        results["dtypes"]["machine"] = device_description("cpu")
    verify.grouped_query_sdpa = routed
    results["target"], results["machine"] = args.target, device_description("cpu")
    report(results, args.out)


if __name__ == "__main__":
    main()
