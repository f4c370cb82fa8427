"""Growing a trained draft's MLP before more training, without changing what it computes.

A draft trained on a few thousand replies can stop improving because its one layer is too small rather than
because the data ran out; a wider MLP warm-started from it keeps everything it learned.
"""

from __future__ import annotations

import torch

from ..configuration_dart import DartConfig
from ..modeling_dart import DartDraftModel


@torch.no_grad()
def widen_mlp(draft: DartDraftModel, intermediate_size: int, seed: int = 0) -> DartDraftModel:
    """A copy of `draft` whose MLP has `intermediate_size` units instead of `config.intermediate_size`.

    The old units keep their weights; each new unit gets small random input weights (gate and up projections,
    `initializer_range`) and zero output weights (its column of the down projection), so the widened draft returns
    exactly the same logits until training moves the new units. The copy has the draft's dtype, device, N-gram
    table and vocabulary mapping, and is bound to the same target when the draft is bound.
    """
    old_size = draft.config.intermediate_size
    if intermediate_size <= old_size:
        raise ValueError(
            f"widen_mlp needs a larger intermediate size than the draft's {old_size}, got {intermediate_size}."
        )
    config = DartConfig.from_dict({**draft.config.to_dict(), "intermediate_size": intermediate_size})
    wide = DartDraftModel(config).to(device=draft.device, dtype=draft.dtype)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    old_state = draft.state_dict()
    for name, tensor in wide.state_dict().items():
        old = old_state[name]
        if tensor.shape == old.shape:
            tensor.copy_(old)
            continue
        if name.endswith("down_proj.weight"):  # [H, I]: the new units' outputs start at zero
            new = torch.zeros(tensor.shape, dtype=torch.float32)
            new[:, :old_size] = old.float()
        else:  # gate_proj / up_proj [I, H]: the new units' inputs start small and random
            new = torch.randn(tensor.shape, generator=generator) * config.initializer_range
            new[:old_size] = old.float()
        tensor.copy_(new)
    wide.ngram = draft.ngram
    return wide.bind(draft._bound_target[0]) if draft._bound_target else wide
