"""Verification of a token tree by the target: one forward pass, greedy acceptance, KV-cache compaction.

Verification knows nothing of how the tree was built.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, PreTrainedModel
from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

from . import kernels, sliding_window
from .attention import grouped_query_sdpa
from .features import forward_with_features
from .tree import Tree
from .weight_major import weight_major_linears


def tree_attention_mask(tree: Tree, past_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive float mask `[1, 1, N + 1, past_len + N + 1]`: every node sees the whole prefix, its ancestors and
    itself. It must be float in the model dtype: eager attention adds a bool mask as 0/1 (silently wrong)."""
    return kernels.tree_mask(tree.parents.to(device), past_len, dtype)


@torch.no_grad()
def forward_tree(
    target: PreTrainedModel,
    tree: Tree,
    cache: Cache,
    feature_layers: list[int],
    rows: int | None = None,
    weight_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the target once over all tree nodes, appending them to `cache`.

    rows: run the forward with this many rows when it is more than the tree's N + 1 nodes (`ForwardCosts.rows`:
    where a larger matmul is faster); the extra rows are children of the root that no node attends to, so the
    nodes' outputs are unchanged, and `compact_cache` drops their cache entries with the rejected nodes'.
    weight_major: take the target's linear layers' products weight first (`dart_hf.weight_major`: on a CPU, faster
    for a few rows; `ForwardCosts.weight_major` says where).
    Returns logits `[N + 1, V]` and features `[N + 1, 3H]` (the feature layers concatenated, in order).
    """
    nodes = len(tree)
    if rows is not None and rows > nodes:
        tree = Tree.from_parents(
            torch.cat([tree.tokens, tree.tokens[:1].expand(rows - nodes)]), tree.parents.tolist() + [0] * (rows - nodes)
        )
    device = target.device
    past_len = cache.get_seq_length()
    if target.config._attn_implementation == "dart_tree":  # the tree travels as packed bits, no dense mask
        attention = {"dart_tree": kernels.TreeAttentionMetadata.from_parents(tree.parents.to(device), past_len)}
    else:  # one mask, or one per layer type where some layers attend within a sliding window
        mask = tree_attention_mask(tree, past_len, target.dtype, device)
        attention = {"attention_mask": sliding_window.attention_masks(mask, tree, cache, past_len)}
    layout = weight_major_linears(target) if weight_major else contextlib.nullcontext()
    # on a CPU, sdpa without copying the cache per query head; sliding-window layers keep the keys the tree's
    # rejected nodes would push out of their window, until `compact_cache`
    with grouped_query_sdpa(target), layout, sliding_window.keeping_every_key(cache):
        outputs, features = forward_with_features(
            target,
            feature_layers,
            input_ids=tree.tokens.to(device).unsqueeze(0),
            position_ids=(tree.depths.to(device) + past_len).unsqueeze(0),
            cache=cache,
            use_cache=True,
            **attention,
        )
    return outputs.logits[0, :nodes], features[0, :nodes]


@dataclass
class Acceptance:
    """The outcome of verifying one tree.

    path: accepted node indices from the root (always node 0) down.
    tokens: the committed tokens, one per path node: the tokens of path[1:], then the bonus token.
    scores / logits: per committed token, the processed scores and raw logits `[1, V]` (float32), as vanilla
        `generate` records them.
    """

    path: list[int]
    tokens: list[int]
    scores: list[torch.Tensor]
    logits: list[torch.Tensor]


def accept(
    tree: Tree,
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    logits_processor: LogitsProcessorList,
    do_sample: bool = False,
) -> Acceptance:
    """Walk down from the root, committing one token per visited node, while that token is a child of the node.

    Greedy: the token is the target's argmax. Sampling: multi-draft rejection sampling (`sample_child`), so the
    committed tokens follow exactly the target's distribution.

    input_ids `[1, S]`: the committed sequence, ending with the root token. Each node's scores go through the
    logits processors with exactly the prefix that vanilla decoding would have at that point, so
    sequence-dependent processors (repetition penalty, ...) and the warpers of sampling (temperature, top-k,
    top-p, ...) stay lossless.
    """
    children = tree.children()
    node, prefix = 0, input_ids
    path, tokens, scores, raw_logits = [0], [], [], []
    while True:
        node_logits = logits[node : node + 1].to(dtype=torch.float32, copy=True)
        node_scores = logits_processor(prefix, node_logits)
        if do_sample:
            token, child = sample_child(node_scores[0], children[node], tree.proposals)
        else:
            token = int(node_scores.argmax(dim=-1))
            child = children[node].get(token)
        tokens.append(token)
        scores.append(node_scores)
        raw_logits.append(node_logits)
        if child is None:
            return Acceptance(path, tokens, scores, raw_logits)
        path.append(child)
        node = child
        prefix = torch.cat([prefix, prefix.new_tensor([[token]])], dim=-1)


def choose_token(scores: torch.Tensor, do_sample: bool) -> int:
    """The next token from processed scores `[V]`: sampled from their softmax, or the argmax (greedy)."""
    if do_sample:
        return int(torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1))
    return int(scores.argmax())


def append_token(sequence, token: int, token_scores: torch.Tensor, token_logits: torch.Tensor, config) -> torch.Tensor:
    """`sequence.input_ids` `[1, S]` with `token` appended; its processed scores and raw logits `[1, V]` go to
    `sequence.scores` / `sequence.logits` where `config` (a `GenerationConfig`) returns them."""
    if config.return_dict_in_generate and config.output_scores:
        sequence.scores.append(token_scores)
    if config.return_dict_in_generate and config.output_logits:
        sequence.logits.append(token_logits)
    return torch.cat([sequence.input_ids, sequence.input_ids.new_tensor([[token]])], dim=-1)


def sample_child(
    scores: torch.Tensor, children: dict[int, int], proposals: dict[int, torch.Tensor] | None = None
) -> tuple[int, int | None]:
    """Draw the next token from p = softmax(scores) `[V]`, trying the drafted children first, in order.

    A child drawn at random from a distribution q (`proposals[child]`, `[V]`) is accepted with probability
    min(1, p(x) / q(x)); on rejection p becomes (p - q)+, renormalised (speculative sampling). Any other child is a
    deterministic draft (q(x) = 1): accepted with probability p(x), on rejection p(x) is set to 0 and p
    renormalised. If every child is rejected, the token is sampled from what is left of p. Each stage draws
    exactly from the p it is given, so the token's distribution is exactly the target's. Returns (token, child
    node or None).
    """
    probs = torch.softmax(scores.float(), dim=-1)
    for token, child in children.items():
        proposal = proposals.get(child) if proposals else None
        if proposal is None:
            if float(torch.rand(())) < float(probs[token]):
                return token, child
            probs[token] = 0
        else:
            proposal = proposal.to(device=probs.device, dtype=probs.dtype)
            if float(torch.rand(())) * float(proposal[token]) < float(probs[token]):
                return token, child
            probs = (probs - proposal).clamp_(min=0)
        remaining = probs.sum()
        if remaining <= 0:  # p was that draft's q up to rounding: it could not have been rejected
            return token, child
        probs /= remaining
    return int(torch.multinomial(probs, num_samples=1)), None


def compact_cache(cache: Cache, past_len: int, path: list[int]) -> None:
    """Keep, after the first `past_len` cached positions, only the tree nodes in `path` (increasing indices).

    The accepted rows move into place in each layer's `[B, H_kv, T, D]` keys and values; the rest is cut off.
    Sliding-window layers, which kept every key through the tree forward, are trimmed back to their window
    (`sliding_window.compact_sliding_layer`).
    """
    new_len = past_len + len(path)
    full_layers = [layer for layer in cache.layers if not isinstance(layer, DynamicSlidingWindowLayer)]
    for layer in cache.layers:
        if isinstance(layer, DynamicSlidingWindowLayer):
            sliding_window.compact_sliding_layer(layer, past_len, path)
    in_place = 0  # the leading path nodes that already sit where they belong (a chain's whole path) move nowhere
    while in_place < len(path) and path[in_place] == in_place:
        in_place += 1
    if in_place < len(path) and full_layers:
        device = full_layers[0].keys.device
        kernels.compact_kv(
            [tensor for layer in full_layers for tensor in (layer.keys, layer.values)],
            past_len + in_place,
            torch.tensor([node - in_place for node in path[in_place:]], dtype=torch.long, device=device),
        )
    for layer in full_layers:
        layer.keys = layer.keys[:, :, :new_len]
        layer.values = layer.values[:, :, :new_len]
