"""Peak memory of each method, each in a fresh process: what a user's process holds to decode with vanilla
`generate`, Transformers' assisted decoding (a smaller model of the family), its prompt lookup decoding, or DART.

A child process per method loads the target (and the method's assistant or draft) in the run's dtype, runs an
untimed 16-token warm-up, then greedy `generate` on the same prompts (one per benchmark set in turn, chat-formatted).
Reported per method: the resident set size once loaded, its peak during the prompts (sampled every 2 ms), the
process's peak over its whole life (`ru_maxrss`: loading included) and the anonymous part of that life's peak
(loading reads the checkpoint through mmap, and the mapped file's pages count as resident until it is closed: page
cache the kernel can drop, not memory the process holds), and the bytes the method holds besides the
target's weights (`dart_hf.bench.weights_beside_target`). Every method's outputs are compared with vanilla's
(identical, or in low precision the count that differ; the timed benchmark judges those as near-ties).

    python benchmarks/bench_memory.py --target qwen2.5-coder-1.5b-instruct --draft drafts/qwen-coder-1.5b-v2 \\
        --dtype bfloat16 --max-new-tokens 128 --prompts 4 --out benchmarks/results/memory_qwen_coder_1.5b_bf16.json
"""

import argparse
import multiprocessing
import resource
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from _common import PeakMemory, memory_sizes, report

from dart_hf.bench import (
    ASSISTANTS,
    BENCHMARK_SETS,
    PEER_METHODS,
    WARM_UP_PROMPT,
    chat_inputs,
    decoding_kwargs,
    weights_beside_target,
)
from dart_hf.files import write_atomically
from dart_hf.hardware import device_description
from dart_hf.prompts import load_prompts
from dart_hf.zoo import load_draft, load_target

METHODS = ["vanilla", *PEER_METHODS, "dart"]
MIB = 2**20


def prompt_texts(count: int) -> list[str]:
    """`count` prompts, the benchmark sets in turn (first prompt of each set, then the second, ...)."""
    per_set = -(-count // len(BENCHMARK_SETS))
    by_set = [load_prompts(name, per_set) for name in BENCHMARK_SETS]
    return [by_set[index % len(by_set)][index // len(by_set)] for index in range(count)]


def measure_method(method: str, args: argparse.Namespace) -> dict:
    """Runs in its own process: load what `method` needs, decode the prompts, report its memory and outputs."""
    dtype = getattr(torch, args.dtype)
    with PeakMemory() as loading:
        target, tokenizer = load_target(args.target, dtype=dtype)
        assistant = load_target(args.assistant, dtype=dtype, device=target.device)[0] if method == "assisted" else None
        draft = load_draft(args.draft, target) if method == "dart" else None
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    kwargs.update(decoding_kwargs(method, assistant, draft))
    target.generate(**chat_inputs(tokenizer, WARM_UP_PROMPT), **{**kwargs, "max_new_tokens": 16})
    loaded, _ = memory_sizes()
    outputs = []
    with PeakMemory() as peak:
        for text in prompt_texts(args.prompts):
            inputs = chat_inputs(tokenizer, text)
            outputs.append(target.generate(**inputs, **kwargs)[0, inputs["input_ids"].shape[1] :].tolist())
    target_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    return {
        "target_weights_mib": round(target_bytes / MIB, 1),
        "weights_beside_target_bytes": weights_beside_target(method, draft, assistant, None),
        "resident_loaded_mib": round(loaded / MIB, 1),
        "resident_peak_decoding_mib": round(peak.peak / MIB, 1),
        # ru_maxrss (KiB on Linux) is the kernel's high-water mark, updated lazily: never below a sampled size
        "process_peak_mib": round(max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, peak.peak) / MIB, 1),
        "anonymous_peak_mib": round(max(loading.anonymous_peak, peak.anonymous_peak) / MIB, 1),
        "outputs": outputs,
    }


def markdown_table(results: dict) -> str:
    lines = ["| method | beside the target (MiB) | resident loaded (MiB) | peak decoding (MiB) | process peak (MiB) "
             "| anonymous peak (MiB) | outputs as vanilla |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for method, row in results["methods"].items():
        lines.append(f"| {method} | {row['weights_beside_target_bytes'] / MIB:,.1f} | {row['resident_loaded_mib']:,} "
                     f"| {row['resident_peak_decoding_mib']:,} | {row['process_peak_mib']:,} "
                     f"| {row['anonymous_peak_mib']:,} | {row['identical_to_vanilla']} of {results['prompts']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default=None, help="the DART draft (a shipped name or folder); none: no DART row")
    parser.add_argument("--assistant", default=None, help="assisted decoding's model (default: the target's in "
                        f"{ASSISTANTS}); none for a target without one: no assisted row")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None, help="JSON report (a markdown table goes beside it)")
    args = parser.parse_args()
    args.assistant = args.assistant or ASSISTANTS.get(args.target.lower())
    methods = [m for m in METHODS if not (m == "assisted" and args.assistant is None or m == "dart" and not args.draft)]
    results = {"machine": {"device": device_description(torch.device("cpu")), "dtype": args.dtype,
                           "threads": torch.get_num_threads()},
               "target": args.target, "assistant": args.assistant, "draft": args.draft,
               "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "methods": {}}
    spawn = multiprocessing.get_context("spawn")  # a fresh process per method: no memory carried between them
    for method in methods:
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            results["methods"][method] = pool.submit(measure_method, method, args).result()
        print(method, {k: v for k, v in results["methods"][method].items() if k != "outputs"}, flush=True)
    vanilla = results["methods"]["vanilla"]["outputs"]
    for row in results["methods"].values():
        row["identical_to_vanilla"] = sum(a == b for a, b in zip(row["outputs"], vanilla))
    report(results, args.out)
    print(markdown_table(results))
    if args.out is not None:
        write_atomically(args.out.with_suffix(".md"), lambda tmp: Path(tmp).write_text(markdown_table(results) + "\n"))


if __name__ == "__main__":
    main()
