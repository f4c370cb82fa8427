"""The decode loop's decisions replayed on vanilla's greedy outputs under a cost model: no timing noise.

Greedy DART commits exactly vanilla's tokens, so which step the loop takes and how many tokens each step commits
can be replayed without the target: a drafted tree's acceptance is read from the draft's teacher-forced logits
(`tree_replay.level_logits`), a context-lookup chain's from the text itself. The decode loop's own
`StepPlanner` makes every decision; the time of each step comes from the cached
forward costs f(n) plus a fixed overhead per kind of step, and the controller is fed those same modelled
times. Prints the modelled speed over plain decoding per set for each controller variant, with the share of
plain, lookup and tree steps and the mean tree budget.

It weighs changes to the controller's rules before an interleaved A/B: what it cannot see is everything the cost
model leaves out (the draft's catch-up over a long context, machine drift), so a variant that wins here still
has to win in `benchmarks/ab_drafts.py`-style runs.

    python benchmarks/controller_replay.py --outputs logs/replay_greedy.json    # the tree_replay outputs
"""

import argparse
import json
from collections import Counter, deque
from pathlib import Path

import numpy as np
import torch
from tree_replay import TARGET, level_logits, matching_path

from dart_hf.budget import AdaptiveBudget
from dart_hf.controller_state import ForwardTimings, LookupEvidence
from dart_hf.costs import calibrate_forward_costs
from dart_hf.generation import draft_tree_policy
from dart_hf.planner import StepPlanner
from dart_hf.zoo import load_draft, load_target


class FixedTreeBudget(AdaptiveBudget):
    """Always the same tree budget (context lookup still decided as usual)."""

    fixed = 2

    def next_budget(self) -> int:
        return self.fixed


class Pessimistic(AdaptiveBudget):
    """tau(m) estimated as its mean less `z` standard errors: budgets with thin evidence are not picked on luck."""

    z = 1.0

    def expected_tau(self, accepted_drafted: np.ndarray) -> float:
        spread = float(accepted_drafted.std()) / np.sqrt(accepted_drafted.size)
        return super().expected_tau(accepted_drafted) - self.z * spread


class Pessimistic2(Pessimistic):
    z = 2.0


