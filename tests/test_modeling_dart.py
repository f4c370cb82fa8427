"""DartConfig / DartDraftModel: released checkpoint layout, save/load, Auto classes, binding checks, forward."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, DynamicCache, Gemma3TextConfig, AutoModelForCausalLM

from _helpers import VOCAB_SIZE, prompts, tiny_target
from dart_hf import DartConfig, DartDraftModel

H, HEADS, KV_HEADS, HEAD_DIM, INTER, DRAFT_VOCAB = 32, 4, 2, 8, 64, 64


def released_matrix_shapes(head_dim: int, draft_vocab: int) -> dict[str, tuple[int, ...]]:
    """The names and shapes of the released DART drafts' weight matrices (their vectors: the norms, `mask_rep`)."""
    return {
        "fc.weight": (H, 3 * H),
        "midlayer.self_attn.q_proj.weight": (HEADS * head_dim, 2 * H),
        "midlayer.self_attn.k_proj.weight": (KV_HEADS * head_dim, 2 * H),
        "midlayer.self_attn.v_proj.weight": (KV_HEADS * head_dim, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, HEADS * head_dim),
        "midlayer.mlp.gate_proj.weight": (INTER, H),
        "midlayer.mlp.up_proj.weight": (INTER, H),
        "midlayer.mlp.down_proj.weight": (H, INTER),
        "lm_head.weight": (draft_vocab, H),
    }


