"""The tree search's settings replayed on vanilla's greedy outputs: acceptance per budget, no verify forwards.

Greedy verification accepts the longest tree path that spells vanilla's own continuation, so given the draft's
teacher-forced logits at every output position (one draft pass per prompt, `draft_rows`) the acceptance length of
any tree is known without running the target over it. For each setting of the beam search (`tree_*` fields of the
draft's config) it builds the tree at every position, reads the acceptance of every budget m from the tree's ranks
(a budget of m keeps the nodes of rank <= m), and prints tau(m) beside the speed that the cached forward costs
predict for the tree steps alone: tau(m) * f(1) / (f(m + 1) + overhead), plain decoding = 1.00.

The prompts default to each benchmark set's 21st to 32nd, so that settings chosen here are judged afterwards on
`dart-hf bench`'s default prompts (the first 20), which this replay never reads.

    python benchmarks/tree_replay.py --outputs logs/replay_greedy.json      # about 4 minutes to generate
    python benchmarks/tree_replay.py --outputs logs/replay_greedy.json --draft drafts/x --grid ngram_weight=0,1
"""

import json
import time

import torch

from _common import report, settings_table, tree_replay_parser, vanilla_outputs
from dart_hf.costs import CANDIDATE_BUDGETS, calibrate_forward_costs
from dart_hf.generation import draft_tree_policy
from dart_hf.options import DecodingOptions
from dart_hf.training.trainer import draft_rows
from dart_hf.zoo import load_draft, load_target

TARGET = "smollm2-135m-instruct"
# one setting changed at a time from the draft's own (the first row)
DEFAULT_GRID = [
    {},
    {"ngram_weight": 0.0}, {"ngram_weight": 0.25}, {"ngram_weight": 1.0}, {"ngram_weight": 2.0},
    {"level_decay": 0.0}, {"level_decay": 0.35}, {"level_decay": 1.4},
    {"logit_decay": 0.7}, {"logit_decay": 1.0},
    {"beam_width": 10}, {"beam_width": 40},
    {"top_k": 10}, {"top_k": 50},
    {"full_softmax": True}, {"ngram_at_root": True},
    {"policy": "topk"},
]


def level_logits(draft, target, sequence: torch.Tensor, prompt_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's logits at every output position, as the decode loop would see them.

    Returns anchors `[A]` (row j pairs the target's features at position j with token j + 1, the tree's root) and
    logits `[A, draft_length, V_d]` (level l predicts token j + 2 + l)."""
    loss_mask = torch.zeros_like(sequence, dtype=torch.bool)
    loss_mask[:, prompt_length:] = True
    batch = {"input_ids": sequence, "attention_mask": torch.ones_like(sequence), "loss_mask": loss_mask}
    rows = draft_rows(draft, target, batch, num_anchors=None)
    logits = rows.draft_logits[0]
    num_blocks = len(rows.anchors)
    num_prefix = logits.shape[0] - num_blocks * rows.num_masks
    masks = logits[num_prefix:].reshape(num_blocks, rows.num_masks, -1)
    return rows.anchors, torch.cat([logits[rows.anchors, None], masks], dim=1)


def matching_path(tree, continuation: list[int]) -> list[int]:
    """Node indices from the root along the branch that spells `continuation` (root included)."""
    children = tree.children()
    path = [0]
    for token in continuation:
        child = children[path[-1]].get(token)
        if child is None:
            break
        path.append(child)
    return path


def accepted_per_budget(tree, continuation: list[int], budgets: list[int]) -> list[int]:
    """Tokens a greedy verify step commits (the bonus token included) for each budget m: 1 + the leading nodes of
    the path that spells `continuation` whose rank is <= m (ranks grow along a path)."""
    ranks = tree.ranks.tolist() if tree.ranks is not None else list(range(len(tree)))
    path_ranks = [ranks[node] for node in matching_path(tree, continuation)[1:]]
    return [1 + sum(1 for rank in path_ranks if rank <= m) for m in budgets]


def parse_grid(items: list[str]) -> list[dict]:
    """["ngram_weight=0,1", "beam_width=10"] -> [{}, {"ngram_weight": 0.0}, {"ngram_weight": 1.0}, ...]: each value
    alone, after the draft's own setting."""
    grid = [{}]
    for item in items:
        name, values = item.split("=", 1)
        for value in values.split(","):
            grid.append({name: json.loads(value) if value not in ("beam", "topk") else value})
    return grid


def main() -> None:
    parser = tree_replay_parser(__doc__, 12, 64, "greedy outputs: read if present, else written",
                                "name=v1,v2 ... (default: DEFAULT_GRID)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    outputs = vanilla_outputs(args.outputs, args.prompts_per_set, args.max_new_tokens, skip=args.skip)

    target, _ = load_target(TARGET, dtype=torch.float32)
    draft = load_draft(args.draft, target)
    draft.eval()
    grid = parse_grid(args.grid) if args.grid else DEFAULT_GRID
    max_budget = draft.config.tree_budget
    budgets = [m for m in CANDIDATE_BUDGETS if m <= max_budget]
    policies = [draft_tree_policy(draft, DecodingOptions.resolve(draft.config, setting)) for setting in grid]
    costs = calibrate_forward_costs(target, list(draft.config.feature_layers), max_budget + 1)

    accepted = {(name, i): [] for name in outputs for i in range(len(grid))}
    search_seconds = [0.0] * len(grid)
    with torch.no_grad():
        for name, rows in outputs.items():
            for row in rows:
                sequence = row["prompt"] + row["output"]
                anchors, logits = level_logits(draft, target, torch.tensor([sequence]), len(row["prompt"]))
                for anchor, anchor_logits in zip(anchors.tolist(), logits):
                    context = torch.tensor(sequence[: anchor + 2])
                    continuation = sequence[anchor + 2 :]
                    for index, policy in enumerate(policies):
                        start = time.perf_counter()
                        tree = policy(anchor_logits, context, draft.draft_to_target)
                        search_seconds[index] += time.perf_counter() - start
                        accepted[name, index].append(accepted_per_budget(tree, continuation, budgets))
            print(f"replayed {name}", flush=True)

    positions = sum(len(accepted[name, 0]) for name in outputs)
    search_ms = [1000 * seconds / positions for seconds in search_seconds]
    overheads = [(args.overhead_ms + ms) / 1000 for ms in search_ms]
    rows = settings_table(grid, accepted, budgets, costs, overheads, [{"search ms": ms} for ms in search_ms])
    results = {"draft": args.draft, "positions": positions, "budgets": budgets, "settings": rows}
    if args.out is not None:
        report(results, args.out)


if __name__ == "__main__":
    main()
