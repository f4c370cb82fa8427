"""Shared by the benchmark scripts: print the results and write them as JSON when asked, the interleaved
side-by-side run of several DART drafts against vanilla `generate`, vanilla's outputs that the replays read, and
the replays' table of tree settings."""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dart_hf.bench import BENCHMARK_SETS, bootstrap_interval, chat_inputs, speedup
from dart_hf.files import write_atomically
from dart_hf.prompts import load_prompts
from dart_hf.training.trainer import greedy_agreement


def report(results: dict, out: Path | None) -> None:
    print(json.dumps(results, indent=2))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out, lambda temporary: Path(temporary).write_text(json.dumps(results, indent=2) + "\n"))


def interleaved_speedups(
    target,
    tokenizer,
    drafts: dict,
    prompts_per_set: int,
    max_new_tokens: int = 32,
    sets: list[str] | None = None,
    do_sample: bool = False,
    tree_options: dict[str, dict] | None = None,
) -> dict:
    """Vanilla greedy `generate` and each draft of `drafts` (name -> bound `DartDraftModel`, each with its own
    controller state) over the benchmark sets, interleaved prompt by prompt with the order reversed on every other
    prompt, after an untimed warm-up; every DART output is checked against vanilla's (in float32 it must be vanilla's
    token for token; in a lower precision, where vanilla itself flips at near-ties, the identical ones are counted
    as `identical`). Prints and returns, per set
    and overall, each draft's total-time speedup over vanilla, tau, share of plain steps and alpha_1 (untimed:
    its teacher-forced agreement with vanilla's greedy output at the first drafted position); the speedups are per
    new token, with their 95% bootstrap intervals over the prompts (`dart_hf.bench`). sets: the benchmark
    sets to run, in the bench's order (default all). do_sample: T=1 sampling instead, every run seeded with
    `torch.manual_seed(0)` as the bench does; no output check and no alpha_1 (outputs differ by design).
    tree_options: per draft name, the `tree_options` its calls pass (an option set per arm)."""
    options = {"max_new_tokens": max_new_tokens, "do_sample": do_sample}
    arm_options = tree_options or {}
    runs = {
        "vanilla": lambda inputs: target.generate(**inputs, **options),
        **{name: (lambda inputs, d=draft, o=arm_options.get(name): target.generate(
            **inputs, **options, assistant_model=d, tree_options=o))
           for name, draft in drafts.items()},
    }
    for run in runs.values():
        run(chat_inputs(tokenizer, "Say hello."))  # untimed warm-up (and the one-time calibration)
    for draft in drafts.values():
        draft.controller_state.reset()  # the warm-up's evidence is not the benchmark text's

    results, all_seconds, all_tokens = {}, {name: [] for name in runs}, {name: [] for name in runs}
    all_hits, all_rows = dict.fromkeys(drafts, 0), dict.fromkeys(drafts, 0)
    for prompt_set in [name for name in BENCHMARK_SETS if sets is None or name in sets]:
        seconds, tokens = {name: [] for name in runs}, {name: [] for name in runs}
        plain, steps, committed, verified, hits, rows, identical = (dict.fromkeys(drafts, 0) for _ in range(7))
        for index, prompt in enumerate(load_prompts(prompt_set, prompts_per_set)):
            inputs = chat_inputs(tokenizer, prompt)
            outputs = {}
            for name in list(runs) if index % 2 == 0 else list(runs)[::-1]:
                if do_sample:
                    torch.manual_seed(0)
                start = time.perf_counter()
                outputs[name] = runs[name](inputs)
                seconds[name].append(time.perf_counter() - start)
                tokens[name].append(outputs[name].shape[1] - inputs["input_ids"].shape[1])
                if name in drafts:
                    stats = drafts[name].stats
                    plain[name] += stats.plain_steps
                    steps[name] += stats.plain_steps + stats.verify_steps
                    committed[name] += sum(stats.accepted_lengths)
                    verified[name] += stats.verify_steps
            prompt_length = inputs["input_ids"].shape[1]
            for name, draft in drafts.items() if not do_sample else ():
                same = torch.equal(outputs[name], outputs["vanilla"])
                assert same or target.dtype != torch.float32, f"{name} differs from vanilla on {prompt!r}"
                identical[name] += same
                depth_hits, depth_rows = greedy_agreement(draft, target, outputs["vanilla"], prompt_length)
                hits[name] += int(depth_hits[0])
                rows[name] += int(depth_rows[0])
        for name in runs:
            all_seconds[name] += seconds[name]
            all_tokens[name] += tokens[name]
        for name in drafts:
            all_hits[name] += hits[name]
            all_rows[name] += rows[name]
        results[prompt_set] = {
            name: {**_speedups(seconds, tokens, name), "tau": committed[name] / max(verified[name], 1),
                   "plain": plain[name] / max(steps[name], 1), "alpha_1": hits[name] / max(rows[name], 1),
                   "identical": identical[name]}
            for name in drafts
        }
        print(prompt_set, "  ".join(
            f"{name} {r['speedup']:.3f}x [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}] (tau {r['tau']:.2f}, "
            f"{r['plain']:.0%} plain, alpha_1 {r['alpha_1']:.1%})"
            for name, r in results[prompt_set].items()), flush=True)
    results["overall"] = {
        name: {**_speedups(all_seconds, all_tokens, name), "alpha_1": all_hits[name] / max(all_rows[name], 1)}
        for name in drafts
    }
    print("overall", "  ".join(
        f"{name} {r['speedup']:.3f}x [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}] (alpha_1 {r['alpha_1']:.1%})"
        for name, r in results["overall"].items()))
    return results


def _speedups(seconds: dict[str, list[float]], tokens: dict[str, list[int]], name: str) -> dict:
    """`name`'s speedup per new token over vanilla and its 95% bootstrap interval, from per-prompt seconds and
    new tokens."""
    runs = (seconds["vanilla"], seconds[name], tokens["vanilla"], tokens[name])
    return {"speedup": float(speedup(*runs)), "ci95": bootstrap_interval(*runs)}


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

