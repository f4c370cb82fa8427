"""Token trees and the policies that build one from the draft's per-level logits.

A tree has N + 1 nodes; node 0 is the root (the target's own next token, already certain). Every other node
holds a drafted token, its parent's index (always smaller than its own) and its depth below the root.
Tree policies know nothing of the target: they map `[L, V_d]` draft logits to a `Tree`.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .kernels.tree_mask import ancestor_matrix
from .ngram import NgramTable
from .options import DecodingOptions, check_positive_int


def check_sizes(policy, *names: str) -> None:
    """`check_positive_int` on the named size fields of a policy dataclass, each reported as `tree_<name>` with its
    default."""
    defaults = {policy_field.name: policy_field.default for policy_field in dataclasses.fields(policy)}
    for name in names:
        check_positive_int(f"tree_{name}", getattr(policy, name), defaults[name])


@dataclass
class Tree:
    """tokens, parents, depths: `[N + 1]` long tensors; parents[0] = -1, depths[0] = 0, parents[i] < i.

    ranks: optional `[N + 1]` long, the order in which the policy picked each node by score (root 0, best drafted
    node 1, ...): the tree a budget of m would have built is the nodes of rank <= m. None means node order.
    proposals: for nodes whose token was drawn at random, node index -> the distribution `[V]` (target
    vocabulary) it was drawn from, which sampling verification needs; other nodes are deterministic drafts.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor | None = None
    proposals: dict[int, torch.Tensor] | None = None

    @classmethod
    def from_parents(cls, tokens: torch.Tensor | list[int], parents: torch.Tensor | list[int]) -> Tree:
        """Build a tree from tokens and parent indices (node 0 is the root, with parent -1)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        parent_list = torch.as_tensor(parents, dtype=torch.long).tolist()
        if len(parent_list) != len(tokens) or not parent_list or parent_list[0] != -1:
            raise ValueError("A tree needs one parent per token and node 0 as the root (parent -1).")
        depths = [0] * len(parent_list)
        for node, parent in enumerate(parent_list[1:], start=1):
            if not 0 <= parent < node:
                raise ValueError(f"Node {node} has parent {parent}; every parent must come before its child.")
            depths[node] = depths[parent] + 1
        return cls(tokens, torch.tensor(parent_list, dtype=torch.long), torch.tensor(depths, dtype=torch.long))

    @classmethod
    def chain(cls, tokens: torch.Tensor | list[int]) -> Tree:
        """A tree with one node per level: `tokens[0]` is the root, each later token the child of the one before."""
        return cls.from_parents(tokens, list(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def ancestor_mask(self) -> torch.Tensor:
        """`[N + 1, N + 1]` bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        return ancestor_matrix(self.parents)

    def children(self) -> list[dict[int, int]]:
        """For each node, its children as {token: node index} (the first node wins for a repeated token)."""
        result: list[dict[int, int]] = [{} for _ in range(len(self))]
        for node, (parent, token) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if parent >= 0:
                result[parent].setdefault(token, node)
        return result

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        path = [node]
        while path[-1] != 0:
            path.append(int(self.parents[path[-1]]))
        return path[::-1]


