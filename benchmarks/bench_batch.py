"""Batched DART against vanilla batched `generate`: tokens per second at several batch sizes, side by side.

For each batch size B the same prompts (cycled over the benchmark sets, chat-formatted, left-padded) are cut into
batches of B; every batch runs vanilla batched `generate` and DART (`assistant_model=draft`) interleaved, the order
swapped every batch, after an untimed warm-up per B (DART's one-time calibration of the batch's forward costs stays
out of the timings). Reported per B: tokens per second of each (a row's tokens end at its EOS), the ratio with a
bootstrap interval over batches, tau, the budgets the controller chose and its share of plain steps, the peak
resident memory above the call's start (sampled every 2 ms), and the greedy check per row: identical in float32;
in bfloat16 the near-tie judgement (`dart_hf.near_ties`).

    python benchmarks/bench_batch.py --dtype bfloat16 --batches 1 2 4 8 16 --prompts 32 \
        --out benchmarks/results/batch_smollm2_bf16.json
"""

import argparse
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from _common import PeakMemory, report

from dart_hf.bench import BENCHMARK_SETS, bootstrap_interval, chat_inputs
from dart_hf.hardware import device_description
from dart_hf.near_ties import NearTieReport
from dart_hf.prompts import load_prompts
from dart_hf.zoo import load_draft, load_target


def left_padded(rows: list[list[int]], pad_token_id: int) -> dict:
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for index, row in enumerate(rows):
        input_ids[index, width - len(row) :] = torch.tensor(row)
        attention_mask[index, width - len(row) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def row_tokens(generated: torch.Tensor, eos_ids: set[int]) -> list[torch.Tensor]:
    """Each row's new tokens `[B, M]` up to and including its first EOS."""
    rows = []
    for row in generated:
        ends = [index for index, token in enumerate(row.tolist()) if token in eos_ids]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompts", type=int, default=32, help="prompts per batch size (a multiple of each B)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    target, tokenizer = load_target(args.target, dtype=getattr(torch, args.dtype))
    draft = load_draft(args.draft, target)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = target.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    per_set = -(-args.prompts // len(BENCHMARK_SETS))
    texts = [text for name in BENCHMARK_SETS for text in load_prompts(name, per_set)]
    order = np.random.default_rng(0).permutation(len(texts))[: args.prompts]
    prompts = [chat_inputs(tokenizer, texts[index])["input_ids"][0].tolist() for index in order]
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)
    results = {"machine": {"device": device_description(target.device), "dtype": args.dtype,
                           "threads": torch.get_num_threads()},
               "max_new_tokens": args.max_new_tokens, "prompts": args.prompts, "batches": {}}
    for batch_size in args.batches:
        batches = [left_padded(prompts[start : start + batch_size], pad)
                   for start in range(0, len(prompts) - batch_size + 1, batch_size)]
        for rows in sorted({1 << power for power in range(batch_size.bit_length())} | {batch_size}):
            # DART calibrates the forward costs of each batch size it meets (the powers of two up to B, as rows
            # end) once per machine: here, not inside a timed call
            warm = left_padded([prompts[0]] * rows, pad)
            target.generate(**warm, **{**kwargs, "max_new_tokens": 16})
            target.generate(**warm, **{**kwargs, "max_new_tokens": 16}, assistant_model=draft)
        draft.controller_state.reset()  # the warm-up's evidence is not the benchmark's text
        seconds = {"vanilla": [], "dart": []}
        tokens = {"vanilla": [], "dart": []}
        memory = {"vanilla": 0, "dart": 0}
        budgets, plain_fractions, taus = Counter(), [], []
        differing_rows, near_ties = 0, NearTieReport()
        for index, batch in enumerate(batches):
            outputs = {}
            for method in ("vanilla", "dart") if index % 2 == 0 else ("dart", "vanilla"):
                extra = ({"output_logits": True, "return_dict_in_generate": True} if method == "vanilla"
                         else {"assistant_model": draft})
                with PeakMemory() as peak:
                    start = time.perf_counter()
                    outputs[method] = target.generate(**batch, **kwargs, **extra)
                    seconds[method].append(time.perf_counter() - start)
                memory[method] = max(memory[method], peak.above_start)
            width = batch["input_ids"].shape[1]
            vanilla_rows = row_tokens(outputs["vanilla"].sequences[:, width:], eos_ids)
            dart_rows = row_tokens(outputs["dart"][:, width:], eos_ids)
            tokens["vanilla"].append(sum(len(row) for row in vanilla_rows))
            tokens["dart"].append(sum(len(row) for row in dart_rows))
            stats = draft.stats
            budgets.update(stats.budgets)
            plain_fractions.append(stats.plain_fraction)
            taus.append(stats.tau)
            logits = torch.stack(outputs["vanilla"].logits, dim=1)  # [B, M, V]
            for row, (vanilla_row, dart_row) in enumerate(zip(vanilla_rows, dart_rows)):
                differing_rows += not torch.equal(vanilla_row, dart_row)
                if target.dtype != torch.float32:
                    prompt_ids = batch["input_ids"][row][batch["attention_mask"][row].bool()]
                    near_ties.add_prompt(target, prompt_ids, vanilla_row, logits[row, : len(vanilla_row)],
                                         {"dart": dart_row})
        rates = {method: np.array(tokens[method]) / np.array(seconds[method]) for method in seconds}
        ratio = float(sum(tokens["dart"]) / sum(seconds["dart"]) / (sum(tokens["vanilla"]) / sum(seconds["vanilla"])))
        low, high = bootstrap_interval(seconds["vanilla"], seconds["dart"], tokens["vanilla"], tokens["dart"])
        results["batches"][str(batch_size)] = {
            "batches": len(batches),
            "tokens_per_second": {method: float(sum(tokens[method]) / sum(seconds[method])) for method in seconds},
            "per_batch_tokens_per_second": {method: rates[method].round(2).tolist() for method in rates},
            "speedup": ratio, "speedup_interval_95": [low, high],
            "tau": float(np.mean(taus)), "plain_fraction": float(np.mean(plain_fractions)),
            "budgets": dict(sorted(budgets.items())),
            "peak_memory_above_start_mib": {method: round(memory[method] / 2**20, 1) for method in memory},
            "rows_differing_from_vanilla": differing_rows,
            "near_ties": near_ties.summary("dart") if target.dtype != torch.float32 else None,
        }
        print(batch_size, results["batches"][str(batch_size)], flush=True)
    report(results, args.out)


if __name__ == "__main__":
    main()