def released_state_dict(draft_vocab: int = DRAFT_VOCAB) -> dict[str, torch.Tensor]:
    """A state dict with the exact names and shapes of the released DART drafts (plus the embedding they may hold)."""
    d2t = torch.arange(draft_vocab) * (VOCAB_SIZE // draft_vocab)
    d2t = d2t - torch.arange(draft_vocab)
    t2d = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    t2d[torch.arange(draft_vocab) + d2t] = True
    shapes = {
        **released_matrix_shapes(HEAD_DIM, draft_vocab),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mask_rep": (2 * H,),
        "norm.weight": (H,),
        "embed_tokens.weight": (VOCAB_SIZE, H),
    }
    generator = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    tensors["d2t"], tensors["t2d"] = d2t, t2d
    return tensors


def write_released_checkpoint(folder, tensors) -> None:
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": VOCAB_SIZE, "draft_vocab_size": DRAFT_VOCAB,
        "draft_length": 8, "target_hidden_size": H, "max_position_embeddings": 1024, "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))


def test_released_checkpoint_loads_unchanged(tmp_path):
    tensors = released_state_dict()
    write_released_checkpoint(tmp_path, tensors)
    target = tiny_target("qwen3")
    draft, info = DartDraftModel.from_pretrained(tmp_path, target=target, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    assert set(info["unexpected_keys"]) <= {"embed_tokens.weight"}
    assert isinstance(draft.config, DartConfig) and draft.config.draft_vocab_size == DRAFT_VOCAB
    state = draft.state_dict()
    for name, value in tensors.items():
        if name != "embed_tokens.weight":
            assert torch.equal(state[name], value), name
    assert "embed_tokens.weight" not in state
    assert draft.config.feature_layers == [1, 3, 5]  # chosen at bind: three distinct layers of the 6-layer target
    got = target.generate(prompts(1)[0], max_new_tokens=32, assistant_model=draft)
    assert torch.equal(got, target.generate(prompts(1)[0], max_new_tokens=32, do_sample=False))


def test_save_pretrained_round_trip_and_auto_classes(tmp_path):
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(
        target, draft_vocab_size=DRAFT_VOCAB, draft_to_target_ids=torch.arange(DRAFT_VOCAB) * 2
    )
    draft.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "dart" and "auto_map" in saved
    from safetensors import safe_open
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as handle:
        assert not any("embed" in key for key in handle.keys())  # the target's embedding is never saved
    # other users may read it, as they may config.json (safetensors alone writes its files private)
    assert stat.S_IMODE(os.stat(tmp_path / "model.safetensors").st_mode) == stat.S_IMODE(
        os.stat(tmp_path / "config.json").st_mode)

    for loaded in (DartDraftModel.from_pretrained(tmp_path, target=target), AutoModel.from_pretrained(tmp_path)):
        assert isinstance(loaded, DartDraftModel)
        for (name, ours), (_, theirs) in zip(draft.state_dict().items(), loaded.state_dict().items()):
            assert torch.equal(ours, theirs), name
    assert isinstance(AutoConfig.from_pretrained(tmp_path), DartConfig)


def test_saved_draft_loads_with_trust_remote_code(tmp_path):
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target)
    draft.save_pretrained(tmp_path / "draft")
    expected = draft.lm_head.weight.sum().item()
    script = (
        "import sys, transformers\n"
        f"model = transformers.AutoModel.from_pretrained({str(tmp_path / 'draft')!r}, trust_remote_code=True)\n"
        "assert 'dart_hf' not in sys.modules, 'the remote code must not need the installed package'\n"
        "print(type(model).__name__, model.lm_head.weight.sum().item())\n"
    )
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    name, value = result.stdout.split()[-2:]
    assert name == "DartDraftModel" and float(value) == pytest.approx(expected, rel=1e-6)


def test_bind_rejects_mismatched_targets():
    draft = DartDraftModel.from_target(tiny_target("llama"))
    with pytest.raises(ValueError, match="hidden size of 32, but the target has 48"):
        draft.bind(tiny_target("llama", hidden_size=48))
    with pytest.raises(ValueError, match=f"vocabulary size of {VOCAB_SIZE}, but the target has 256"):
        draft.bind(tiny_target("llama", vocab_size=256))
    with pytest.raises(ValueError, match="only 2 layers"):
        draft.bind(tiny_target("llama", num_hidden_layers=2))


def test_unknown_reduced_vocabulary_mapping_is_refused():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="vocabulary mapping \\(d2t\\) is unknown"):
        DartDraftModel.from_target(target, draft_vocab_size=DRAFT_VOCAB)
    config = DartDraftModel.from_target(target).config.to_dict()
    draft = DartDraftModel(DartConfig(**{**config, "draft_vocab_size": DRAFT_VOCAB}))
    with pytest.raises(ValueError, match="one entry per draft token"):
        draft.set_vocab_mapping(torch.arange(3))
    with pytest.raises(ValueError, match="one-to-one"):
        draft.set_vocab_mapping(torch.zeros(DRAFT_VOCAB, dtype=torch.long))
    draft.set_vocab_mapping(torch.arange(DRAFT_VOCAB) + 10)
    draft.bind(target)
    assert draft.draft_to_target(torch.tensor([0, 5])).tolist() == [10, 15]
    assert int(draft.t2d.sum()) == DRAFT_VOCAB and bool(draft.t2d[10]) and not bool(draft.t2d[9])


def float64_draft_and_inputs(rows: int, seed: int) -> tuple[DartDraftModel, torch.Tensor, torch.Tensor]:
    """An untrained float64 draft of a tiny target, random features `[1, rows, 3H]` and next-token ids `[1, rows]`."""
    draft = DartDraftModel.from_target(tiny_target("llama", dtype=torch.float64))
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(1, rows, 3 * H, generator=generator, dtype=torch.float64)
    return draft, features, torch.randint(0, VOCAB_SIZE, (1, rows), generator=generator)


def test_forward_shapes_and_incremental_cache_matches_one_pass():
    draft, features, next_ids = float64_draft_and_inputs(13, seed=0)
    with torch.no_grad():
        one_pass = draft(features, input_ids=next_ids).logits
        cache = DynamicCache()
        first = draft(features[:, :10], input_ids=next_ids[:, :10], cache=cache)
        assert first.logits.shape == (1, 8, VOCAB_SIZE) and cache.get_seq_length() == 10 + 7
        cache.crop(-7)
        second = draft(features[:, 10:], input_ids=next_ids[:, 10:], cache=cache).logits
    torch.testing.assert_close(second, one_pass, rtol=0, atol=1e-10)


