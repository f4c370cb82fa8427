"""`dart-hf export-vllm`: the folder vLLM's parallel drafting loads through the dart-hf-vllm plugin, and the replay
that holds the plugin's drafts, recorded inside vLLM (`integrations/vllm/tests`), to `DartDraftModel.forward`."""

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from _helpers import char_tokenizer, cli_failure, tiny_target
from dart_hf import DartDraftModel
from dart_hf.cli import main
from dart_hf.export_vllm import VLLM_ARCHITECTURE, export_vllm
from dart_hf.features import forward_with_features

FIXTURES = os.environ.get("DART_HF_VLLM_FIXTURES")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_export_writes_the_config_and_weights_vllm_loads(tmp_path):
    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target, feature_norm=True, draft_vocab_size=64,
                                       draft_to_target_ids=torch.arange(64) * 2)
    export_vllm(draft, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == [VLLM_ARCHITECTURE] and config["num_hidden_layers"] == 1
    assert config["eagle_aux_hidden_state_layer_ids"] == draft.config.feature_layers
    assert config["mask_token_id"] == config["vocab_size"] == 128 and config["draft_vocab_size"] == 64
    assert config["fc_norm"] and not config["norm_before_residual"] and config["dart_draft_length"] == 8
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
        assert torch.equal(weights.get_tensor("midlayer.mask_rep"), draft.midlayer.mask_rep.detach())
        assert torch.equal(weights.get_tensor("d2t"), draft.d2t)
    assert {"fc_norm.0.weight", "mask_hidden", "lm_head.weight", "midlayer.self_attn.q_proj.weight"} <= names
    assert not any(name.startswith(("feature_norms.", "t2d", "embed")) for name in names)
    assert not list(tmp_path.glob("out.tmp*"))  # written under a temporary name, renamed into place
    (tmp_path / "made").mkdir()  # a server's user may be another: the folder and weights get the umask's modes
    assert mode(tmp_path / "out") == mode(tmp_path / "made")
    assert mode(tmp_path / "out" / "model.safetensors") == mode(tmp_path / "out" / "config.json")

    full = DartDraftModel.from_target(target)  # a full vocabulary: vLLM has no d2t for it
    export_vllm(full, tmp_path / "full")
    with safe_open(str(tmp_path / "full" / "model.safetensors"), "pt") as weights:
        assert "d2t" not in set(weights.keys())


def test_export_command(tmp_path, capsys):
    target = tiny_target("llama")
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    DartDraftModel.from_target(target).save_pretrained(tmp_path / "draft")
    main(["export-vllm", str(tmp_path / "draft"), str(tmp_path / "out"), "--target", str(tmp_path / "target")])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [VLLM_ARCHITECTURE]
    assert "num_speculative_tokens" in capsys.readouterr().out
    assert "draft ./missing does not exist" in cli_failure(
        capsys, ["export-vllm", "./missing", str(tmp_path / "x"), "--target", str(tmp_path / "target")])


@pytest.mark.skipif(not FIXTURES, reason="replays what the vLLM stage of .ci/run recorded (DART_HF_VLLM_FIXTURES)")
@pytest.mark.parametrize("layout", ["dart", "released"])
def test_the_plugin_drafts_what_dart_draft_model_drafts_for_the_same_features(layout):
    """Every drafting step vLLM ran (prefill and the steps after it, reading the draft's KV cache), replayed
    without a cache through `DartDraftModel.forward` over the same sequence's target features: the same logits
    for the last real row and every mask row, so the same drafted tokens."""
    fixtures = Path(FIXTURES)
    records = json.loads((fixtures / layout / "records.json").read_text())
    target = type(tiny_target()).from_pretrained(fixtures / "target", dtype=torch.float32).eval()
    draft = DartDraftModel.from_pretrained(fixtures / layout / "hf", target=target).float()
    mask_id = target.config.vocab_size
    sequences = [torch.tensor([s]) for s in records["sequences"]]
    features = [forward_with_features(target, draft.config.feature_layers, input_ids=s)[1] for s in sequences]
    request, compared = -1, 0
    for step in records["steps"]:
        ids, positions = step["input_ids"], step["positions"]
        first_mask = ids.index(mask_id)
        num_masks = sum(1 for i in ids if i == mask_id)
        if positions[0] == 0 and first_mask > 1:  # a prefill: the next request's first step
            request += 1
        last = positions[first_mask - 1]
        sequence = sequences[request][0]
        assert int(sequence[last + 1]) == ids[first_mask - 1]  # the row carries the token after its position
        with torch.no_grad():
            logits = draft(features[request][:, : last + 1], input_ids=sequence[None, 1 : last + 2],
                           num_masks=num_masks).logits[0]
        expected = torch.full((logits.shape[0], target.config.vocab_size), float("-inf"))
        expected[:, draft.draft_to_target(torch.arange(draft.config.draft_vocab_size))] = logits
        recorded = torch.tensor(step["logits"])
        kept = torch.isfinite(expected)
        assert torch.equal(kept, torch.isfinite(recorded))
        torch.testing.assert_close(recorded[kept], expected[kept], atol=2e-3, rtol=1e-3)
        top2 = expected.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-2  # the drafted tokens, where rounding cannot swap them
        assert torch.equal(recorded.argmax(-1)[clear], expected.argmax(-1)[clear])
        compared += 1
    assert request == 2 and compared == len(records["steps"]) >= 6
