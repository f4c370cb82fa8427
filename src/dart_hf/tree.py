"""Token trees and the policies that build one from the draft's per-level logits.

A tree has N + 1 nodes; node 0 is the root (the target's own next token, already certain). Every other node
holds a drafted token, its parent's index (always smaller than its own) and its depth below the root.
Tree policies know nothing of the target: they map `[L, V_d]` draft logits to a `Tree`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .ngram import NgramTable


@dataclass
class Tree:
    """tokens, parents, depths: `[N + 1]` long tensors; parents[0] = -1, depths[0] = 0, parents[i] < i."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor

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

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def ancestor_mask(self) -> torch.Tensor:
        """`[N + 1, N + 1]` bool: entry (i, j) is True when node j is node i or one of its ancestors."""
        size = len(self)
        mask = torch.eye(size, dtype=torch.bool)
        rows = torch.arange(size)
        ancestor = self.parents.clone()
        for _ in range(int(self.depths.max())):
            has_ancestor = ancestor >= 0
            mask[rows[has_ancestor], ancestor[has_ancestor]] = True
            ancestor = torch.where(has_ancestor, self.parents[ancestor.clamp(min=0)], ancestor)
        return mask

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
    """

    def __call__(
        self, draft_logits: torch.Tensor, context: torch.Tensor, draft_to_target: Callable[[torch.Tensor], torch.Tensor]
    ) -> Tree: ...


@dataclass
class TopKTreePolicy:
    """The plain tree: each level offers its `top_k` most likely draft tokens, independently of the path above;
    a node's score is the sum of its path's log-probabilities, and the `budget` best nodes are kept.

    Because every log-probability is <= 0, a child never outscores its parent, so the kept set is prefix-closed.
    The best nodes are enumerated lazily (each popped node offers its best child and its next sibling), so the
    cost is O(budget log budget) and independent of the vocabulary after the per-level top-k.
    """

    budget: int = 60
    top_k: int = 25

    def __call__(
        self, draft_logits: torch.Tensor, context: torch.Tensor, draft_to_target: Callable[[torch.Tensor], torch.Tensor]
    ) -> Tree:
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
        while heap and len(tokens) <= self.budget:
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
        return Tree.from_parents(tokens, parents)


@dataclass
class BeamSearchTreePolicy:
    """DART's continuity-aware tree search (SPEC section 4), vectorised over beams and candidates.

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

    budget: int = 60
    top_k: int = 25
    beam_width: int = 20
    level_decay: float = 0.7
    logit_decay: float = 0.9
    ngram_weight: float = 0.5
    ngram_at_root: bool = False
    full_softmax: bool = False
    ngram: NgramTable | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __call__(
        self, draft_logits: torch.Tensor, context: torch.Tensor, draft_to_target: Callable[[torch.Tensor], torch.Tensor]
    ) -> Tree:
        logits = draft_logits.float()
        top_k = min(self.top_k, logits.shape[-1])
        top_logits, draft_ids = top_k_per_row(logits, top_k)
        if self.full_softmax:
            log_probs = top_logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        else:
            log_probs = torch.log_softmax(top_logits, dim=-1)
        level_tokens = draft_to_target(draft_ids).cpu().numpy()  # [L, K]
        level_log_probs = np.maximum(log_probs.cpu().numpy().astype(np.float64), np.log(1e-10))
        num_levels = level_tokens.shape[0]
        context_len = self.ngram.order - 1 if self.ngram is not None else 1
        committed = context[-context_len:].tolist()
        start_context = np.array([[-1] * (context_len - len(committed)) + committed], dtype=np.int64)  # [1, C]
        eos = np.array(self.eos_token_ids, dtype=np.int64)

        # every candidate node, level by level: scores, parents (-1 = root), tokens, depths
        pool_scores, pool_parents, pool_tokens, pool_depths = [], [], [], []
        beam_nodes = np.array([-1])  # pool indices of the current beams (the root to start)
        beam_scores = np.zeros(1)
        beam_contexts = start_context
        pool_size = 0
        for level in range(num_levels):
            weight = (level + 1) ** -self.level_decay
            tokens = np.broadcast_to(level_tokens[level], (beam_nodes.size, top_k))
            term = self.logit_decay**level * level_log_probs[level][None, :]
            if self.ngram is not None and (level > 0 or self.ngram_at_root):
                ngram_probs = self.ngram.probabilities(beam_contexts, tokens)
                term = term + self.ngram_weight * np.log(np.maximum(ngram_probs, 1e-10))
            scores = beam_scores[:, None] + weight * term  # [B, K]
            pool_scores.append(scores.ravel())
            pool_parents.append(np.repeat(beam_nodes, top_k))
            pool_tokens.append(tokens.ravel())
            pool_depths.append(np.full(scores.size, level + 1))
            flat_scores, flat_tokens = scores.ravel(), tokens.ravel()
            ends_in_eos = (flat_tokens[:, None] == eos[None, :]).any(axis=1)
            best = np.lexsort((-flat_scores, ends_in_eos))[: self.beam_width]
            best = best[~ends_in_eos[best]]  # beams that end in EOS cannot be extended
            if best.size == 0:
                break
            beam_rows = best // top_k
            beam_nodes = pool_size + best
            beam_scores = flat_scores[best]
            beam_contexts = np.concatenate([beam_contexts[beam_rows, 1:], flat_tokens[best, None]], axis=1)
            pool_size += scores.size

        scores = np.concatenate(pool_scores)
        parents = np.concatenate(pool_parents)
        depths = np.concatenate(pool_depths)
        tokens = np.concatenate(pool_tokens)
        ranked = np.lexsort((depths, -scores))
        kept = ranked[: self.budget]
        kept_set = np.zeros(scores.size + 1, dtype=bool)  # index -1 (the root) maps to the last slot
        kept_set[-1] = True
        kept_set[kept] = True
        if not kept_set[parents[kept]].all():  # a tie broke prefix closure: keep the best nodes whose parent is kept
            kept_set[:-1] = False
            kept = []
            for node in ranked:
                if kept_set[parents[node]]:
                    kept.append(node)
                    kept_set[node] = True
                    if len(kept) == self.budget:
                        break
            kept = np.array(kept, dtype=np.int64)

        kept = kept[np.lexsort((-scores[kept], depths[kept]))]  # by depth, best first within a depth
        new_index = np.full(scores.size + 1, -1, dtype=np.int64)
        new_index[-1] = 0
        new_index[kept] = np.arange(1, kept.size + 1)
        tree_tokens = np.concatenate([[int(context[-1])], tokens[kept]])
        tree_parents = np.concatenate([[-1], new_index[parents[kept]]])
        tree_depths = np.concatenate([[0], depths[kept]])
        return Tree(
            torch.from_numpy(tree_tokens.astype(np.int64)),
            torch.from_numpy(tree_parents),
            torch.from_numpy(tree_depths.astype(np.int64)),
        )
