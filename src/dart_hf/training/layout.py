"""The prefix-shared training layout (the paper's Figure 4).

One draft forward covers many anchors. Rows: [prefix 0..T-1][block of anchor a_0 (D mask rows)]...[block a_{A-1}].
Prefix row j (features h_j, embedding of x_{j+1}) sits at position j and sees prefix rows 0..j. Mask row o
(0-based) of the block anchored at prefix row a sits at position a + 1 + o and sees prefix rows 0..a and the
rows of its own block up to itself; blocks never see each other. This is exactly what inference computes when
prefix row a is the last real row, so the trick is exact (tests check it against one forward per anchor).

Row r at depth k (0 for prefix rows, o + 1 for mask rows) predicts sequence token `anchor + 2 + k`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefixSharedLayout:
    """position_ids, depths, targets: `[R]` long (R = T + A * D); attention: `[R, R]` bool, True = may attend.

    targets[r] is the index of the sequence token row r predicts (it may lie past the sequence's end: mask it).
    row_anchor / row_block: `[R]` the prefix row each row hangs from, and its block id (-1 for prefix rows): the
    attention rule in closed form, for FlexAttention's `mask_mod`.
    """

    position_ids: torch.Tensor
    depths: torch.Tensor
    targets: torch.Tensor
    attention: torch.Tensor
    row_anchor: torch.Tensor
    row_block: torch.Tensor

    def mask_mod(self, device: torch.device | str = "cpu"):
        """FlexAttention `mask_mod(b, h, q, kv) -> bool` of the layout, from `[R]` vectors (never the `[R, R]` mask):
        a key prefix row kv is seen by row q when kv <= anchor(q); a key mask row when it is in q's block at a
        depth <= q's."""
        anchor, block, depth = (t.to(device) for t in (self.row_anchor, self.row_block, self.depths))
        num_prefix = int((self.row_block < 0).sum())

        def allowed(batch, head, query, key):
            sees_prefix = (key < num_prefix) & (key <= anchor[query])
            same_block = (block[query] >= 0) & (block[query] == block[key]) & (depth[key] <= depth[query])
            return sees_prefix | same_block

        return allowed

    def block_mask(self, device: torch.device | str = "cpu"):
        """The layout as a FlexAttention `BlockMask` (sparse blocks: its cost grows with the allowed pairs only)."""
        from torch.nn.attention.flex_attention import create_block_mask

        size = len(self.position_ids)
        return create_block_mask(self.mask_mod(device), None, None, size, size, device=device)

    def additive_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """`[1, 1, R, R]` float mask for the draft's attention: 0 where allowed, the dtype's minimum elsewhere."""
        mask = torch.zeros(self.attention.shape, dtype=dtype, device=self.attention.device)
        mask.masked_fill_(~self.attention, torch.finfo(dtype).min)
        return mask[None, None]


def prefix_shared_layout(num_prefix: int, anchors: torch.Tensor, num_masks: int) -> PrefixSharedLayout:
    """Layout for `num_prefix` prefix rows and mask blocks of `num_masks` rows at the given anchor rows `[A]`."""
    anchors = torch.as_tensor(anchors, dtype=torch.long)
    prefix = torch.arange(num_prefix)
    offsets = torch.arange(num_masks)
    block_anchor = anchors.repeat_interleave(num_masks)  # [A * D]
    block_offset = offsets.repeat(len(anchors))
    block_id = torch.arange(len(anchors)).repeat_interleave(num_masks)

    row_anchor = torch.cat([prefix, block_anchor])  # the prefix row each row's prediction hangs from
    depths = torch.cat([torch.zeros(num_prefix, dtype=torch.long), block_offset + 1])
    # prefix rows keep their own index as "block" -1; block rows are marked by their block id
    row_block = torch.cat([torch.full((num_prefix,), -1), block_id])
    is_prefix = row_block < 0
    key_prefix_index = torch.where(is_prefix, torch.cat([prefix, block_anchor]), num_prefix)

    sees_prefix = is_prefix[None, :] & (key_prefix_index[None, :] <= row_anchor[:, None])
    same_block = ~is_prefix[:, None] & (row_block[:, None] == row_block[None, :])
    causal_in_block = same_block & (depths[None, :] <= depths[:, None])
    return PrefixSharedLayout(
        position_ids=row_anchor + depths,
        depths=depths,
        targets=row_anchor + 2 + depths,
        attention=sees_prefix | causal_in_block,
        row_anchor=row_anchor,
        row_block=row_block,
    )
