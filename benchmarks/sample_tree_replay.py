"""The tree search's settings replayed at T > 0: each tree's exact expected acceptance, from the target's own
distributions at its nodes.

Sampling verification (multi-draft rejection sampling with deterministic drafts, `dart_hf.verify.sample_child`)
draws each committed token exactly from the target's distribution p and follows a drafted child whenever the draw
is one; so a drafted node is reached with probability prod p(token | its prefix) over its path, and a step commits
in expectation 1 + the sum of those products over the tree's nodes. A budget of m keeps the nodes of rank <= m
(`Tree.ranks`), so one target forward over the largest tree gives the expected tau of every budget, with no
sampling noise: the only randomness left is which texts (vanilla's own T > 0 replies) the trees are built on.

For each setting of the beam search (`tree_*` fields of the draft's config), and for sampling mode's drawn chains
(`{"sample_drafts": 0.7}`: tokens drawn from the draft, `dart_hf.tree.SampledChainPolicy`; `"siblings": s,
"sibling_position": k` adds s more drawn first-level tokens after the chain's first k nodes, a layout the package
does not build), it builds the tree at every output position, runs the target over it once (trees of the same
tokens share the forward), and prints tau(m) beside the speed that the cached forward costs predict for the tree steps alone: tau(m) * f(1) / (f(m + 1) + overhead), plain
decoding = 1.00. The prompts default to each benchmark set's 21st to 26th (`dart-hf bench` reads the first 20).

    python benchmarks/sample_tree_replay.py --outputs logs/replay_sample.json     # about 2 minutes to generate
    python benchmarks/sample_tree_replay.py --outputs logs/replay_sample.json --grid '{"full_softmax": true}'
"""

import functools
import json

import torch
from transformers import DynamicCache, GenerationConfig

from _common import report, settings_table, tree_replay_parser, vanilla_outputs
from dart_hf.costs import CANDIDATE_BUDGETS, calibrate_forward_costs
from dart_hf.generation import draft_tree_policy, sampled_chain_policy
from dart_hf.options import DecodingOptions
from dart_hf.tree import Tree
from dart_hf.verify import forward_tree
from dart_hf.zoo import load_draft, load_target
from tree_replay import level_logits

TARGET = "smollm2-135m-instruct"
# the draft's own setting first; then the scores that sampling's acceptance suggests (a node's chance to be
# reached is its path's product of probabilities: no level or logit decay, the whole vocabulary's softmax)
DEFAULT_GRID = [
    {},
    {"full_softmax": True},
    {"level_decay": 0.0, "logit_decay": 1.0},
    {"level_decay": 0.0, "logit_decay": 1.0, "full_softmax": True},
    {"level_decay": 0.0, "logit_decay": 1.0, "full_softmax": True, "ngram_weight": 0.25},
    {"level_decay": 0.0, "logit_decay": 1.0, "full_softmax": True, "ngram_weight": 0.0},
    {"policy": "topk"},
    {"sample_drafts": 0.7},  # the drawn chain (`SampledChainPolicy`), sampling mode's default
    {"sample_drafts": 0.7, "use_ngram": False},  # its levels drawn from the draft's marginals alone
    {"sample_drafts": 0.7, "ngram_weight": 1.0},
    {"sample_drafts": 1.0},
    {"sample_drafts": 0.5},
]


def expected_accepted(tree: Tree, node_logits: torch.Tensor, temperature: float, budgets: list[int]) -> list[float]:
    """Expected tokens a sampling verify step commits (the bonus token included) for each budget m: 1 + the sum,
    over the drafted nodes of rank <= m, of the probability that sampling reaches the node.

    A node's siblings are tried in node order (`dart_hf.verify.sample_child`), each on what its earlier siblings
    left of p: a deterministic one is followed with probability r(token), after which r(token) = 0; a drawn one
    (`tree.proposals`) with min(1, r(token) / q(token)), after which r = (r - q)+; r renormalised each time. With
    deterministic children only this is p(token) for each. For a drawn node it is exact given the draw, and its
    mean over the draws is the true reach: an unbiased estimate, one draw per position. A drawn sibling's reach
    depends on the earlier siblings, so their ranks must grow with the node index (true of every layout here):
    a budget then never keeps a later one without the earlier ones whose residual it sees.

    node_logits `[N + 1, V]`: the target's logits at every node (row i predicts the token after node i)."""
    probs = torch.softmax(node_logits.float() / temperature, dim=-1)
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    ranks = tree.ranks.tolist() if tree.ranks is not None else list(range(len(tree)))
    proposals = tree.proposals or {}
    reach = [1.0] + [0.0] * (len(tree) - 1)
    left = {}  # parent -> (what its earlier children left of p `[V]`, the chance that they were all rejected)
    for node in range(1, len(tree)):  # parents come first
        parent, token = parents[node], tokens[node]
        residual, all_rejected = left.get(parent, (probs[parent], 1.0))
        if node in proposals:
            proposal = proposals[node]
            followed = min(1.0, float(residual[token]) / float(proposal[token]))
            residual = (residual - proposal).clamp(min=0)
        else:  # (a repeated sibling token has r(token) = 0 here: verification follows the first)
            followed = float(residual[token])
            residual = residual.clone()
            residual[token] = 0
        total = residual.sum()
        reach[node] = reach[parent] * all_rejected * followed
        left[parent] = (residual / total if total > 0 else residual, all_rejected * (1.0 - followed))
    return [1.0 + sum(r for r, rank in zip(reach[1:], ranks[1:]) if rank <= m) for m in budgets]


