"""The DART objective: gamma-weighted KL(target || draft) over the rows of the prefix-shared layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dart_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    weights: torch.Tensor,
    draft_vocab_ids: torch.Tensor | None = None,
    num_anchors: int | None = None,
) -> torch.Tensor:
    """The weighted KL(p_target || q_draft) of the supervised rows, per anchor.

    draft_logits: `[N, V_d]`, one row per supervised layout row.
    target_logits: `[N, V]`, the target's logits for the token each row predicts (soft labels).
    weights: `[N]`, gamma ** depth for supervised rows, 0 for rows without a valid target.
    draft_vocab_ids: `[V_d]` target ids of the draft vocabulary (reduced vocabulary): the target distribution is
        restricted to them and renormalised.
    num_anchors: the number of anchors (depth-0 rows) the rows hang from; default: the rows with weight 1.
    Returns the weighted sum divided by the number of anchors, i.e. the per-anchor sum over depths of
    `sum_k gamma^k KL(p_target || q_draft)`, averaged over anchors.
    """
    if draft_vocab_ids is not None:
        target_logits = target_logits.index_select(-1, draft_vocab_ids)
    dtype = torch.promote_types(torch.promote_types(draft_logits.dtype, target_logits.dtype), torch.float32)
    target_log_probs = F.log_softmax(target_logits.to(dtype), dim=-1)
    draft_log_probs = F.log_softmax(draft_logits.to(dtype), dim=-1)
    kl = (target_log_probs.exp() * (target_log_probs - draft_log_probs)).sum(dim=-1)
    if num_anchors is None:
        num_anchors = int((weights == 1).sum())
    return (weights * kl).sum() / max(num_anchors, 1)
