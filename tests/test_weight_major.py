"""Weight-major linear products: the same outputs up to rounding, only plain `nn.Linear` layers, restored on exit."""

import pytest
import torch
from torch import nn

from _helpers import tiny_target
from dart_hf.weight_major import plain_linears, weight_major_linear, weight_major_linears


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5,), (1, 3), (2, 4)])
def test_weight_major_linear_equals_the_layer(bias, shape):
    torch.manual_seed(0)
    layer = nn.Linear(16, 24, bias=bias)
    x = torch.randn(*shape, 16)
    got = weight_major_linear(layer, x)
    assert got.shape == (*shape, 24) and got.is_contiguous()
    torch.testing.assert_close(got, layer(x))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_models_forward_is_unchanged_up_to_rounding_and_restored(arch):
    target = tiny_target(arch, seed=1)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = target(input_ids=ids).logits
        calls = []
        for layer in plain_linears(target):
            layer.register_forward_hook(lambda module, args, output: calls.append(module))
        with weight_major_linears(target):
            got = target(input_ids=ids).logits
            assert all("forward" in layer.__dict__ for layer in plain_linears(target))
        assert all("forward" not in layer.__dict__ for layer in plain_linears(target))
        torch.testing.assert_close(got, expected)
        assert len(set(map(id, calls))) == len(plain_linears(target))  # every layer ran (hooks still fire)
        torch.testing.assert_close(target(input_ids=ids).logits, expected)


def test_only_plain_linear_layers_change_and_all_come_back_after_an_error():
    class LowRank(nn.Linear):  # a subclass computes its own way (quantized, LoRA): left alone
        pass

    wrapped = nn.Linear(4, 4)
    own_forward = wrapped.forward
    wrapped.forward = own_forward  # a per-instance forward, as accelerate's hooks install: left alone
    model = nn.Sequential(nn.Linear(4, 4), LowRank(4, 4), wrapped, nn.Linear(4, 4).to(torch.float64))
    assert plain_linears(model) == [model[0], model[3]]
    with pytest.raises(RuntimeError, match="inside"):
        with weight_major_linears(model):
            assert "forward" in model[0].__dict__ and "forward" not in model[1].__dict__
            assert model[2].__dict__["forward"] is own_forward
            raise RuntimeError("inside")
    assert "forward" not in model[0].__dict__ and "forward" not in model[3].__dict__
    assert model[2].__dict__["forward"] is own_forward
