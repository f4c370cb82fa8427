"""Reading the target's feature layers (the hidden states the draft consumes) during the target's own forward.

`output_hidden_states` would give them too, but Transformers serves it through forward hooks that it installs
on every decoder layer and every attention module the first time it is asked, and never removes: from then on
each forward of that model object pays a Python hook call per layer and attention module, vanilla `generate`
included (a cost a small model's one-token forward on a CPU notices: `docs/decoding.md`, "Measurements behind
the code"). Here a forward hook goes on just the decoder layers
whose outputs are needed, for the duration of one forward. Models whose decoder layers cannot be found this way
fall back to `output_hidden_states`.

Indices follow `output_hidden_states`: 0 is the embedding output, i is the output of decoder layer i - 1, and
the last (num_hidden_layers) is the final normed state.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils.output_capturing import OutputRecorder


def forward_with_features(
    target: PreTrainedModel, feature_layers: list[int], **inputs
) -> tuple[object, torch.Tensor]:
    """`target(**inputs)` plus the hidden states `feature_layers` select, concatenated in that order:
    returns (the model output, features `[B, T, len(feature_layers) * H]`)."""
    layers = decoder_layers(target)
    num_states = len(layers) + 1 if layers is not None else None
    hookable = layers is not None and all(0 < index % num_states < len(layers) for index in feature_layers)
    if not hookable:  # the embedding output or the final normed state: Transformers' own capture
        outputs = target(**inputs, output_hidden_states=list(feature_layers))
        return outputs, torch.cat([outputs.hidden_states[index] for index in feature_layers], dim=-1)

    captured: dict[int, torch.Tensor] = {}

    def keeper(position: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor | tuple) -> None:
            captured[position] = output[0] if isinstance(output, tuple) else output

        return hook

    wanted = sorted({index % num_states for index in feature_layers})
    handles = [layers[index - 1].register_forward_hook(keeper(index)) for index in wanted]
    try:
        outputs = target(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs, torch.cat([captured[index % num_states] for index in feature_layers], dim=-1)


def takes_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether `model.forward` can compute logits for some positions only (`logits_to_keep`)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def decoder_layers(target: PreTrainedModel) -> list[nn.Module] | None:
    """The target's decoder layers in order, found as Transformers' `output_hidden_states` finds them (the modules of
    the class the base model records hidden states from), or None when the model does not declare one class."""
    cached = getattr(target, "_dart_decoder_layers", None)
    if cached is not None:
        return cached or None
    spec = getattr(target.base_model, "can_record_outputs", {}).get("hidden_states")
    if isinstance(spec, OutputRecorder):
        plain = spec.index == 0 and spec.layer_name is None and spec.capture_initial_hidden_state
        spec = spec.target_class if plain else None
    layers = []
    if isinstance(spec, type):
        layers = [module for module in target.modules() if isinstance(module, spec)]
    num_layers = getattr(target.config.get_text_config(), "num_hidden_layers", None)
    if len(layers) != num_layers:
        layers = []
    target._dart_decoder_layers = layers  # found once per model; [] marks "fall back"
    return layers or None
