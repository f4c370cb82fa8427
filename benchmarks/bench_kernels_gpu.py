"""GPU timing of the tree step (issue: Triton kernels), for a machine with CUDA and triton.

On a Qwen3-8B-shaped random-weight target in bfloat16 (36 layers, hidden 4096, 32 / 8 heads, head_dim 128): one
verify step of a 60-node tree after a 1k-4k prefix (beside a one-token forward and a deep copy of the cache), with
sdpa + a dense float mask against
attn_implementation="dart_tree" (Triton tree attention from packed bits); the mask build (torch vs Triton); the KV
compaction (torch vs Triton); the draft forward; the tree search. Medians of CUDA-synchronised timings.
`--tiny` runs the same code on a small CPU model (to check the script, not to time it).

    python benchmarks/bench_kernels_gpu.py [--tiny] [--out benchmarks/results/kernels_gpu.json]
"""

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

if "--tiny" in sys.argv:  # Triton's interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from _common import report  # noqa: E402
from dart_hf import BeamSearchTreePolicy, DartDraftModel  # noqa: E402
from dart_hf.kernels.kv_compact import compact_kv_torch, compact_kv_triton  # noqa: E402
from dart_hf.kernels.tree_mask import tree_mask_torch, tree_mask_triton  # noqa: E402
from dart_hf.verify import forward_tree  # noqa: E402


def timed(function, repeats: int, device: torch.device) -> float:
    for _ in range(3):
        function()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--prefixes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936)
    if args.tiny:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=1000)
        args.prefixes, args.repeats = [64], 2
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dtype": str(dtype)}
    config = Qwen3Config(max_position_embeddings=8192, **shape)
    with device:  # random weights made where they are used: an 8B model's initialisation on the CPU takes minutes
        models = {
            name: Qwen3ForCausalLM._from_config(config, attn_implementation=name, dtype=dtype).eval()
            for name in ("sdpa", "dart_tree")
        }
    models["dart_tree"].load_state_dict(models["sdpa"].state_dict())
    draft = DartDraftModel.from_target(models["sdpa"])
    policy = BeamSearchTreePolicy()
    logits = torch.randn(8, config.vocab_size, device=device)
    tree = policy(logits, torch.tensor([1, 2, 3]), lambda ids: ids)
    for prefix in args.prefixes:
        row = {}
        ids = torch.randint(0, config.vocab_size, (1, prefix), device=device)
        cache = DynamicCache(config=config)
        with torch.no_grad():
            models["sdpa"](input_ids=ids, cache=cache, use_cache=True)
        def one_token():
            with torch.no_grad():
                models["sdpa"](input_ids=ids[:, -1:], cache=cache, use_cache=True)
            cache.crop(prefix - cache.get_seq_length())  # back to the prefix (5.25 takes a negative count)

        row["one_token_forward_ms"] = timed(one_token, args.repeats, device)
        row["cache_deepcopy_ms"] = timed(lambda: copy.deepcopy(cache), args.repeats, device)
        for name, model in models.items():
            def verify(model=model):
                forward_tree(model, tree, cache, draft.config.feature_layers)
                cache.crop(prefix - cache.get_seq_length())  # every call verifies after the same prefix
            os.environ["DART_HF_KERNELS"] = "triton" if name == "dart_tree" else "torch"
            row[f"verify_{name}_ms"] = timed(verify, args.repeats, device)
        parents = tree.parents.to(device)
        row["mask_torch_ms"] = timed(lambda: tree_mask_torch(parents, prefix, dtype), args.repeats, device)
        row["mask_triton_ms"] = timed(lambda: tree_mask_triton(parents, prefix, dtype), args.repeats, device)
        tensors = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]
        path = torch.tensor([0, 1, 3, 7], device=device)
        row["kv_compact_torch_ms"] = timed(lambda: compact_kv_torch(tensors, prefix - 61, path), args.repeats, device)
        row["kv_compact_triton_ms"] = timed(lambda: compact_kv_triton(tensors, prefix - 61, path), args.repeats, device)
        features = torch.randn(1, 4, 3 * config.hidden_size, device=device, dtype=dtype)
        draft_ids = torch.randint(0, config.vocab_size, (1, 4), device=device)
        row["draft_forward_ms"] = timed(lambda: draft(features, input_ids=draft_ids), args.repeats, device)
        row["tree_search_ms"] = timed(lambda: policy(logits, torch.tensor([1, 2, 3]), lambda x: x), args.repeats, device)
        results[f"prefix_{prefix}"] = row
    report(results, args.out)


if __name__ == "__main__":
    main()
