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

import torch


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


class TreePolicy(Protocol):
    """Builds a tree below `root_token` from draft logits `[L, V_d]` (level l predicts depth l + 1)."""

    def __call__(
        self, draft_logits: torch.Tensor, root_token: int, draft_to_target: Callable[[torch.Tensor], torch.Tensor]
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
        self, draft_logits: torch.Tensor, root_token: int, draft_to_target: Callable[[torch.Tensor], torch.Tensor]
    ) -> Tree:
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
