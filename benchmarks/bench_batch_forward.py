"""What a target forward costs over a batch: B rows of n new tokens each over a cached context, in one-token
forwards of one row. The groundwork of batched DART: a tree of n nodes per row pays where f(B, n + 1) / f(B, 1)
stays near 1 (the weights are read once for every row and node), and the budget must shrink as B grows where it
does not.

Every (B, n) runs interleaved with the others, round-robin, the fastest of `--repeats` kept (other work on the
machine only adds time). The new tokens attend causally (a chain; a tree's mask costs the same).

    python benchmarks/bench_batch_forward.py --dtype bfloat16 --out benchmarks/results/batch_forward_bf16.json
"""

import argparse
import time
from pathlib import Path

import torch
from _common import report
from transformers import DynamicCache

from dart_hf.hardware import device_description
from dart_hf.zoo import load_target


def forward_seconds(target, cache: DynamicCache, new_tokens: int) -> float:
    """One forward over `[B, new_tokens]` after the `[B, C]` context `cache` holds, in seconds; the cache is cut
    back to the context after it."""
    batch = cache.layers[0].keys.shape[0]
    ids = torch.randint(0, target.config.vocab_size, (batch, new_tokens))
    start = time.perf_counter()
    target(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=new_tokens)
    seconds = time.perf_counter() - start
    cache.crop(-new_tokens)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target, _ = load_target(args.target, dtype=getattr(torch, args.dtype))
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, target.config.vocab_size, (max(args.batches), args.context), generator=generator)
    sizes = [(batch, nodes) for batch in args.batches for nodes in args.nodes]
    times = {size: [] for size in sizes}
    with torch.no_grad():
        caches = {}
        for batch in args.batches:  # the context, computed once per batch size
            caches[batch] = DynamicCache(config=target.config)
            target(input_ids=context[:batch], cache=caches[batch], use_cache=True)
        for repeat in range(args.repeats + 1):
            for size in sizes if repeat % 2 == 0 else sizes[::-1]:
                seconds = forward_seconds(target, caches[size[0]], size[1])
                if repeat:  # the first round warms up
                    times[size].append(seconds)
    one = min(times[1, 1])
    table = {f"B={batch}": {f"n={nodes}": min(times[batch, nodes]) / one for nodes in args.nodes}
             for batch in args.batches}
    for row, columns in table.items():
        print(row, "  ".join(f"{name} {value:.2f}" for name, value in columns.items()), flush=True)
    report({"target": args.target, "dtype": args.dtype, "context": args.context, "one_token_seconds": one,
            "device": device_description(target.device), "in_one_token_forwards": table}, args.out)


if __name__ == "__main__":
    main()
