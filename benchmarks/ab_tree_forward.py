"""The tree forward on a CPU, three versions side by side with vanilla `generate`.

Three arms, each the shipped draft with its own shared state and its own calibration of the forward costs, measured
as that arm runs its forwards:
- repeat_kv: every tree forward through Transformers' "sdpa" attention (which copies the cached keys and values
  once per query head of their group), each forward with exactly its nodes: the version before both changes;
- unpadded: the tree forwards through `dart_hf.attention.grouped_query_sdpa` (sdpa reads the grouped heads in
  place), each with exactly its nodes;
- this: grouped-query sdpa, and forwards padded to a faster size where the calibration measured one
  (`ForwardCosts.rows`).
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; every output is checked against vanilla's.

    python benchmarks/ab_tree_forward.py 10 32 benchmarks/results/ab_tree_forward.json [gsm8k,mbpp] [unpadded,this]
    # prompts per set, new tokens, output, the sets (default all), the arms (default all three);
    # about 16 minutes on a 2-core CPU for all three arms
"""

import contextlib
import dataclasses
import sys
from pathlib import Path

from _common import interleaved_speedups, report, tree_policies

from dart_hf import generation, verify
from dart_hf.zoo import load_draft, load_target

ARMS = ("repeat_kv", "unpadded", "this")


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    sets = sys.argv[4].split(",") if len(sys.argv) > 4 else None
    arms = sys.argv[5].split(",") if len(sys.argv) > 5 else ARMS
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in arms}
    arm_of = {id(draft): name for name, draft in drafts.items()}
    running = {"arm": None}  # the arm of the DART call in progress (set when its controller is built)
    make_controller, calibrate, grouped_query_sdpa = (
        generation.adaptive_budget, generation.calibrate_forward_costs, verify.grouped_query_sdpa
    )

    def adaptive_budget(draft, *args, **kwargs):
        running["arm"] = arm_of[id(draft)]
        controller = make_controller(draft, *args, **kwargs)
        if running["arm"] != "this":
            for budget in tree_policies(controller):
                budget.costs = dataclasses.replace(budget.costs, max_rows=0)  # no padding
        return controller

    def calibrate_forward_costs(*args, **kwargs):  # the repeat_kv arm measures its own costs, never cached on disk
        return calibrate(*args, **kwargs, use_disk_cache=running["arm"] != "repeat_kv")

    def attention(target):
        return contextlib.nullcontext() if running["arm"] == "repeat_kv" else grouped_query_sdpa(target)

    generation.adaptive_budget = adaptive_budget
    generation.calibrate_forward_costs = calibrate_forward_costs
    verify.grouped_query_sdpa = attention
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets), out)


if __name__ == "__main__":
    main()
