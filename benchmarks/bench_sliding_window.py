"""DART on a real sliding-window target far past its window: Gemma 3 270M (base, window 512) continuing text for
over twice the window, greedy, in float32, against vanilla `generate`.

Prompts are the first `--prompt-tokens` tokens of texts from the packaged prompt sets (a base model continues
text); every run generates exactly `--new-tokens` tokens (`min_new_tokens`), by default 960, so each sequence
passes 1,024 tokens.
Vanilla and DART alternate prompt by prompt (the order reversed every other prompt) after an untimed warm-up.
Reported: whether every output is token-identical to vanilla's, tau, the total-time speedup with its 95%
bootstrap interval, and the target's KV cache in bytes (vanilla's at the end; DART's at the end and its largest,
taken just before each compaction, when a tree's rows are still cached).

The draft is `--draft` (the shipped `gemma3-270m-dart`, a folder or a Hub repo), else an untrained one over the
target's first `--draft-vocab` token ids: its trees are then rarely accepted and the controller settles on plain
steps and context-lookup chains, so tau and speed measure the loop around the window, not a draft.

    python benchmarks/bench_sliding_window.py --out benchmarks/results/gemma3_270m_sliding_window.json
    python benchmarks/bench_sliding_window.py --draft gemma3-270m-dart --untrained-too --prompts 20 \
        --new-tokens 128 --out benchmarks/results/gemma3_270m_draft_128.json   # trained beside untrained
"""

import argparse
from pathlib import Path

import torch
from _common import report

import dart_hf.generation
import dart_hf.verify
from dart_hf import DartDraftModel
from dart_hf.bench import bootstrap_interval, speedup
from dart_hf.hardware import device_clock, device_description
from dart_hf.prompts import load_prompts
from dart_hf.zoo import load_draft, load_target

SETS = ["cnn-dailymail", "humaneval", "mt-bench", "gsm8k", "alpaca-eval"]


def cache_bytes(cache) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if layer.is_initialized)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="gemma3-270m")
    parser.add_argument("--draft", default=None, help="a trained draft's folder or Hub repo (default: untrained)")
    parser.add_argument("--draft-vocab", type=int, default=32768)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--prompt-tokens", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=960)
    parser.add_argument("--untrained-too", action="store_true",
                        help="with --draft: also run an untrained draft (`dart_untrained`), interleaved the same way")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target, dtype=torch.float32)
    drafts = {}
    if args.draft:
        drafts["dart"] = load_draft(args.draft, target)
    if not args.draft or args.untrained_too:
        torch.manual_seed(0)
        drafts["dart_untrained" if args.draft else "dart"] = DartDraftModel.from_target(
            target, draft_to_target_ids=torch.arange(args.draft_vocab), draft_vocab_size=args.draft_vocab
        )
    window = target.config.sliding_window
    texts = [text for name in SETS for text in load_prompts(name, -(-args.prompts // len(SETS)))][: args.prompts]
    prompts = [tokenizer(text, return_tensors="pt").input_ids[:, : args.prompt_tokens] for text in texts]
    settings = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                    return_dict_in_generate=True)

    largest = {name: 0 for name in drafts}
    running = [None]  # the DART method whose generate call is running
    compact = dart_hf.verify.compact_cache

    def measured_compact(cache, past_len, path):  # the cache at its largest: the tree's rows not yet dropped
        largest[running[0]] = max(largest[running[0]], cache_bytes(cache))
        compact(cache, past_len, path)

    dart_hf.verify.compact_cache = measured_compact
    dart_hf.generation.compact_cache = measured_compact
    runs = {"vanilla": lambda ids: target.generate(ids, **settings)}
    for name, draft in drafts.items():
        runs[name] = lambda ids, draft=draft: target.generate(ids, assistant_model=draft, **settings)
    for name, run in runs.items():  # untimed warm-up (and the one-time calibration)
        running[0] = name
        run(prompts[0][:, :16])
    clock = device_clock(target.device)
    seconds, tokens, rows = {n: [] for n in runs}, {n: [] for n in runs}, []
    for index, prompt in enumerate(prompts):
        outputs = {}
        largest.update(dict.fromkeys(drafts, 0))
        for name in list(runs) if index % 2 == 0 else list(runs)[::-1]:
            running[0] = name
            start = clock()
            outputs[name] = runs[name](prompt)
            seconds[name].append(clock() - start)
            tokens[name].append(outputs[name].sequences.shape[1] - prompt.shape[1])
        row = {"prompt_tokens": prompt.shape[1], "total_tokens": outputs["vanilla"].sequences.shape[1],
               "vanilla_cache_bytes": cache_bytes(outputs["vanilla"].cache)}
        for name, draft in drafts.items():
            stats = draft.stats
            row[name] = {
                "identical": bool(torch.equal(outputs[name].sequences, outputs["vanilla"].sequences)),
                "tau": stats.tau, "verify_steps": stats.verify_steps, "lookup_steps": stats.lookup_steps,
                "plain_steps": stats.plain_steps, "cache_bytes": cache_bytes(outputs[name].cache),
                "largest_cache_bytes": largest[name],
                "speedup": seconds["vanilla"][-1] / seconds[name][-1] * tokens[name][-1] / tokens["vanilla"][-1],
            }
        rows.append(row)
        print(index, row, flush=True)
    results = {
        "machine": device_description(target.device), "target": args.target, "sliding_window": window,
        "drafts": {name: (args.draft if name == "dart" and args.draft else
                          f"untrained, {args.draft_vocab}-token vocabulary") for name in drafts},
        "prompts": len(rows),
    }
    for name in drafts:
        columns = (seconds["vanilla"], seconds[name], tokens["vanilla"], tokens[name])
        steps = sum(r[name]["verify_steps"] for r in rows)
        results[name] = {
            "identical": sum(r[name]["identical"] for r in rows), "speedup": float(speedup(*columns)),
            "ci95": bootstrap_interval(*columns),
            "tau": sum(r[name]["tau"] * r[name]["verify_steps"] for r in rows) / max(steps, 1),
            "verify_steps": steps, "lookup_steps": sum(r[name]["lookup_steps"] for r in rows),
            "plain_steps": sum(r[name]["plain_steps"] for r in rows),
        }
    results["rows"] = rows
    print({key: value for key, value in results.items() if key != "rows"})
    report(results, args.out)


if __name__ == "__main__":
    main()