class RareExplore(AdaptiveBudget):
    """A budget twice the chosen one tried every 64 steps instead of every 16."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.explore_every = 64


class FixedTreeBudget1(FixedTreeBudget):
    fixed = 1


class ExploreWhileThin(AdaptiveBudget):
    """Twice the chosen budget tried every 4 steps while fewer than `thin` steps of the history had it: after a
    move to a smaller budget, the larger one's evidence otherwise comes from one step in 16 alone (about 4 of the
    64 kept), which is barely `min_evidence` and too few to tell a close call."""

    thin = 16

    def next_budget(self) -> int:
        budget = super().next_budget()
        best = self.best()[0]
        if best is None or budget != best or best >= self.max_budget or self.steps % 4:
            return budget
        larger = min(2 * best, self.max_budget)
        return larger if sum(record.budget >= larger for record in self.history) < self.thin else budget


VARIANTS = {"controller": AdaptiveBudget, "fixed budget 2": FixedTreeBudget, "fixed budget 1": FixedTreeBudget1,
            "explore while thin": ExploreWhileThin, "pessimistic z=1": Pessimistic,
            "pessimistic z=2": Pessimistic2, "explore every 64": RareExplore}


def replay_prompt(prompt_length, sequence, trees, planner, costs, overheads):
    """Time (modelled seconds) and step counts of greedy DART over one output, every step decided by `planner` (a
    `StepPlanner`, as the decode loop's) and its outcome read from the text. trees: {anchor j: (Tree at the
    largest budget, list of path nodes that spell the continuation)}; the step whose last committed token is at
    position c uses anchor c - 2."""
    seconds, kinds, budgets = 0.0, Counter(), []
    context_array = np.array(sequence)
    committed = prompt_length + 1  # the prefill commits the first output token
    while committed < len(sequence):
        step = planner.next_step(context_array[:committed], room=max(len(sequence) - committed - 1, 0))
        kinds[step.kind] += 1
        if step.kind == "lookup":
            truth = context_array[committed : committed + step.budget]
            matched = int(np.cumprod(step.chain[: truth.size] == truth).sum())
            forward = costs(step.budget + 1)
            seconds += forward + overheads["lookup"]
            planner.record_lookup(step, overheads["lookup"], forward)
            committed += matched + 1
        elif step.kind == "plain":
            seconds += costs(1) + overheads["plain"]
            planner.record_plain(step, costs(1))
            committed += 1
        else:
            tree, path = trees[committed - 2]
            ranks = tree.ranks.tolist()
            kept_path = [node for node in path if ranks[node] <= step.budget]  # ranks grow along a path
            forward = costs(step.budget + 1)
            seconds += forward + overheads["tree"]
            planner.record_tree(step, tree, kept_path, overheads["tree"], forward)
            committed += len(kept_path)
            budgets.append(step.budget)
    return seconds, kinds, budgets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=Path, required=True, help="greedy outputs written by tree_replay.py")
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart")
    parser.add_argument("--tree-overhead-ms", type=float, default=8.0, help="draft, search, acceptance per tree")
    parser.add_argument("--lookup-overhead-ms", type=float, default=1.5, help="acceptance per lookup chain")
    parser.add_argument("--plain-overhead-ms", type=float, default=0.5, help="a plain step beyond vanilla's")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    outputs = json.loads(args.outputs.read_text())
    target, _ = load_target(TARGET, dtype=torch.float32)
    draft = load_draft(args.draft, target)
    draft.eval()
    policy = draft_tree_policy(draft)
    max_budget = draft.config.tree_budget
    costs = calibrate_forward_costs(target, list(draft.config.feature_layers), max_budget + 1)
    overheads = {"tree": args.tree_overhead_ms / 1000, "lookup": args.lookup_overhead_ms / 1000,
                 "plain": args.plain_overhead_ms / 1000}

    prompts = []  # (set, prompt length, sequence, trees)
    with torch.no_grad():
        for name, rows in outputs.items():
            for row in rows:
                sequence = row["prompt"] + row["output"]
                anchors, logits = level_logits(draft, target, torch.tensor([sequence]), len(row["prompt"]))
                trees = {}
                for anchor, anchor_logits in zip(anchors.tolist(), logits):
                    tree = policy(anchor_logits, torch.tensor(sequence[: anchor + 2]), draft.draft_to_target)
                    trees[anchor] = (tree, matching_path(tree, sequence[anchor + 2 :]))
                prompts.append((name, len(row["prompt"]), sequence, trees))
            print(f"trees built for {name}", flush=True)

    results = {}
    for variant, controller_class in VARIANTS.items():
        # one controller state for the whole run, the sets in the benchmark's order, as `dart-hf bench` keeps it
        history, lookup, timings, plain_run = deque(maxlen=64), LookupEvidence(), ForwardTimings(), 0
        per_set = {}
        for name, prompt_length, sequence, trees in prompts:
            controller = controller_class(costs, max_budget, history, lookup=lookup, timings=timings,
                                          plain_run=plain_run)
            planner = StepPlanner(controller, draft.config.tree_lookup_length, draft.config.tree_lookup_max_match)
            seconds, kinds, budgets = replay_prompt(prompt_length, sequence, trees, planner, costs, overheads)
            plain_run = controller.plain_run
            entry = per_set.setdefault(name, {"seconds": 0.0, "tokens": 0, "kinds": Counter(), "budgets": []})
            entry["seconds"] += seconds
            entry["tokens"] += len(sequence) - prompt_length - 1
            entry["kinds"] += kinds
            entry["budgets"] += budgets
        plain_cost = costs(1) + overheads["plain"]
        rows = {}
        for name, entry in per_set.items():
            steps = sum(entry["kinds"].values())
            rows[name] = {
                "speed": entry["tokens"] * plain_cost / entry["seconds"],
                "plain": entry["kinds"]["plain"] / steps, "lookup": entry["kinds"]["lookup"] / steps,
                "tree": entry["kinds"]["tree"] / steps,
                "mean_budget": float(np.mean(entry["budgets"])) if entry["budgets"] else 0.0,
            }
        total_seconds = sum(e["seconds"] for e in per_set.values())
        total_tokens = sum(e["tokens"] for e in per_set.values())
        rows["overall"] = {"speed": total_tokens * plain_cost / total_seconds}
        results[variant] = rows
        print(f"{variant}: " + ", ".join(f"{n} {r['speed']:.3f}" for n, r in rows.items()), flush=True)
        for name, row in rows.items():
            if name != "overall":
                print(f"    {name}: plain {row['plain']:.0%} lookup {row['lookup']:.0%} tree {row['tree']:.0%} "
                      f"mean budget {row['mean_budget']:.1f}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
