"""The tree forward's attention on a CPU: Transformers' sdpa (which copies the cached keys and values once per query
head of their group) against `dart_hf.attention` (sdpa reads the grouped heads in place), side by side with vanilla
`generate`.

Two arms, each the shipped draft with its own shared state and its own calibration of the forward costs, measured
with its own attention:
- repeat_kv: every tree forward through Transformers' "sdpa" attention, as before `dart_hf.attention`;
- this: the tree forwards through `dart_hf.attention.grouped_query_sdpa`.
Over the benchmark sets in the bench's order, interleaved prompt by prompt with the order reversed on every other
prompt; every output is checked against vanilla's.

    python benchmarks/ab_attention.py 10 32 benchmarks/results/ab_attention.json [gsm8k,mbpp]
    # prompts per set, new tokens, output, the sets (default all); about 12 minutes on a 2-core CPU
"""

import contextlib
import sys
from pathlib import Path

from _common import interleaved_speedups, report

from dart_hf import generation, verify
from dart_hf.zoo import load_draft, load_target


def main() -> None:
    prompts_per_set = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    max_new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    sets = sys.argv[4].split(",") if len(sys.argv) > 4 else None
    target, tokenizer = load_target("smollm2-135m-instruct")
    drafts = {name: load_draft("smollm2-135m-instruct-dart", target) for name in ("repeat_kv", "this")}
    running = {"draft": None}  # the draft of the DART call in progress (set when its controller is built)
    make_controller, calibrate, grouped_query_sdpa = (
        generation.adaptive_budget, generation.calibrate_forward_costs, verify.grouped_query_sdpa
    )

    def adaptive_budget(draft, *args, **kwargs):
        running["draft"] = draft
        return make_controller(draft, *args, **kwargs)

    def calibrate_forward_costs(*args, **kwargs):  # the repeat_kv arm measures its own costs, never cached on disk
        return calibrate(*args, **kwargs, use_disk_cache=running["draft"] is not drafts["repeat_kv"])

    def attention(target):
        return contextlib.nullcontext() if running["draft"] is drafts["repeat_kv"] else grouped_query_sdpa(target)

    generation.adaptive_budget = adaptive_budget
    generation.calibrate_forward_costs = calibrate_forward_costs
    verify.grouped_query_sdpa = attention
    report(interleaved_speedups(target, tokenizer, drafts, prompts_per_set, max_new_tokens, sets), out)


if __name__ == "__main__":
    main()
