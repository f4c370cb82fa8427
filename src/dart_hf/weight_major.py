"""How the verify forward multiplies a few rows on a CPU: weight first.

An `nn.Linear` computes x @ W.T for its input rows x `[M, K]`. For a handful of rows (a small tree), MKL's float32
kernels on some CPUs run that product far slower than the same product taken as (W @ x.T).T, which then costs about
what one token's forward does; from some tens of rows on the usual way is faster again (the measurements:
`docs/decoding.md`, "Measurements behind the code"; `python benchmarks/bench_tree_forward.py --parts layouts`).
Which layout is faster at each size is a property of the machine, so it is measured with the forward costs
(`dart_hf.costs.calibrate_forward_costs`), and `forward_tree` takes the weight-major product at the sizes where
it won.

Within `weight_major_linears(model)` the model's `nn.Linear` layers compute (W @ x.T).T, made contiguous (the
modeling code views the output). The products are the same sums in another order: the outputs differ by rounding,
as a tree forward's already differ from one-token forwards'. Layers of a subclass (quantized, LoRA) and layers
whose forward is already wrapped per instance (accelerate's offloading hooks) keep their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn


def weight_major_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` computed as (W @ x.T).T: x `[..., K]` -> `[..., N]`, contiguous."""
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    if layer.bias is None:
        product = torch.mm(layer.weight, rows.t())  # [N, M]
    else:
        product = torch.addmm(layer.bias.unsqueeze(1), layer.weight, rows.t())
    return product.t().contiguous().view(*x.shape[:-1], product.shape[0])


@contextmanager
def weight_major_linears(model: nn.Module) -> Iterator[None]:
    """Within this block, `model`'s plain `nn.Linear` layers compute weight first (`weight_major_linear`); each gets
    its own forward back on exit, also on an error."""
    layers = plain_linears(model)
    for layer in layers:
        layer.__dict__["forward"] = partial(weight_major_linear, layer)  # an instance attribute shadows the method
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def plain_linears(model: nn.Module) -> list[nn.Linear]:
    """`model`'s layers of exactly `nn.Linear` with floating-point weights and no per-instance forward, found once
    per model."""
    cached = getattr(model, "_dart_plain_linears", None)
    if cached is None:
        cached = [
            module
            for module in model.modules()
            if type(module) is nn.Linear and module.weight.is_floating_point() and "forward" not in module.__dict__
        ]
        model._dart_plain_linears = cached
    return cached
