"""The offline feature cache: the same training rows as online features, resumable, grown with new data, and refused
when built with other settings."""

import pytest
import torch

from _helpers import prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.training import CachedFeatureDataset, DartDataCollator, FeatureCache, build_feature_cache, self_distill
from dart_hf.training.trainer import draft_rows, evaluate_draft


def examples_for(target, tmp_path, count=5):
    prompt_ids = [p[0].tolist() for p in prompts(count, seed=3, min_len=4, max_len=12)]
    return self_distill(target, prompt_ids, tmp_path / "sd.jsonl", max_new_tokens=10, progress=False, scheduler="static")


def test_cached_rows_equal_online_rows_and_the_cache_resumes(tmp_path):
    target = tiny_target("qwen2", seed=1)
    draft = DartDraftModel.from_target(target)
    examples = [{"prompt_ids": e["prompt_ids"], "response_ids": e["response_ids"]} for e in examples_for(target, tmp_path)]
    layers = list(draft.config.feature_layers)
    cache = build_feature_cache(target, examples, layers, tmp_path / "cache", dtype=torch.float32, shard_size=2,
                                batch_size=3, progress=False)
    assert len(cache) == 5 and sorted(p.name for p in (tmp_path / "cache").glob("shard-*")) == [
        "shard-00000.safetensors", "shard-00001.safetensors", "shard-00002.safetensors"]
    features, last_hidden = cache[4]
    assert features.shape == (len(examples[4]["prompt_ids"]) + len(examples[4]["response_ids"]), 96)
    assert last_hidden.shape[-1] == 32

    collator = DartDataCollator(max_length=18)  # truncation applies to the cached rows too
    dataset = CachedFeatureDataset(examples, cache)
    torch.manual_seed(0)
    with torch.no_grad():
        cached = draft_rows(draft, target, collator([dataset[i] for i in range(5)]), num_anchors=None)
        online = draft_rows(draft, target, collator(examples), num_anchors=None)
    assert torch.equal(cached.valid, online.valid) and cached.valid.sum() > 20
    valid = online.valid  # rows over padding differ (zeros in the cache) and are never supervised
    torch.testing.assert_close(cached.target_logits[valid], online.target_logits[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached.draft_logits[valid], online.draft_logits[valid], rtol=1e-5, atol=1e-5)
    # held-out figures from a float32 cache (what `dart-hf train` evaluates from) are the live target's
    assert evaluate_draft(draft, target, dataset, collator) == pytest.approx(
        evaluate_draft(draft, target, examples, collator), abs=1e-9)

    # a crash mid-build leaves whole shards only: a rerun computes just the missing one
    (tmp_path / "cache" / "shard-00001.safetensors").unlink()
    kept = (tmp_path / "cache" / "shard-00000.safetensors").stat().st_mtime_ns
    again = build_feature_cache(target, examples, layers, tmp_path / "cache", dtype=torch.float32, shard_size=2,
                                progress=False)
    assert (tmp_path / "cache" / "shard-00000.safetensors").stat().st_mtime_ns == kept
    torch.testing.assert_close(again[2][0], cache[2][0])
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_a_cache_for_other_settings_or_examples_is_refused(tmp_path):
    target = tiny_target("llama", seed=1)
    examples = [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6]}, {"prompt_ids": [7, 8], "response_ids": [9]}]
    build_feature_cache(target, examples, [2, 3, 4], tmp_path, shard_size=1, progress=False)
    for settings in ({"feature_layers": [1, 3, 4]}, {"dtype": torch.float16}, {"shard_size": 2}):
        arguments = {"feature_layers": [2, 3, 4], "shard_size": 1, **settings}
        with pytest.raises(ValueError, match="other settings .* delete that folder"):
            build_feature_cache(target, examples, directory=tmp_path, progress=False, **arguments)
    other = [examples[0], {"prompt_ids": [7, 8], "response_ids": [10]}]
    with pytest.raises(ValueError, match="other examples"):
        CachedFeatureDataset(other, FeatureCache(tmp_path))
    with pytest.raises(ValueError, match="holds 2 examples, the dataset 1"):
        CachedFeatureDataset(examples[:1], FeatureCache(tmp_path))
    with pytest.raises(FileNotFoundError, match="build it first"):
        FeatureCache(tmp_path / "missing")


