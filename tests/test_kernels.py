"""Triton kernels against their torch references (compiled on a CUDA GPU, in Triton's interpreter without one), and
DART end to end with the Triton kernels selected."""

import pytest
import torch

from _helpers import OracleDraft, prompts, tiny_target
from dart_hf.kernels import dispatch
from dart_hf.kernels.kv_compact import compact_kv_torch, compact_kv_triton
from dart_hf.kernels.tree_mask import tree_mask_torch, tree_mask_triton

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed (pip install triton)")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the interpreter takes CPU tensors


def random_parents(size: int, generator: torch.Generator, max_depth: int = 8) -> torch.Tensor:
    parents, depths = [-1], [0]
    for node in range(1, size):
        allowed = [p for p in range(node) if depths[p] < max_depth]
        parent = allowed[int(torch.randint(0, len(allowed), (1,), generator=generator))]
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return torch.tensor(parents)


@pytest.mark.parametrize("size,prefix_len", [(1, 0), (2, 5), (20, 33), (61, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tree_mask_kernel_equals_torch(size, prefix_len, dtype):
    parents = random_parents(size, torch.Generator().manual_seed(size)).to(DEVICE)
    assert torch.equal(tree_mask_triton(parents, prefix_len, dtype), tree_mask_torch(parents, prefix_len, dtype))


def test_tree_mask_kernel_on_a_depth_8_chain():
    parents = torch.tensor([-1, 0, 1, 2, 3, 4, 5, 6, 7], device=DEVICE)
    got = tree_mask_triton(parents, 4, torch.float32)
    assert torch.equal(got, tree_mask_torch(parents, 4, torch.float32))
    assert torch.equal(got[0, 0, :, 4:].cpu() == 0, torch.ones(9, 9, dtype=torch.bool).tril())  # a chain: causal


@pytest.mark.parametrize("seed", range(3))
def test_kv_compaction_kernel_equals_torch(seed):
    generator = torch.Generator().manual_seed(seed)
    past_len, tree_size = 17, 61
    path = torch.cat([torch.tensor([0]), torch.randperm(tree_size - 1, generator=generator)[:7].sort().values + 1])
    tensors = [torch.randn(1, 3, past_len + tree_size, 16, generator=generator) for _ in range(4)]
    tensors.append(torch.randn(2, 1, past_len + tree_size + 3, 8, generator=generator).double())  # another group
    tensors, path = [t.to(DEVICE) for t in tensors], path.to(DEVICE)
    expected = [t.clone() for t in tensors]
    compact_kv_torch(expected, past_len, path)
    compact_kv_triton(tensors, past_len, path)
    for ours, theirs in zip(tensors, expected):
        assert torch.equal(ours, theirs)


def test_dart_generate_is_lossless_with_the_triton_kernels(monkeypatch):
    monkeypatch.setenv("DART_HF_KERNELS", "triton")
    target = tiny_target("llama", dtype=torch.float32, seed=2).to(DEVICE)
    draft = OracleDraft.from_target(target)
    prompt = prompts(1, seed=3)[0].to(DEVICE)
    expected = target.generate(prompt, max_new_tokens=24, do_sample=False)
    draft.set_reference(target.generate(prompt, max_new_tokens=40, do_sample=False), correct_levels=4)
    # fixed trees: the adaptive budget would choose them from this machine's timings, and tau with them
    got = target.generate(prompt, max_new_tokens=24, assistant_model=draft, tree_options={"adaptive": False})
    assert torch.equal(got, expected)
    assert draft.stats.tau == 5


def test_dispatch_modes(monkeypatch):
    monkeypatch.setenv("DART_HF_KERNELS", "torch")
    assert not dispatch.use_triton(torch.device("cpu"))
    monkeypatch.setenv("DART_HF_KERNELS", "auto")
    assert not dispatch.use_triton(torch.device("cpu"))
    monkeypatch.setenv("DART_HF_KERNELS", "fast")
    with pytest.raises(ValueError, match="must be 'auto', 'triton' or 'torch'"):
        dispatch.use_triton(torch.device("cpu"))


@pytest.mark.parametrize("size,past_len,heads,kv_heads,dtype", [
    (1, 0, 2, 2, torch.float32), (9, 5, 4, 2, torch.float32), (61, 300, 4, 1, torch.float32),
    (33, 64, 2, 2, torch.float16),
])
def test_tree_attention_kernel_equals_torch(size, past_len, heads, kv_heads, dtype):
    from dart_hf.kernels.tree_attention import (
        TreeAttentionMetadata, tree_attention_torch, tree_attention_triton, unpack_bits,
    )
    from dart_hf.kernels.tree_mask import ancestor_matrix

    generator = torch.Generator().manual_seed(size)
    parents = random_parents(size, generator)
    tree = TreeAttentionMetadata.from_parents(parents.to(DEVICE), past_len)
    assert torch.equal(unpack_bits(tree.ancestor_bits, size).cpu(), ancestor_matrix(parents))
    query = torch.randn(1, heads, size, 16, generator=generator).to(DEVICE, dtype)
    key = torch.randn(1, kv_heads, past_len + size, 16, generator=generator).to(DEVICE, dtype)
    value = torch.randn(1, kv_heads, past_len + size, 16, generator=generator).to(DEVICE, dtype)
    expected = tree_attention_torch(query.float(), key.float(), value.float(), tree, 0.25)
    got = tree_attention_triton(query, key, value, tree, 0.25)
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-3)


def test_dart_tree_attention_implementation_is_lossless_end_to_end(monkeypatch):
    """A stock model loaded with attn_implementation="dart_tree": vanilla and DART (tree attention in Triton)
    give the tokens of the sdpa model. Fixed trees: the adaptive budget's calibration would time dozens of tree
    forwards in Triton's (slow) interpreter and test nothing more."""
    monkeypatch.setenv("DART_HF_KERNELS", "triton")
    reference = tiny_target("qwen3", dtype=torch.float32, seed=5).to(DEVICE)
    target = tiny_target("qwen3", dtype=torch.float32, seed=5, attn="dart_tree").to(DEVICE)
    draft = OracleDraft.from_target(target)
    prompt = prompts(1, seed=6)[0].to(DEVICE)
    expected = reference.generate(prompt, max_new_tokens=16, do_sample=False)
    assert torch.equal(target.generate(prompt, max_new_tokens=16, do_sample=False), expected)
    draft.set_reference(reference.generate(prompt, max_new_tokens=32, do_sample=False), correct_levels=3)
    got = target.generate(prompt, max_new_tokens=16, assistant_model=draft, tree_options={"adaptive": False})
    assert torch.equal(got, expected)
    assert draft.stats.tau == 4