def test_rows_whose_logits_are_not_kept_skip_their_attention_output_exactly():
    """A prompt's catch-up attends from the kept rows only; the logits and the cache are those of all rows."""
    draft, features, next_ids = float64_draft_and_inputs(12, seed=1)
    with torch.no_grad():
        for past in (0, 5):  # from an empty cache, and after 5 cached rows
            runs = {}
            for keep in (0, 1, 4, 9):
                cache = DynamicCache()
                if past:
                    draft(features[:, :past], input_ids=next_ids[:, :past], cache=cache, num_masks=0)
                logits = draft(features[:, past:], input_ids=next_ids[:, past:], cache=cache, num_masks=3,
                               logits_to_keep=keep).logits
                runs[keep] = logits, cache.layers[0].keys.clone(), cache.layers[0].values.clone()
            all_logits, keys, values = runs[0]
            assert all_logits.shape[1] == 12 - past + 3
            for keep in (1, 4, 9):
                torch.testing.assert_close(runs[keep][0], all_logits[:, -keep:], rtol=0, atol=1e-10)
                assert torch.equal(runs[keep][1], keys) and torch.equal(runs[keep][2], values)


def test_sliding_window_targets_are_exact_inside_the_window():
    """In float64, inside a window of 256 (past it, at any length: test_sliding_window.py)."""
    fields = dict(
        vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, eos_token_id=None, bos_token_id=None,
        pad_token_id=0, sliding_window=256,
    )
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(Gemma3TextConfig(**fields), dtype=torch.float64).eval()
    draft = DartDraftModel.from_target(target)
    for prompt in prompts(2, seed=21):
        expected = target.generate(prompt, max_new_tokens=64, do_sample=False)
        assert torch.equal(target.generate(prompt, max_new_tokens=64, assistant_model=draft), expected)


# ----- parity with the reference implementation's forward (fvliang/DART `LlamaForCausalLMDart` + `compute_logits`) --

REF_HEAD_DIM, REF_THETA, REF_MASKS = 12, 1e6, 3  # head_dim != H / heads; the released config's draft_length = masks


