"""Does the draft care whether the target's features come from float32 or bfloat16 weights?

`dart-hf train --target_dtype bfloat16` runs the frozen teacher in bfloat16, which is much cheaper where the
hardware multiplies bfloat16 natively, while the draft then serves a float32 target. This prints the draft's
teacher-forced agreement alpha_1..alpha_4 with vanilla's greedy output (float32 `generate`, so the tokens to
agree with are the same) per benchmark set, its features read once from the float32 target and once from a
bfloat16 copy of it. The prompts default to each set's 21st to 32nd, as in the replays.

    python benchmarks/teacher_dtype.py --outputs logs/replay_greedy.json [--draft smollm2-135m-instruct-dart]
"""

import argparse
import copy
from pathlib import Path

import torch

from _common import vanilla_outputs, report
from dart_hf.training.trainer import greedy_agreement
from dart_hf.zoo import load_draft, load_target


def agreement(draft, target, records: list[dict]) -> list[float]:
    """alpha_1..alpha_draft_length over `records` (`{"prompt", "output"}` token ids), features from `target`."""
    hits, rows = 0, 0
    for record in records:
        sequence = torch.tensor([record["prompt"] + record["output"]])
        record_hits, record_rows = greedy_agreement(draft, target, sequence, len(record["prompt"]))
        hits, rows = hits + record_hits, rows + record_rows
    return (hits / rows.clamp(min=1)).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", default="smollm2-135m-instruct-dart")
    parser.add_argument("--outputs", type=Path, default=Path("logs/replay_greedy.json"),
                        help="vanilla's greedy outputs (generated and cached here when missing)")
    parser.add_argument("--prompts-per-set", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    outputs = vanilla_outputs(args.outputs, 12, 64, skip=20)
    target, _ = load_target("smollm2-135m-instruct")
    draft = load_draft(args.draft, target)
    teachers = {"float32": target, "bfloat16": copy.deepcopy(target).to(torch.bfloat16)}
    results = {}
    for name, records in outputs.items():
        results[name] = {dtype: agreement(draft, teacher, records[: args.prompts_per_set])
                         for dtype, teacher in teachers.items()}
        print(name, "  ".join(f"{dtype} " + " ".join(f"{a:.3f}" for a in alphas[:4])
                              for dtype, alphas in results[name].items()), flush=True)
    report(results, args.out)


if __name__ == "__main__":
    main()
