"""Where DART's time goes, step by step: every step of DART's decoding on a prompt set, with its kind (plain,
drafted, probe, lookup), its node count, its forward's seconds against the calibrated cost of that many nodes,
its seconds outside the forward and the tokens it committed; vanilla `generate` runs each prompt beside it
(interleaved, the order alternating), so the trace's loss or gain adds up to a measured ratio.

The summary prices every kind of step against plain decoding: a step that commits k tokens in s seconds gains
k * p - s, where p is the median plain step's wall time in the same run, so the kinds' gains, over the all-plain
time, say which kind of step a slow set loses in. It also gives each node count's median forward as a multiple of
its calibrated cost and of the median plain forward, to compare with the calibration (`dart_hf.budget`).

    python benchmarks/step_trace.py --set mbpp --prompts 10 --sample --out benchmarks/results/trace_mbpp_sample.json
"""

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from dart_hf.bench import chat_inputs
from dart_hf.files import write_atomically
from dart_hf.prompts import load_prompts
from dart_hf.zoo import load_draft, load_target

STEPS: list[dict] = []  # filled by the observer, one entry per step
_last = {"end": 0.0, "stats": None, "tokens": 0}  # the previous step's record time, and the tokens committed by then


def install_trace(draft) -> None:
    """Record every step of `draft`'s decoding as the planner is told it (`draft.step_observers`): its kind, nodes,
    forward seconds against the calibrated cost, seconds outside the forward, wall time since the previous step's
    record and the tokens the draft's `stats` (one per `generate` call) counted since."""

    def observe(outcome, planner) -> None:
        costs = planner.controller.costs  # as the controller prices forwards: padded to a cheaper size where one is
        now = time.perf_counter()
        stats = draft.stats
        if stats is not _last["stats"]:
            _last.update(stats=stats, tokens=0)
        step = outcome.step
        kind = {"tree": "probe" if step.probe else "drafted"}.get(step.kind, step.kind)
        STEPS.append(
            {
                "kind": kind,
                "nodes": outcome.nodes,
                "forward": outcome.forward_seconds,
                "calibrated": costs(outcome.nodes),
                "weight_major": costs.weight_major(costs.rows(outcome.nodes)),
                "wall": now - _last["end"],
                "tokens": stats.new_tokens - _last["tokens"],
                "overhead": outcome.overhead_seconds,
            }
        )
        _last.update(end=now, tokens=stats.new_tokens)

    draft.step_observers.append(observe)


def summarise(steps: list[dict], dart_seconds: float, vanilla_seconds: float, new_tokens: int) -> dict:
    """Per kind of step: its count, tokens, share of DART's time and gain over plain decoding (as a share of the
    all-plain time, each token priced at the median plain step); per node count: the median forward against its
    calibrated cost and against the median plain forward."""
    plain = [s for s in steps if s["kind"] == "plain"]
    if not plain:
        raise SystemExit("No plain steps in the trace to price the others against: trace more prompts.")
    plain_wall = statistics.median(s["wall"] for s in plain)
    plain_forward = statistics.median(s["forward"] for s in plain)
    all_plain = new_tokens * plain_wall
    kinds = {}
    for kind in ("plain", "drafted", "probe", "lookup"):
        chosen = [s for s in steps if s["kind"] == kind]
        if not chosen:
            continue
        tokens = sum(s["tokens"] for s in chosen)
        wall = sum(s["wall"] for s in chosen)
        kinds[kind] = {
            "steps": len(chosen),
            "tokens": tokens,
            "wall_share": wall / dart_seconds,
            "gain_over_all_plain": (tokens * plain_wall - wall) / all_plain,
            "overhead_ms": 1e3 * statistics.mean(s["overhead"] for s in chosen),
        }
    by_nodes = defaultdict(list)
    for s in steps:
        if s["forward"]:
            by_nodes[s["nodes"]].append(s)
    forwards = {
        nodes: {
            "forwards": len(group),
            "over_calibrated": statistics.median(s["forward"] / s["calibrated"] for s in group),
            "over_plain_forward": statistics.median(s["forward"] for s in group) / plain_forward,
        }
        for nodes, group in sorted(by_nodes.items())
    }
    return {
        "dart_over_vanilla_time": dart_seconds / vanilla_seconds,
        "speedup": vanilla_seconds / dart_seconds,
        "plain_step_ms": 1e3 * plain_wall,
        "plain_forward_ms": 1e3 * plain_forward,
        "all_plain_over_vanilla": all_plain / vanilla_seconds,
        "kinds": kinds,
        "forwards": forwards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="mbpp", help="benchmark prompt set")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sample", action="store_true", help="T=1 sampling instead of greedy (same seed per run)")
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart")
    parser.add_argument("--out", type=Path, default=None, help="JSON: the summary and every step")
    args = parser.parse_args()

    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)
    draft = load_draft(args.draft, target)
    options = dict(max_new_tokens=args.max_new_tokens, do_sample=args.sample, pad_token_id=tokenizer.pad_token_id)
    warm_up = chat_inputs(tokenizer, "Say hello.")
    target.generate(**warm_up, **options)
    target.generate(**warm_up, **options, assistant_model=draft)  # and the one-time calibration
    draft.controller_state.reset()
    install_trace(draft)

    seconds = {"vanilla": 0.0, "dart": 0.0}
    new_tokens = 0
    for index, prompt in enumerate(load_prompts(args.set, args.prompts)):
        inputs = chat_inputs(tokenizer, prompt)
        order = ("vanilla", "dart") if index % 2 == 0 else ("dart", "vanilla")
        for method in order:
            extra = {"assistant_model": draft} if method == "dart" else {}
            torch.manual_seed(index)
            start = time.perf_counter()
            _last["end"] = start
            output = target.generate(**inputs, **options, **extra)
            seconds[method] += time.perf_counter() - start
            if method == "dart":
                new_tokens += output.shape[1] - inputs["input_ids"].shape[1]
                STEPS[-1]["prompt_end"] = True
    # the prefill is timed inside the first step of each prompt: leave those steps out of the per-kind medians
    steps = [s for i, s in enumerate(STEPS) if i > 0 and "prompt_end" not in STEPS[i - 1]]
    summary = summarise(steps, seconds["dart"], seconds["vanilla"], new_tokens)
    summary.update(set=args.set, prompts=args.prompts, sample=args.sample, max_new_tokens=args.max_new_tokens)
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        trace = json.dumps({"summary": summary, "steps": STEPS})
        write_atomically(args.out, lambda temporary: Path(temporary).write_text(trace))


if __name__ == "__main__":
    main()