def top_k_per_row(logits: torch.Tensor, k: int, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(logits, k)` for `[L, V]` logits, about 2x faster on a CPU for large V: take the k chunks (of
    `chunk` columns) with the largest maxima, then the top k inside them. Exact: a chunk whose maximum is not among
    the k largest chunk maxima has k larger values elsewhere, so it holds none of the top k."""
    rows, vocab = logits.shape
    if vocab < 4 * k * chunk:
        return logits.topk(k, dim=-1)
    padding = (-vocab) % chunk
    padded = torch.nn.functional.pad(logits, (0, padding), value=float("-inf")) if padding else logits
    chunks = padded.view(rows, -1, chunk)
    best_chunks = chunks.amax(dim=-1).topk(k, dim=-1).indices  # [L, k]
    candidates = chunks.gather(1, best_chunks[..., None].expand(-1, -1, chunk)).reshape(rows, -1)
    values, positions = candidates.topk(k, dim=-1)
    return values, best_chunks.gather(1, positions // chunk) * chunk + positions % chunk


class TreePolicy(Protocol):
    """Builds a tree from draft logits `[L, V_d]` (level l predicts depth l + 1).

    context: `[S]` the committed token ids; the last one is the root. draft_to_target maps draft ids to target ids.
    budget: nodes below the root for this call (default: the policy's own `budget`).
    """

    def __call__(
        self,
        draft_logits: torch.Tensor,
        context: torch.Tensor,
        draft_to_target: Callable[[torch.Tensor], torch.Tensor],
        budget: int | None = None,
    ) -> Tree: ...


@dataclass
class TopKTreePolicy:
    """The plain tree: each level offers its `top_k` most likely draft tokens, independently of the path above;
    a node's score is the sum of its path's log-probabilities, and the `budget` best nodes are kept.

    Because every log-probability is <= 0, a child never outscores its parent, so the kept set is prefix-closed.
    The best nodes are enumerated lazily (each popped node offers its best child and its next sibling), so the
    cost is O(budget log budget) and independent of the vocabulary after the per-level top-k.
    """

    budget: int = DecodingOptions.budget
    top_k: int = DecodingOptions.top_k

    def __post_init__(self):
        check_sizes(self, "budget", "top_k")

    def __call__(
        self,
        draft_logits: torch.Tensor,
        context: torch.Tensor,
        draft_to_target: Callable[[torch.Tensor], torch.Tensor],
        budget: int | None = None,
    ) -> Tree:
        budget = self.budget if budget is None else budget
        root_token = int(context[-1])
        num_levels = draft_logits.shape[0]
        top_k = min(self.top_k, draft_logits.shape[-1])
        log_probs, draft_ids = torch.log_softmax(draft_logits.float(), dim=-1).topk(top_k, dim=-1)
        level_tokens = draft_to_target(draft_ids).tolist()
        level_scores = log_probs.tolist()

        tokens, parents = [root_token], [-1]
        # heap entries: (-score, tie-breaker, parent node, level, rank within the level's top-k, parent score)
        heap = [(-level_scores[0][0], 0, 0, 0, 0, 0.0)]
        counter = 1
        while heap and len(tokens) <= budget:
            neg_score, _, parent, level, rank, parent_score = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(level_tokens[level][rank])
            parents.append(parent)
            if rank + 1 < top_k:
                sibling_score = parent_score + level_scores[level][rank + 1]
                heapq.heappush(heap, (-sibling_score, counter, parent, level, rank + 1, parent_score))
                counter += 1
            if level + 1 < num_levels:
                child_score = -neg_score + level_scores[level + 1][0]
                heapq.heappush(heap, (-child_score, counter, node, level + 1, 0, -neg_score))
                counter += 1
        tree = Tree.from_parents(tokens, parents)
        tree.ranks = torch.arange(len(tokens))  # nodes are popped best first
        return tree


@dataclass
class BeamSearchTreePolicy:
    """DART's continuity-aware tree search (beams scored by the draft's logits and the N-gram table), vectorised
    over beams and candidates.

    Each level l offers its `top_k` draft tokens; `beam_width` beams are extended level by level and every
    extension is a candidate node, scored by the sum over its levels of
    `(l + 1) ** -level_decay * (logit_decay ** l * log p_draft + ngram_weight * log p_ngram)`
    (the N-gram term skipped at level 0 unless `ngram_at_root`, and everywhere when there is no table; log 0 is
    read as log 1e-10). The N-gram context is the last `order - 1` tokens of committed text + path. Beams that end
    in EOS are ranked after all others and not extended. The `budget` best candidates are kept; the kept set is
    prefix-closed (ties put parents first, and any node whose parent was not kept is replaced by the next best).

    p_draft is the softmax over each level's top_k logits (reference code), or over the whole draft vocabulary
    with `full_softmax` (paper).
    """

    budget: int = DecodingOptions.budget
    top_k: int = DecodingOptions.top_k
    beam_width: int = DecodingOptions.beam_width
    level_decay: float = DecodingOptions.level_decay
    logit_decay: float = DecodingOptions.logit_decay
    ngram_weight: float = DecodingOptions.ngram_weight
    ngram_at_root: bool = DecodingOptions.ngram_at_root
    full_softmax: bool = DecodingOptions.full_softmax
    ngram: NgramTable | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        check_sizes(self, "budget", "top_k", "beam_width")

    def __call__(
        self,
        draft_logits: torch.Tensor,
        context: torch.Tensor,
        draft_to_target: Callable[[torch.Tensor], torch.Tensor],
        budget: int | None = None,
    ) -> Tree:
        budget = self.budget if budget is None else budget
        # a tree of `budget` nodes reaches depth `budget` at most, and each kept node's parent is among the `budget`
        # best of its level (the kept set is prefix-closed): fewer levels and beams than that build the same tree
        logits = draft_logits[:budget].float()
        beam_width = min(self.beam_width, budget)
        top_k = min(self.top_k, logits.shape[-1])
        top_logits, draft_ids = top_k_per_row(logits, top_k)
        if self.full_softmax:
            log_probs = top_logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        else:
            log_probs = torch.log_softmax(top_logits, dim=-1)
        level_tokens = draft_to_target(draft_ids).cpu().numpy()  # [L, K]
        num_levels = level_tokens.shape[0]
        levels = np.arange(num_levels)[:, None]
        level_weights = (levels + 1.0) ** -self.level_decay  # [L, 1]
        draft_terms = level_weights * self.logit_decay**levels * np.maximum(log_probs.cpu().numpy(), np.log(1e-10))
        ngram_weights = (level_weights * self.ngram_weight)[:, 0]
        level_is_eos = np.isin(level_tokens, np.array(self.eos_token_ids, dtype=np.int64))  # [L, K]
        context_len = self.ngram.order - 1 if self.ngram is not None else 1
        committed = context[-context_len:].tolist()
        start_context = np.array([[-1] * (context_len - len(committed)) + committed], dtype=np.int64)  # [1, C]

        use_ngram = self.ngram is not None
        if use_ngram:
            # log P(c | previous token) for every pair the search can meet, in one batched query: the root before
            # level 0, and each of level l - 1's candidates before level l
            previous = np.concatenate([start_context[0, -1:], level_tokens[:-1].ravel()])
            following = np.concatenate([level_tokens[:1], np.repeat(level_tokens[1:], top_k, axis=0)])
            short_probs = self.ngram.probabilities(previous[:, None], following)
            short_log = np.log(np.maximum(short_probs, 1e-10))
            short_root, short_levels = short_log[:1], short_log[1:].reshape(num_levels - 1, top_k, top_k)
            short_seen = (short_probs[1:] > 0).reshape(num_levels - 1, top_k, top_k)

        # candidate nodes, one block per level: scores [B * K] and the pool indices of their parents (-1 = root)
        pool_scores, pool_parents = [], []
        beam_nodes = np.array([-1])
        beam_ranks = np.zeros(1, dtype=np.int64)  # each beam's last token, as a rank in its level's top-k
        beam_scores = np.zeros(1)
        beam_contexts = start_context
        pool_size = 0
        for level in range(num_levels):
            scores = beam_scores[:, None] + draft_terms[level]  # [B, K]
            if use_ngram and (level > 0 or self.ngram_at_root):
                if level == 0:
                    ngram_log, seen = short_root, short_probs[:1] > 0
                else:
                    ngram_log, seen = short_levels[level - 1][beam_ranks], short_seen[level - 1][beam_ranks]
                if self.ngram.order > 2 and seen.any():
                    # a longer context can only hold c if the previous token alone does: ask for those only
                    asked = np.where(seen, level_tokens[level], -1)
                    longer = self.ngram.probabilities(beam_contexts, asked, min_context=2)
                    ngram_log = np.where(longer > 0, np.log(np.maximum(longer, 1e-10)), ngram_log)
                scores = scores + ngram_weights[level] * ngram_log
            flat_scores = scores.ravel()
            pool_scores.append(flat_scores)
            pool_parents.append(np.repeat(beam_nodes, top_k))
            # the best beams; beams that end in EOS are ranked after all others and cannot be extended
            ends_in_eos = np.tile(level_is_eos[level], beam_nodes.size)
            best = np.argsort(np.where(ends_in_eos, np.inf, -flat_scores), kind="stable")[: beam_width]
            best = best[~ends_in_eos[best]]
            if best.size == 0 or level + 1 == num_levels:
                break
            beam_nodes = pool_size + best
            beam_ranks = best % top_k
            beam_scores = flat_scores[best]
            beam_contexts = np.concatenate([beam_contexts[best // top_k, 1:], level_tokens[level, beam_ranks, None]], 1)
            pool_size += flat_scores.size

        scores = np.concatenate(pool_scores)
        parents = np.concatenate(pool_parents)
        block_sizes = [block.size for block in pool_scores]
        depths = np.repeat(np.arange(1, len(block_sizes) + 1), block_sizes)
        tokens = np.concatenate([np.tile(level_tokens[d], size // top_k) for d, size in enumerate(block_sizes)])
        budget = min(budget, scores.size)
        best = np.argpartition(-scores, budget - 1)[:budget] if budget < scores.size else np.arange(scores.size)
        kept = best[np.lexsort((depths[best], -scores[best]))]
        kept_set = np.zeros(scores.size + 1, dtype=bool)  # index -1 (the root) maps to the last slot
        kept_set[-1] = True
        kept_set[kept] = True
        if not kept_set[parents[kept]].all():  # a tie broke prefix closure: keep the best nodes whose parent is kept
            kept_set[:-1] = False
            kept = []
            for node in np.lexsort((depths, -scores)):
                if kept_set[parents[node]]:
                    kept.append(node)
                    kept_set[node] = True
                    if len(kept) == budget:
                        break
            kept = np.array(kept, dtype=np.int64)

        kept = kept[np.lexsort((-scores[kept], depths[kept]))]  # by depth, best first within a depth
        new_index = np.full(scores.size + 1, -1, dtype=np.int64)
        new_index[-1] = 0
        new_index[kept] = np.arange(1, kept.size + 1)
        ranks = np.zeros(kept.size + 1, dtype=np.int64)
        ranks[1 + np.lexsort((depths[kept], -scores[kept]))] = np.arange(1, kept.size + 1)  # best first, parents first
        return Tree(
            torch.from_numpy(np.concatenate([[int(context[-1])], tokens[kept]]).astype(np.int64)),
            torch.from_numpy(np.concatenate([[-1], new_index[parents[kept]]])),
            torch.from_numpy(np.concatenate([[0], depths[kept]]).astype(np.int64)),
            torch.from_numpy(ranks),
        )


@dataclass
class SampledChainPolicy:
    """For sampling (T > 0): a chain whose token at level l is drawn from the draft's level-l distribution at
    `temperature`, q_l = softmax(logits_l / temperature), each node keeping q_l as its proposal.

    Sampling verification then accepts a drawn token x with probability min(1, p(x) / q(x)) and otherwise draws
    from the residual (p - q)+ (speculative sampling), which commits exactly the target's distribution p for any
    q. A drawn token is accepted with probability sum_x min(p(x), q(x)) where a deterministic top-1 draft has
    p(top-1): where the target's distribution is spread (chat text at T=1) the drawn one holds more often.

    The draft's levels are marginals, blind to the tokens drawn above them; with an N-gram table, levels below the
    first draw from their `top_k` tokens scored as the beam search scores them, logits / temperature +
    `ngram_weight` * log P_ngram(token | the last tokens of text + chain) (log 0 read as log 1e-10), so that the
    chain stays continuous. `vocab_size` is the target's; the chain is at most one node per drafted level long.
    """

    budget: int = 8
    temperature: float = DecodingOptions.sample_drafts
    vocab_size: int = 0
    ngram: NgramTable | None = None
    ngram_weight: float = DecodingOptions.ngram_weight
    top_k: int = DecodingOptions.top_k

    def __post_init__(self):
        check_sizes(self, "budget", "top_k")

    def __call__(
        self,
        draft_logits: torch.Tensor,
        context: torch.Tensor,
        draft_to_target: Callable[[torch.Tensor], torch.Tensor],
        budget: int | None = None,
    ) -> Tree:
        budget = self.budget if budget is None else budget
        num_levels = min(budget, draft_logits.shape[0])
        scaled = draft_logits[:num_levels].float() / self.temperature  # [L, V_d]
        draft_ids = torch.arange(scaled.shape[-1], device=scaled.device)
        target_ids = draft_to_target(draft_ids)  # [V_d]
        committed = context[-(self.ngram.order - 1) :].tolist() if self.ngram is not None else []
        tokens = [int(context[-1])]
        proposals = {}
        for level in range(num_levels):
            candidates, scores = draft_ids, scaled[level]  # the draft's own distribution: every draft token
            if self.ngram is not None and level > 0:  # its top-k, weighted by continuity with the chain so far
                scores, candidates = scores.topk(min(self.top_k, scores.shape[-1]))
                ngram_context = np.array([(committed + tokens[1:])[-(self.ngram.order - 1) :]])
                ngram_probs = self.ngram.probabilities(ngram_context, target_ids[candidates].cpu().numpy()[None])
                log_ngram = torch.from_numpy(np.log(np.maximum(ngram_probs[0], 1e-10))).to(scores.device)
                scores = scores + self.ngram_weight * log_ngram
            probs = torch.softmax(scores, dim=-1)
            drawn = int(candidates[torch.multinomial(probs, num_samples=1)])
            proposal = probs.new_zeros(self.vocab_size)
            proposal[target_ids[candidates]] = probs
            tokens.append(int(target_ids[drawn]))
            proposals[level + 1] = proposal
        tree = Tree.chain(tokens)
        tree.ranks = torch.arange(num_levels + 1)
        tree.proposals = proposals
        return tree


def graft(tree: Tree, chain: list[int]) -> Tree:
    """`tree` with a context-lookup `chain` (the tokens after the root) hung from its root: along the drafted nodes
    that already carry the chain's leading tokens, then as new nodes (ranked after every drafted one)."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    children = tree.children()
    node, start = 0, 0
    while start < len(chain) and chain[start] in children[node]:
        node = children[node][chain[start]]
        start += 1
    for token in chain[start:]:
        tokens.append(token)
        parents.append(node)
        node = len(tokens) - 1
    grafted = Tree.from_parents(tokens, parents)
    if tree.ranks is not None:
        extra = torch.arange(len(tokens) - len(tree), dtype=tree.ranks.dtype) + int(tree.ranks.max()) + 1
        grafted.ranks = torch.cat([tree.ranks, extra])
    grafted.proposals = tree.proposals
    return grafted