def with_drawn_siblings(chain: Tree, siblings: int, position: int) -> Tree:
    """A replay-only layout: the drawn chain with `siblings` more first-level tokens drawn from its first level's
    proposal without replacement (each one's proposal is q without the tokens drawn before it, renormalised), laid
    out after the chain's first `position` nodes; ranks follow the node order."""
    remaining = chain.proposals[1].clone()
    remaining[int(chain.tokens[1])] = 0
    drawn = []
    for _ in range(siblings):
        if remaining.sum() <= 0:
            break
        proposal = remaining / remaining.sum()
        token = int(torch.multinomial(proposal, num_samples=1))
        drawn.append((token, proposal))
        remaining[token] = 0
    chain_nodes = list(range(1, len(chain)))
    order = chain_nodes[:position] + [-1 - i for i in range(len(drawn))] + chain_nodes[position:]
    new_index = {node: i + 1 for i, node in enumerate(order)}
    tokens, parents, proposals = [int(chain.tokens[0])], [-1], {}
    for node in order:
        if node < 0:  # a drawn sibling, child of the root
            token, proposal = drawn[-1 - node]
            tokens.append(token)
            parents.append(0)
        else:
            tokens.append(int(chain.tokens[node]))
            parents.append(new_index.get(int(chain.parents[node]), 0))
            proposal = chain.proposals[node]
        proposals[new_index[node]] = proposal
    tree = Tree.from_parents(tokens, parents)
    tree.ranks = torch.arange(len(tree))
    tree.proposals = proposals
    return tree


def drawn_siblings_tree(chain_policy, siblings: int, position: int, *args, **kwargs) -> Tree:
    """`chain_policy`'s drawn chain, laid out with drawn siblings (`with_drawn_siblings`)."""
    return with_drawn_siblings(chain_policy(*args, **kwargs), siblings, position)


def main() -> None:
    parser = tree_replay_parser(__doc__, 6, 32, "vanilla's sampled outputs: read if present, else written",
                                "JSON settings (default: DEFAULT_GRID)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-budget", type=int, default=16, help="the largest tree replayed")
    args = parser.parse_args()
    torch.set_num_threads(2)
    outputs = vanilla_outputs(
        args.outputs, args.prompts_per_set, args.max_new_tokens, skip=args.skip, temperature=args.temperature
    )

    target, _ = load_target(TARGET, dtype=torch.float32)
    draft = load_draft(args.draft, target)
    draft.eval()
    grid = [json.loads(item) for item in args.grid] if args.grid else DEFAULT_GRID
    if grid[0] != {}:
        grid = [{}] + grid
    budgets = [m for m in CANDIDATE_BUDGETS if m <= args.max_budget]
    sampling = GenerationConfig(do_sample=True, temperature=args.temperature)
    policies = []
    for setting in grid:
        options = {"budget": args.max_budget, **setting}
        sample_drafts = options.pop("sample_drafts", 0)
        siblings, position = options.pop("siblings", 0), options.pop("sibling_position", 1)
        policy = draft_tree_policy(draft, DecodingOptions.resolve(draft.config, options))
        if sample_drafts:
            policy = sampled_chain_policy(draft, policy, sample_drafts, sampling)
        if siblings:
            policy = functools.partial(drawn_siblings_tree, policy, siblings, position)
        policies.append(policy)
    torch.manual_seed(0)  # the drawn chains' draws
    feature_layers = list(draft.config.feature_layers)
    costs = calibrate_forward_costs(target, feature_layers, args.max_budget + 1)

    accepted = {(name, i): [] for name in outputs for i in range(len(grid))}
    forwards = 0
    with torch.no_grad():
        for name, rows in outputs.items():
            for row in rows:
                sequence, prompt_length = row["prompt"] + row["output"], len(row["prompt"])
                anchors, logits = level_logits(draft, target, torch.tensor([sequence]), prompt_length)
                # decode steps only: the first tree's root is the first output token (anchor prompt_length - 1)
                keep = anchors >= prompt_length - 1
                anchors, logits = anchors[keep].tolist(), logits[keep]
                if not anchors:
                    continue
                cache = DynamicCache()
                target(input_ids=torch.tensor([sequence[: anchors[0] + 1]]), cache=cache, use_cache=True)
                for anchor, anchor_logits in zip(anchors, logits):
                    context = torch.tensor(sequence[: anchor + 2])  # ends with the root
                    past_len = cache.get_seq_length()
                    logits_by_tree = {}  # trees of the same tokens share the forward (not their proposals)
                    for index, policy in enumerate(policies):
                        tree = policy(anchor_logits, context, draft.draft_to_target)
                        key = (tuple(tree.tokens.tolist()), tuple(tree.parents.tolist()))
                        if key not in logits_by_tree:
                            logits_by_tree[key], _ = forward_tree(target, tree, cache, feature_layers)
                            cache.crop(past_len - cache.get_seq_length())  # drop the tree's rows
                            forwards += 1
                        accepted[name, index].append(
                            expected_accepted(tree, logits_by_tree[key], args.temperature, budgets))
                    # the root joins the cache: the next anchor's prefix
                    target(input_ids=torch.tensor([[sequence[anchor + 1]]]), cache=cache, use_cache=True)
            print(f"replayed {name}", flush=True)

    positions = sum(len(accepted[name, 0]) for name in outputs)
    print(f"{positions} positions, {forwards} tree forwards")
    rows = settings_table(grid, accepted, budgets, costs, [args.overhead_ms / 1000] * len(grid))
    results = {"draft": args.draft, "temperature": args.temperature, "positions": positions, "budgets": budgets,
               "tree_forwards": forwards, "settings": rows}
    if args.out is not None:
        report(results, args.out)


if __name__ == "__main__":
    main()
