"""Shared by the benchmark scripts: print the results and write them as JSON when asked, the memory
sampler, vanilla's outputs that the replays read, and the replays' table of tree settings. (Interleaved
side-by-side runs go through one harness, `dart_hf.bench.run_benchmark`, with DART arms for drafts or option
sets.)"""

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch

from dart_hf.bench import BENCHMARK_SETS, chat_inputs
from dart_hf.files import write_atomically
from dart_hf.prompts import load_prompts


def report(results: dict, out: Path | None) -> None:
    print(json.dumps(results, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out, lambda temporary: Path(temporary).write_text(json.dumps(results, indent=2) + "\n"))


class PeakMemory:
    """The peak resident set size of this process (`peak`, and `above_start`: above its size at entry) and the peak
    of its anonymous part (`anonymous_peak`), in bytes, sampled every 2 ms (`memory_sizes`)."""

    def __enter__(self):
        self.start, _ = memory_sizes()
        self.peak, self.anonymous_peak = memory_sizes()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self._update()
            time.sleep(0.002)

    def _update(self):
        resident, anonymous = memory_sizes()
        self.peak = max(self.peak, resident)
        self.anonymous_peak = max(self.anonymous_peak, anonymous)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self._update()
        self.above_start = self.peak - self.start


def memory_sizes() -> tuple[int, int]:
    """(resident, anonymous) bytes of this process. Resident counts the pages of files it maps, such as a
    safetensors checkpoint read through mmap while loading: page cache the kernel drops under memory pressure.
    Anonymous (resident less shared) is the memory only this process holds."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    resident, shared = int(fields[1]) * 4096, int(fields[2]) * 4096
    return resident, resident - shared


def vanilla_outputs(
    path: Path, prompts_per_set: int, max_new_tokens: int, skip: int = 0, temperature: float = 0.0
) -> dict[str, list[dict]]:
    """{set: [{"prompt": token ids, "output": token ids}]}: vanilla `generate` (greedy) of the packaged SmolLM2 on
    prompts skip .. skip + prompts_per_set - 1 of each benchmark set, read from `path` if it exists, else
    generated and written there (`write_atomically`). temperature > 0: sampled replies instead,
    from `torch.manual_seed` of the prompt's index before each."""
    if path.exists():
        return json.loads(path.read_text())
    from dart_hf.zoo import load_target

    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    outputs = {}
    for name in BENCHMARK_SETS:
        outputs[name] = []
        for index, prompt in enumerate(load_prompts(name, skip + prompts_per_set)[skip:]):
            inputs = chat_inputs(tokenizer, prompt)
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            torch.manual_seed(index)
            sequence = target.generate(**inputs, max_new_tokens=max_new_tokens, **sampling)[0].tolist()
            length = inputs["input_ids"].shape[1]
            outputs[name].append({"prompt": sequence[:length], "output": sequence[length:]})
        print(f"generated {name}", flush=True)
    write_atomically(path, lambda temporary: Path(temporary).write_text(json.dumps(outputs)))
    return outputs


def settings_table(
    grid: list[dict], accepted: dict, budgets: list[int], costs, overheads: list[float], extra: list[dict] | None = None
) -> list[dict]:
    """Print a markdown row per tree setting and return the rows: tau(m) averaged over every replayed position, and
    the fastest budget with the speed the forward costs predict for the tree steps alone over plain decoding,
    tau(m) * f(1) / (f(m + 1) + overhead), overall and per set.

    accepted: {(set, setting index): [[tokens committed per budget] per position]}; overheads: seconds per tree
    step, per setting; extra: more columns per setting ({name: value}), printed before the taus."""
    extra = extra or [{} for _ in grid]
    sets = list(dict.fromkeys(name for name, _ in accepted))

    def best_speed(taus: np.ndarray, overhead: float) -> tuple[int, float]:
        speeds = [tau * costs(1) / (costs(m + 1) + overhead) for tau, m in zip(taus, budgets)]
        best = int(np.argmax(speeds))
        return budgets[best], speeds[best]

    names = list(extra[0])
    print("| setting | " + "".join(f"{n} | " for n in names) + " | ".join(f"tau({m})" for m in budgets)
          + " | best m | predicted |")
    print("| --- | " + "--- | " * len(names) + " | ".join("---" for _ in budgets) + " | --- | --- |")
    rows = []
    for index, setting in enumerate(grid):
        per_set = {name: np.array(accepted[name, index]).mean(axis=0) for name in sets}
        taus = np.concatenate([np.array(accepted[name, index]) for name in sets]).mean(axis=0)
        best_budget, speed = best_speed(taus, overheads[index])
        rows.append({
            "setting": setting, **extra[index], "tau": taus.tolist(), "best_budget": best_budget,
            "predicted_speed": speed, "per_set_tau": {n: t.tolist() for n, t in per_set.items()},
            "per_set_predicted_speed": {n: best_speed(t, overheads[index])[1] for n, t in per_set.items()},
        })
        print(f"| {json.dumps(setting)} | " + "".join(f"{extra[index][n]:.1f} | " for n in names)
              + " | ".join(f"{t:.3f}" for t in taus) + f" | {best_budget} | {speed:.3f} |", flush=True)
    return rows


def tree_replay_parser(doc: str, prompts_per_set: int, max_new_tokens: int, outputs_help: str, grid_help: str):
    """The arguments both tree replays take: vanilla's outputs (read, else written), the draft, which prompts of each
    set, the grid of tree settings, the modelled overhead per tree step and the JSON output."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=Path, required=True, help=outputs_help)
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart")
    parser.add_argument("--skip", type=int, default=20, help="prompts of each set to pass over (bench's own)")
    parser.add_argument("--prompts-per-set", type=int, default=prompts_per_set)
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--grid", nargs="+", default=None, help=grid_help)
    parser.add_argument("--overhead-ms", type=float, default=8.0, help="draft + acceptance per tree step")
    parser.add_argument("--out", type=Path, default=None)
    return parser

