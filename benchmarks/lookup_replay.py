"""How often each kind of context-lookup candidate holds, replayed on vanilla's greedy outputs: no timing, no noise.

For every output position of every prompt, `dart_hf.lookup.find_continuations` runs on the prompt plus the output
so far, and each candidate is scored by `LookupTracker` against the tokens vanilla actually produced next. Per kind (match length, whether the earlier occurrences disagree, which occurrence) it prints how many
positions offered one, how often its first token held, and the mean number of leading tokens that held (at most
`--length`). A way to weigh a change to the lookup rules before spending an interleaved A/B on it.

    python benchmarks/lookup_replay.py --prompts-per-set 40 --max-new-tokens 32 --outputs greedy.json
    # about 25 minutes on a 2-core CPU to generate; later runs read greedy.json and take seconds
"""

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
from _common import vanilla_outputs

from dart_hf.lookup import LookupTracker, find_continuations


def replay(outputs: dict[str, list[dict]], max_match: int, length: int) -> dict[tuple, list[int]]:
    """{kind: [tokens held, one per position that offered a candidate of that kind]}, over every set, scored by the
    decode loop's own `LookupTracker` (a candidate still undecided at the end of the output is left out)."""
    held = defaultdict(list)
    for rows in outputs.values():
        for row in rows:
            sequence = np.array(row["prompt"] + row["output"])
            tracker = LookupTracker()
            for position in range(len(row["prompt"]) + 1, len(sequence)):  # the first output token: the prefill's
                for kind, chain in find_continuations(sequence[:position], max_match, length):
                    tracker.propose(sequence[:position], kind, chain)
            for kind, matched in tracker.resolve(sequence):
                held[kind].append(matched)
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-set", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--outputs", type=Path, required=True, help="greedy outputs: read if present, else written")
    parser.add_argument("--max-match", type=int, default=3)
    parser.add_argument("--length", type=int, default=10)
    args = parser.parse_args()
    outputs = vanilla_outputs(args.outputs, args.prompts_per_set, args.max_new_tokens)
    print("| match | occurrences disagree | occurrence | positions | first token held | mean tokens held |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, counts in sorted(replay(outputs, args.max_match, args.length).items()):
        counts = np.array(counts)
        match, ambiguous, which = kind
        print(f"| {match} | {'yes' if ambiguous else 'no'} | {which} | {counts.size} | {(counts >= 1).mean():.0%} | "
              f"{counts.mean():.2f} |")


if __name__ == "__main__":
    main()
