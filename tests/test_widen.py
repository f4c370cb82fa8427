"""Widening a trained draft's MLP: the same logits before training, and the new units learn."""

import pytest
import torch

from _helpers import prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.training import widen_mlp


def trained_like_draft(target) -> DartDraftModel:
    torch.manual_seed(1)
    draft = DartDraftModel.from_target(target)
    with torch.no_grad():  # non-zero everywhere, as after training (a fresh draft has zero-initialised parts)
        for parameter in draft.parameters():
            parameter.normal_(std=0.05)
    return draft


def test_widened_draft_gives_the_same_logits_and_its_new_units_learn():
    target = tiny_target("llama", seed=2)
    draft = trained_like_draft(target)
    wide = widen_mlp(draft, 3 * draft.config.intermediate_size)
    assert wide.config.intermediate_size == 3 * draft.config.intermediate_size
    assert wide.target is target and wide.ngram is draft.ngram

    input_ids = prompts(1, seed=5, min_len=12, max_len=12)[0]
    with torch.no_grad():
        outputs = target(input_ids, output_hidden_states=True)
        features = torch.cat([outputs.hidden_states[i] for i in draft.config.feature_layers], dim=-1)
        before = draft(features, input_ids=input_ids, num_masks=3).logits
        after = wide(features, input_ids=input_ids, num_masks=3).logits
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)

    loss = wide(features, input_ids=input_ids, num_masks=3).logits.logsumexp(-1).mean()
    loss.backward()
    old = draft.config.intermediate_size
    down = wide.midlayer.mlp.down_proj.weight
    assert down.grad[:, old:].abs().sum() > 0  # the new units' output weights get a gradient from the start
    assert torch.count_nonzero(down[:, old:]) == 0


def test_widen_mlp_refuses_a_size_that_does_not_grow():
    draft = trained_like_draft(tiny_target("llama", seed=2))
    with pytest.raises(ValueError, match="larger intermediate size"):
        widen_mlp(draft, draft.config.intermediate_size)


def test_train_command_widens_the_init_draft(tmp_path):
    import json

    from _helpers import char_tokenizer
    from dart_hf.cli import main

    target = tiny_target("llama", seed=7)
    target.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    trained_like_draft(target).save_pretrained(tmp_path / "init")
    examples = [{"id": i, "prompt_ids": [5, 6, 7], "response_ids": list(range(10 + i, 40 + i))} for i in range(4)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    config = {"target": str(tmp_path / "target"), "train_files": [str(tmp_path / "train.jsonl")],
              "output_dir": str(tmp_path / "draft"), "max_steps": 2, "per_device_train_batch_size": 2,
              "report_to": "none", "use_cpu": True, "save_strategy": "no"}
    (tmp_path / "no_init.json").write_text(json.dumps({**config, "widen_mlp": 128}))
    with pytest.raises(ValueError, match="--init_draft"):
        main(["train", str(tmp_path / "no_init.json"), "--debug"])
    (tmp_path / "widen.json").write_text(json.dumps({**config, "init_draft": str(tmp_path / "init"), "widen_mlp": 128}))
    main(["train", str(tmp_path / "widen.json")])
    assert DartDraftModel.from_pretrained(tmp_path / "draft").config.intermediate_size == 128
    state = json.loads((tmp_path / "draft" / "trainer_state.json").read_text())  # the history beside the weights
    assert state["global_step"] == 2
