"""An interleaved A/B of two versions of dart-hf's code: the same target, draft and prompts, vanilla `generate` and
DART in each version, prompt by prompt.

Each version runs in its own worker process whose `PYTHONPATH` puts that version's `src/` first (make the older one
with `git worktree add /tmp/before <commit>`). Both workers load the packaged SmolLM2 and the shipped draft, run an
untimed warm-up, then take the prompts in turn: for every prompt each worker times vanilla and DART (their order
reversed on every other prompt), and the workers' order is reversed on every other prompt too, so slow spells of
this machine fall on both. Only one worker computes at a time. Every greedy output is checked against its own
vanilla's. Prints, per set and overall, each version's speedup over its vanilla with its 95% bootstrap interval,
tau, and the ratio of the two versions' DART seconds per new token (after / before).

    git worktree add /tmp/before <commit>
    python benchmarks/ab_versions.py --before /tmp/before --after . --prompts-per-set 10
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import report

from dart_hf.bench import BENCHMARK_SETS, bootstrap_interval, speedup
from dart_hf.prompts import load_prompts


def serve(draft_name: str, max_new_tokens: int) -> None:
    """Worker: read one JSON request per line ({"prompt", "dart_first"}), answer with one JSON line of seconds, new
    tokens, tau and whether DART's output equals vanilla's. Uses only the API both versions share."""
    import dart_hf
    import torch
    from dart_hf.bench import chat_inputs
    from dart_hf.zoo import load_draft, load_target

    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    draft = load_draft(draft_name, target)
    options = {"max_new_tokens": max_new_tokens, "do_sample": False}
    runs = {
        "vanilla": lambda inputs: target.generate(**inputs, **options),
        "dart": lambda inputs: target.generate(**inputs, **options, assistant_model=draft),
    }
    for run in runs.values():
        run(chat_inputs(tokenizer, "Say hello."))  # untimed warm-up (and the one-time calibration)
    print(json.dumps({"ready": str(Path(dart_hf.__file__).parent)}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        inputs = chat_inputs(tokenizer, request["prompt"])
        answer, outputs = {}, {}
        for name in ["dart", "vanilla"] if request["dart_first"] else ["vanilla", "dart"]:
            start = time.perf_counter()
            outputs[name] = runs[name](inputs)
            answer[name + "_seconds"] = time.perf_counter() - start
            answer[name + "_tokens"] = outputs[name].shape[1] - inputs["input_ids"].shape[1]
        stats = draft.stats
        answer["committed"] = sum(stats.accepted_lengths)
        answer["verify_steps"] = stats.verify_steps
        answer["identical"] = bool(torch.equal(outputs["dart"], outputs["vanilla"]))
        print(json.dumps(answer), flush=True)


def start_worker(tree: Path, draft: str, max_new_tokens: int) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(tree.resolve() / "src")}
    command = [sys.executable, __file__, "--serve", "--draft", draft, "--max-new-tokens", str(max_new_tokens)]
    return subprocess.Popen(command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def ask(worker: subprocess.Popen, request: dict | None = None) -> dict:
    if request is not None:
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError("A worker ended early; its error is printed above.")
    return json.loads(line)


def summary(answers: dict[str, list[dict]]) -> dict:
    """Per version: speedup over its own vanilla with its interval, tau, outputs differing; and the ratio of DART's
    seconds per new token, after over before (below 1: the after version is faster)."""
    result = {}
    for version, rows in answers.items():
        columns = [[row[key] for row in rows] for key in
                   ("vanilla_seconds", "dart_seconds", "vanilla_tokens", "dart_tokens")]
        result[version] = {
            "speedup": float(speedup(*columns)), "ci95": bootstrap_interval(*columns),
            "tau": sum(r["committed"] for r in rows) / max(sum(r["verify_steps"] for r in rows), 1),
            "differing": sum(not r["identical"] for r in rows),
        }
    per_token = {v: sum(r["dart_seconds"] for r in rows) / sum(r["dart_tokens"] for r in rows)
                 for v, rows in answers.items()}
    result["dart_seconds_after_over_before"] = per_token["after"] / per_token["before"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="checkout of the earlier version (its src/ is used)")
    parser.add_argument("--after", type=Path, help="checkout of the later version")
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart", help="shipped draft name or folder")
    parser.add_argument("--prompts-per-set", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--sets", nargs="+", default=None, help="benchmark sets (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.draft, args.max_new_tokens)
    if args.before is None or args.after is None:
        parser.error("--before and --after name the two checkouts to compare")

    workers = {}
    for version, tree in (("before", args.before), ("after", args.after)):  # one at a time: warm-ups calibrate
        workers[version] = start_worker(tree, args.draft, args.max_new_tokens)
        print(version, "runs dart_hf from", ask(workers[version])["ready"], flush=True)
    results, everything = {}, {version: [] for version in workers}
    index = 0
    for prompt_set in [name for name in BENCHMARK_SETS if args.sets is None or name in args.sets]:
        answers = {version: [] for version in workers}
        for prompt in load_prompts(prompt_set, args.prompts_per_set):
            for version in list(workers) if index % 2 == 0 else list(workers)[::-1]:
                answers[version].append(ask(workers[version], {"prompt": prompt, "dart_first": index % 4 >= 2}))
            index += 1
        results[prompt_set] = summary(answers)
        for version in workers:
            everything[version] += answers[version]
        print(prompt_set, json.dumps(results[prompt_set]), flush=True)
    results["overall"] = summary(everything)
    for worker in workers.values():
        worker.stdin.close()
        worker.wait()
    report(results, args.out)


if __name__ == "__main__":
    main()