def reference_layout_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in the released layout, small enough that float32 logits stay O(1), with non-unit norms."""
    generator = torch.Generator().manual_seed(seed)
    shapes = released_matrix_shapes(REF_HEAD_DIM, DRAFT_VOCAB)
    weights = {name: 0.15 * torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    for name in ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"):
        weights[f"{name}.weight"] = 1.0 + 0.5 * torch.randn(H, generator=generator)
    weights["midlayer.mask_rep"] = torch.randn(2 * H, generator=generator)
    d2t = torch.arange(DRAFT_VOCAB) * (VOCAB_SIZE // DRAFT_VOCAB) - torch.arange(DRAFT_VOCAB)
    weights["d2t"] = d2t
    weights["t2d"] = torch.zeros(VOCAB_SIZE, dtype=torch.bool).index_fill_(0, torch.arange(DRAFT_VOCAB) + d2t, True)
    return weights


def reference_forward(w, embedding, features, next_ids, past=None, eps=1e-6):
    """The reference's draft forward, written from its formula: fc -> [norm(emb), norm(g)] + REF_MASKS mask rows ->
    causal GQA attention with RoPE (theta REF_THETA) over past + new rows -> residual -> keep the last REF_MASKS + 1
    rows -> SwiGLU MLP -> final norm (in the forward) -> norm again and lm_head (`compute_logits`).
    features `[T, 3H]`, next_ids `[T]`; past: (keys, values) of earlier real rows. Returns (logits `[M+1, V_d]`,
    (keys, values) with this call's real rows appended)."""

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x, positions):  # x [heads, S, d]
        inv_freq = 1.0 / REF_THETA ** (torch.arange(0, REF_HEAD_DIM, 2, dtype=torch.float32) / REF_HEAD_DIM)
        angles = positions[:, None].float() * inv_freq[None]
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
        half = REF_HEAD_DIM // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    num_real = features.shape[0]
    past_len = 0 if past is None else past[0].shape[1]
    g = features @ w["fc.weight"].T
    x = torch.cat([rms(embedding[next_ids], w["midlayer.input_layernorm.weight"]),
                   rms(g, w["midlayer.hidden_norm.weight"])], -1)
    x = torch.cat([x, w["midlayer.mask_rep"].expand(REF_MASKS, -1)])
    residual = torch.cat([g, w["midlayer.mask_rep"][:H].expand(REF_MASKS, -1)])
    seq = x.shape[0]
    positions = torch.arange(past_len, past_len + seq)
    q = rope((x @ w["midlayer.self_attn.q_proj.weight"].T).view(seq, HEADS, REF_HEAD_DIM).transpose(0, 1), positions)
    k = rope((x @ w["midlayer.self_attn.k_proj.weight"].T).view(seq, KV_HEADS, REF_HEAD_DIM).transpose(0, 1), positions)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(seq, KV_HEADS, REF_HEAD_DIM).transpose(0, 1)
    if past is not None:
        k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
    new_past = (k[:, : past_len + num_real], v[:, : past_len + num_real])  # the mask rows are dropped
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 0), v.repeat_interleave(HEADS // KV_HEADS, 0)
    scores = q @ k.transpose(1, 2) / REF_HEAD_DIM**0.5
    blocked = torch.arange(past_len + seq)[None, :] > positions[:, None]
    scores = scores.masked_fill(blocked, float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(seq, HEADS * REF_HEAD_DIM)
    hidden = (residual + attended @ w["midlayer.self_attn.o_proj.weight"].T)[-(REF_MASKS + 1):]
    normed = rms(hidden, w["midlayer.post_attention_layernorm.weight"])
    gate, up = normed @ w["midlayer.mlp.gate_proj.weight"].T, normed @ w["midlayer.mlp.up_proj.weight"].T
    hidden = hidden + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
    hidden = rms(hidden, w["norm.weight"])  # LlamaForCausalLMDart.forward
    return rms(hidden, w["norm.weight"]) @ w["lm_head.weight"].T, new_past  # compute_logits


def test_released_layout_draft_computes_the_reference_logits(tmp_path):
    weights = reference_layout_weights()
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": REF_HEAD_DIM,
        "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": REF_THETA, "vocab_size": VOCAB_SIZE,
        "draft_vocab_size": DRAFT_VOCAB, "draft_length": REF_MASKS, "target_hidden_size": H,
        "max_position_embeddings": 1024, "torch_dtype": "float32",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(weights, str(tmp_path / "model.safetensors"))
    target = tiny_target("qwen3", seed=4)
    draft = DartDraftModel.from_pretrained(tmp_path, target=target)
    assert draft.config.double_final_norm and draft.config.draft_length == REF_MASKS + 1
    embedding = target.get_input_embeddings().weight.detach()
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(9, 3 * H, generator=generator)
    next_ids = torch.randint(0, VOCAB_SIZE, (9,), generator=generator)

    with torch.no_grad():
        one_pass = draft(features[None], input_ids=next_ids[None]).logits[0]
        expected, _ = reference_forward(weights, embedding, features, next_ids)
        torch.testing.assert_close(one_pass, expected, rtol=0, atol=1e-5)

        # two cached decoding steps (the draft's mask rows cropped after each), against the reference's cached
        # steps and against recomputing the whole sequence from scratch
        cache, past = DynamicCache(), None
        for rows in (slice(0, 5), slice(5, 9)):
            step = draft(features[None, rows], input_ids=next_ids[None, rows], cache=cache).logits[0]
            cache.crop(-REF_MASKS)
            expected, past = reference_forward(weights, embedding, features[rows], next_ids[rows], past)
            torch.testing.assert_close(step, expected, rtol=0, atol=1e-5)
        from_scratch, _ = reference_forward(weights, embedding, features, next_ids)
        torch.testing.assert_close(step, from_scratch, rtol=0, atol=1e-5)


def test_the_double_norm_is_the_released_layout_only(tmp_path):
    """dart-hf's own drafts keep one final norm (their measured acceptance must not move); a released-layout draft
    saved by dart-hf keeps the reference's forward when loaded back."""
    target = tiny_target("llama")
    assert not DartDraftModel.from_target(target).config.double_final_norm
    import dart_hf.drafts
    shipped_folder = os.path.join(os.path.dirname(dart_hf.drafts.__file__), "smollm2_135m_instruct")
    shipped = json.loads(open(os.path.join(shipped_folder, "config.json")).read())
    assert not shipped.get("double_final_norm", False)
    (tmp_path / "released").mkdir()
    write_released_checkpoint(tmp_path / "released", released_state_dict())
    draft = DartDraftModel.from_pretrained(tmp_path / "released", target=tiny_target("qwen3"))
    draft.save_pretrained(tmp_path / "saved")
    loaded = DartDraftModel.from_pretrained(tmp_path / "saved", target=tiny_target("qwen3"))
    assert loaded.config.double_final_norm and loaded.config.draft_length == draft.config.draft_length
    features, ids = torch.randn(1, 4, 3 * H), torch.randint(0, VOCAB_SIZE, (1, 4))
    with torch.no_grad():
        torch.testing.assert_close(loaded(features, input_ids=ids).logits, draft(features, input_ids=ids).logits)


def test_a_target_with_one_rope_per_layer_type_gives_the_draft_its_full_attention_rope():
    """Gemma 3 keeps a RoPE per layer type; the draft attends to the whole sequence, so it takes the full-attention
    layers' (rope_theta 1e6 here), as one plain RoPE."""
    config = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, vocab_size=128)
    target = AutoModelForCausalLM.from_config(config).eval()
    assert set(target.config.rope_parameters) == {"full_attention", "sliding_attention"}
    draft = DartDraftModel.from_target(target)
    assert draft.config.rope_parameters["rope_theta"] == 1_000_000.0
    assert not {"full_attention", "sliding_attention"} & set(draft.config.rope_parameters)
    expected = 1.0 / 1_000_000.0 ** (torch.arange(0, 16, 2).float() / 16)
    torch.testing.assert_close(draft.rotary_emb.inv_freq, expected)


def test_a_draft_from_a_compiled_target_binds_the_model_it_wraps_and_leaves_it_working():
    target = tiny_target("llama")
    prompt = prompts(1)[0]
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    compiled = torch.compile(target)
    draft = DartDraftModel.from_target(compiled)
    assert draft.target is target
    assert torch.equal(target.generate(prompt, max_new_tokens=12, do_sample=False), expected)
    assert torch.equal(compiled.generate(prompt, max_new_tokens=12, assistant_model=draft), expected)
    assert torch.equal(target.generate(prompt, max_new_tokens=12, assistant_model=draft), expected)
    draft.unbind()
    assert "generate" not in vars(target)
    assert torch.equal(compiled.generate(prompt, max_new_tokens=12, do_sample=False), expected)


@pytest.mark.parametrize("num_layers", [4, 5, 6, 7, 12, 28])
def test_default_feature_layers_are_three_distinct_layers(num_layers):
    layers = DartDraftModel.from_target(tiny_target("llama", num_hidden_layers=num_layers)).config.feature_layers
    assert len(set(layers)) == 3 and all(0 < layer < num_layers for layer in layers)
    if num_layers >= 7:  # EAGLE-3's choice, which the released drafts read
        assert layers == [2, num_layers // 2, num_layers - 3]
    with pytest.raises(ValueError, match="three distinct feature layers.*set `feature_layers`"):
        DartDraftModel.from_target(tiny_target("llama", num_hidden_layers=3))


def test_a_saved_config_without_feature_layers_is_refused(tmp_path):
    target = tiny_target("llama")
    DartDraftModel.from_target(target).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["feature_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="names no `feature_layers`.*Add them to its config.json"):
        DartDraftModel.from_pretrained(tmp_path, target=target)