def test_new_data_reuses_the_shards_whose_examples_are_unchanged(tmp_path):
    target = tiny_target("llama", seed=1)
    examples = [{"prompt_ids": [1, 2, 3 + i], "response_ids": [4, 5 + i]} for i in range(7)]
    layers = [2, 3, 4]
    build_feature_cache(target, examples[:3], layers, tmp_path / "cache", shard_size=2, progress=False)
    kept = (tmp_path / "cache" / "shard-00000.safetensors").stat().st_mtime_ns
    partial = (tmp_path / "cache" / "shard-00001.safetensors").stat().st_mtime_ns

    grown = build_feature_cache(target, examples, layers, tmp_path / "cache", shard_size=2, progress=False)
    assert (tmp_path / "cache" / "shard-00000.safetensors").stat().st_mtime_ns == kept
    assert (tmp_path / "cache" / "shard-00001.safetensors").stat().st_mtime_ns != partial
    fresh = build_feature_cache(target, examples, layers, tmp_path / "fresh", shard_size=2, progress=False)
    CachedFeatureDataset(examples, grown)  # every shard holds the examples at its indices
    for index in range(7):
        torch.testing.assert_close(grown[index], fresh[index], rtol=0, atol=0)

    changed = examples[:2] + [{"prompt_ids": [9, 9], "response_ids": [9]}]  # another example at index 2, fewer rows
    shrunk = build_feature_cache(target, changed, layers, tmp_path / "cache", shard_size=2, progress=False)
    assert (tmp_path / "cache" / "shard-00000.safetensors").stat().st_mtime_ns == kept
    assert sorted(p.name for p in (tmp_path / "cache").glob("shard-*")) == [
        "shard-00000.safetensors", "shard-00001.safetensors"]
    CachedFeatureDataset(changed, shrunk)
    assert shrunk[2][0].shape[0] == 3


def test_a_target_that_changes_its_logits_after_the_head_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM, Gemma2Config

    config = Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, final_logit_softcapping=3.0)
    target = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ValueError, match="soft-capping"):
        build_feature_cache(target, [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}], [1, 2, 3], tmp_path,
                            progress=False)


def test_the_cache_pads_little_and_runs_the_output_layer_on_one_position_per_example(tmp_path):
    """The cache keeps no logits: the output layer (a 151,936-token matrix on Qwen) runs on each example's last
    position only, where the model takes `logits_to_keep`, and the stored rows are every position's. Examples are
    batched by length, so a long one and a short one do not share a batch."""
    target = tiny_target("qwen2", seed=1)
    long, short = {"prompt_ids": [1, 2, 3, 4], "response_ids": [5, 6, 7]}, {"prompt_ids": [8, 9], "response_ids": [10]}
    examples = [long, short, long, short]
    head_rows, batch_shapes = [], []
    hooks = [target.get_output_embeddings().register_forward_hook(
                 lambda module, args, output: head_rows.append(args[0].shape[:-1])),
             target.register_forward_pre_hook(
                 lambda module, args, kwargs: batch_shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)]
    try:
        cache = build_feature_cache(target, examples, [1, 2, 3], tmp_path, dtype=torch.float32, batch_size=2,
                                    progress=False)
    finally:
        for hook in hooks:
            hook.remove()
    assert batch_shapes == [(2, 3), (2, 7)]
    assert head_rows[0] == (2, 1)  # the first batch's forward; the check then runs the layer on that position again
    assert cache[1][0].shape[0] == 3 and cache[2][0].shape[0] == 7
    with torch.no_grad():
        full = target(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7]]), output_hidden_states=True)
    torch.testing.assert_close(cache[0][1], full.hidden_states[-1][0], rtol=1e-5, atol=1e-5)
