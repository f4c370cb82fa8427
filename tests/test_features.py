import pytest
import torch
from transformers import DynamicCache

from _helpers import CONFIG_CLASSES, tiny_target
from dart_hf.features import decoder_layers, forward_with_features


def _reference_features(target, layers, input_ids):
    outputs = target(input_ids=input_ids, output_hidden_states=True)
    return torch.cat([outputs.hidden_states[index] for index in layers], dim=-1)


@pytest.mark.parametrize("arch", sorted(CONFIG_CLASSES))
@pytest.mark.parametrize("layers", [[1, 3, 5], [2, 2, -3], [0, 3, 6]])
@torch.no_grad()
def test_features_equal_output_hidden_states(arch, layers):
    """[0, 3, 6] holds the embedding output and the final normed state, which take the `output_hidden_states`
    fallback; the others are read by hooks on the decoder layers."""
    target = tiny_target(arch)
    input_ids = torch.randint(1, 128, (2, 9))
    outputs, features = forward_with_features(target, layers, input_ids=input_ids)
    assert features.shape == (2, 9, 3 * target.config.hidden_size)
    torch.testing.assert_close(features, _reference_features(target, layers, input_ids), rtol=0, atol=0)
    torch.testing.assert_close(outputs.logits, target(input_ids=input_ids).logits, rtol=0, atol=0)


@torch.no_grad()
def test_hooks_are_removed_and_transformers_capture_is_not_installed():
    """The point of the module: after any number of calls the target carries no hooks, so every later forward
    (vanilla `generate` included) runs as fast as before DART touched the model."""
    target = tiny_target()
    cache = DynamicCache(config=target.config)
    forward_with_features(target, [1, 3, 4], input_ids=torch.randint(1, 128, (1, 5)), cache=cache, use_cache=True)
    forward_with_features(target, [1, 3, 4], input_ids=torch.randint(1, 128, (1, 1)), cache=cache, use_cache=True)
    assert not getattr(target, "_output_capturing_hooks_installed", False)
    assert all(not module._forward_hooks for module in target.modules())


@torch.no_grad()
def test_hooks_are_removed_when_the_forward_raises():
    target = tiny_target()
    with pytest.raises(Exception):
        forward_with_features(target, [1, 3, 4], input_ids=torch.full((1, 3), 10_000))  # token id out of range
    assert all(not module._forward_hooks for module in target.modules())


@torch.no_grad()
def test_model_without_declared_decoder_layers_falls_back(monkeypatch):
    target = tiny_target()
    monkeypatch.setattr(type(target.base_model), "can_record_outputs", {})  # what decoder_layers reads
    assert decoder_layers(target) is None
    input_ids = torch.randint(1, 128, (1, 7))
    _, features = forward_with_features(target, [1, 3, 4], input_ids=input_ids)
    torch.testing.assert_close(features, _reference_features(target, [1, 3, 4], input_ids), rtol=0, atol=0)


def test_decoder_layers_are_the_models_layers_in_order():
    target = tiny_target()
    assert decoder_layers(target) == list(target.model.layers)
