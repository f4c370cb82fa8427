"""`dart-hf self-distill` and `dart-hf train` end to end, and training under torchrun (DDP, 2 CPU ranks)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _helpers import char_tokenizer, cli_failure, prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.cli import main
from dart_hf.training import load_examples, self_distill


def saved_target(folder: Path):
    """A tiny random Llama and a character tokenizer saved in `folder`, as `--target` reads them."""
    target = tiny_target("llama", seed=7)
    target.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return target


def test_self_distill_and_train_commands(tmp_path):
    target = saved_target(tmp_path / "target")
    conversations = [{"messages": [{"role": "user", "content": f"say {word}"}]} for word in "abcdefghij"]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps(c) for c in conversations) + "\n")
    def distill(output: str) -> list[str]:
        return ["self-distill", "--target", str(tmp_path / "target"), str(tmp_path / "prompts.jsonl"),
                "--output", str(tmp_path / output), "--max-new-tokens", "24", "--batch-size", "4"]

    common = distill("train.jsonl")
    main(common + ["--limit", "6"])
    assert len(load_examples([tmp_path / "train.jsonl"])) == 6
    main(common)  # resumes: only the 4 missing prompts are generated
    lines = (tmp_path / "train.jsonl").read_text().strip().split("\n")
    assert len(lines) == 10 and sorted(json.loads(line)["id"] for line in lines) == list(range(10))
    main(distill("bf16.jsonl") + ["--limit", "2", "--dtype", "bfloat16"])  # the target generates in bfloat16
    assert [len(e["response_ids"]) > 0 for e in load_examples([tmp_path / "bf16.jsonl"])] == [True, True]

    replies = [{"prompt": f"repeat {w}", "response": w * 5} for w in "klmnopqrst"]
    (tmp_path / "replies.json").write_text(json.dumps(replies))
    config = {
        "target": str(tmp_path / "target"), "train_files": [str(tmp_path / "train.jsonl")],
        "existing_files": [str(tmp_path / "replies.json")], "existing_ratio": 0.5,
        "eval_files": [str(tmp_path / "train.jsonl")], "output_dir": str(tmp_path / "draft"), "max_steps": 6,
        "per_device_train_batch_size": 4, "learning_rate": 1e-3, "report_to": "none", "use_cpu": True,
        "eval_strategy": "steps", "eval_steps": 3, "save_steps": 3, "early_stopping_patience": 5,
        "draft_vocab_size": 64, "feature_cache_dir": str(tmp_path / "features"),
    }
    (tmp_path / "train.json").write_text(json.dumps(config))
    main(["train", str(tmp_path / "train.json")])
    assert (tmp_path / "features" / "cache.json").exists()  # trained from the offline feature cache
    assert (tmp_path / "features" / "eval" / "cache.json").exists()  # and evaluated from one of the held-out examples
    history = json.loads((tmp_path / "draft" / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "eval_chain_tau" in entry] == [3, 6]
    draft = DartDraftModel.from_pretrained(tmp_path / "draft", target=target)
    assert draft.config.draft_vocab_size == 64 and draft.config.feature_norm
    prompt = prompts(1)[0]
    assert torch.equal(target.generate(prompt, max_new_tokens=24, assistant_model=draft),
                       target.generate(prompt, max_new_tokens=24, do_sample=False))


def test_torchrun_two_ranks_agree_on_the_weights(tmp_path):
    target = tiny_target("llama", seed=7)
    self_distill(target, [p[0].tolist() for p in prompts(16, seed=3)], tmp_path / "train.jsonl",
                 max_new_tokens=24, progress=False)
    script = Path(__file__).parent / "ddp_train.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), str(tmp_path), str(tmp_path / "train.jsonl")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    stages = {p.name: p.read_text().split("\n")[:-1] for p in sorted(tmp_path.glob("rank*.stages"))}
    assert result.returncode == 0, f"stages reached: {stages}\n{result.stderr[-3000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["world"] == ranks[1]["world"] == 2
    assert ranks[0]["checksums"] == ranks[1]["checksums"]
    torch.manual_seed(0)
    initial = DartDraftModel.from_target(target, feature_norm=True)  # the ranks' starting point
    assert ranks[0]["checksums"]["fc.weight"] != float(initial.fc.weight.detach().double().sum())  # it trained
    assert len(ranks[0]["losses"]) == 5


def test_train_with_a_bfloat16_teacher(tmp_path):
    target = saved_target(tmp_path / "target")
    torch.manual_seed(0)
    DartDraftModel.from_target(target).save_pretrained(tmp_path / "init")  # both runs start from these weights
    examples = [{"id": i, "prompt_ids": [5 + i, 9, 12], "response_ids": [20 + (i + j) % 30 for j in range(16)]}
                for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    config = {
        "target": str(tmp_path / "target"), "train_files": [str(tmp_path / "train.jsonl")],
        "init_draft": str(tmp_path / "init"), "max_steps": 2, "per_device_train_batch_size": 4,
        "learning_rate": 1e-3, "report_to": "none", "use_cpu": True, "save_strategy": "no", "logging_steps": 1,
    }
    losses = {}
    for dtype in ("float32", "bfloat16"):
        output = tmp_path / dtype
        (tmp_path / "train.json").write_text(json.dumps({**config, "output_dir": str(output), "target_dtype": dtype}))
        main(["train", str(tmp_path / "train.json")])
        history = json.loads((output / "trainer_state.json").read_text())["log_history"]
        losses[dtype] = [entry["loss"] for entry in history if "loss" in entry]
    # the same batches and anchors: the bfloat16 teacher's loss is the float32 one's up to rounding
    assert len(losses["bfloat16"]) == 2 and losses["float32"][0] > 0
    assert losses["bfloat16"][0] == pytest.approx(losses["float32"][0], rel=0.05)
    draft = DartDraftModel.from_pretrained(tmp_path / "bfloat16", target=target)
    assert draft.dtype == torch.float32  # the draft itself trained in float32
    prompt = prompts(1)[0]  # and it serves the float32 target losslessly
    assert torch.equal(target.generate(prompt, max_new_tokens=24, assistant_model=draft),
                       target.generate(prompt, max_new_tokens=24, do_sample=False))

    (tmp_path / "bad.json").write_text(json.dumps({**config, "output_dir": str(tmp_path / "bad"), "target_dtype": "bf16"}))
    with pytest.raises(ValueError, match="--target_dtype must be float32, bfloat16 or float16"):
        main(["train", str(tmp_path / "bad.json"), "--debug"])  # --debug: the exception itself, not one line


def test_train_on_with_a_frozen_output_layer_leaves_its_shard_byte_identical(tmp_path, capsys):
    """`--freeze_lm_head` trains every weight but the output layer; saved in bfloat16 with the output layer in a
    shard of its own (as a shipped draft is), that shard comes out byte for byte as it went in."""
    target = saved_target(tmp_path / "target")
    torch.manual_seed(0)
    DartDraftModel.from_target(target).to(torch.bfloat16).save_pretrained(tmp_path / "init")  # as shipped
    examples = [{"id": i, "prompt_ids": [5 + i, 9, 12], "response_ids": [20 + (i + j) % 30 for j in range(16)]}
                for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    config = {
        "target": str(tmp_path / "target"), "train_files": [str(tmp_path / "train.jsonl")],
        "init_draft": str(tmp_path / "init"), "freeze_lm_head": True, "output_dir": str(tmp_path / "trained"),
        "max_steps": 2, "per_device_train_batch_size": 4, "learning_rate": 1e-2, "report_to": "none",
        "use_cpu": True, "save_strategy": "no",
    }
    (tmp_path / "train.json").write_text(json.dumps(config))
    main(["train", str(tmp_path / "train.json")])

    shipped = {}
    for name in ("init", "trained"):
        draft = DartDraftModel.from_pretrained(tmp_path / name, target=target, dtype=torch.bfloat16)
        head_bytes = draft.lm_head.weight.numel() * 2
        assert all(p.numel() * 2 < head_bytes for n, p in draft.named_parameters() if n != "lm_head.weight")
        draft.save_pretrained(tmp_path / f"{name}-shipped", max_shard_size=head_bytes - 1)
        shipped[name] = draft
    assert torch.equal(shipped["trained"].lm_head.weight, shipped["init"].lm_head.weight)
    assert not torch.equal(shipped["trained"].fc.weight, shipped["init"].fc.weight)  # the rest trained
    index = json.loads((tmp_path / "init-shipped" / "model.safetensors.index.json").read_text())["weight_map"]
    head_shard = index["lm_head.weight"]
    assert [name for name, shard in index.items() if shard == head_shard] == ["lm_head.weight"]
    trained_index = json.loads((tmp_path / "trained-shipped" / "model.safetensors.index.json").read_text())
    assert trained_index["weight_map"]["lm_head.weight"] == head_shard
    head_files = [tmp_path / f"{name}-shipped" / head_shard for name in ("init", "trained")]
    assert head_files[0].read_bytes() == head_files[1].read_bytes()

    del config["init_draft"]  # a fresh draft's output layer is random: nothing to keep
    (tmp_path / "fresh.json").write_text(json.dumps(config))
    assert "--freeze_lm_head keeps a trained draft's output layer: pass it with --init_draft" in cli_failure(
        capsys, ["train", str(tmp_path / "fresh.json")])


def test_self_distill_of_a_base_model_keeps_its_bos_and_cuts_prompts(tmp_path, monkeypatch, capsys):
    """A tokenizer without a chat template (a base model such as Gemma 3 270M): prompts are encoded as
    `tokenizer(text)` encodes them for `generate`, BOS included, and `--prompt-tokens` keeps their first N tokens.
    `--max-minutes` (on a clock that moves a minute per reading) stops after one batch and says how to go on."""
    import types

    from tokenizers import processors

    import dart_hf.training.data as data_module

    target = tiny_target("llama", seed=7)
    target.save_pretrained(tmp_path / "target")
    tokenizer = char_tokenizer()
    tokenizer.chat_template = None
    bos = tokenizer.convert_ids_to_tokens(1)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, 1)]
    )
    tokenizer.save_pretrained(tmp_path / "target")
    texts = ["a long text to continue, longer than ten tokens", "short"]
    (tmp_path / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt": t}) for t in texts) + "\n")
    command = ["self-distill", "--target", str(tmp_path / "target"), str(tmp_path / "prompts.jsonl"), "--output",
               str(tmp_path / "out.jsonl"), "--max-new-tokens", "6", "--prompt-tokens", "10", "--batch-size", "1"]
    readings = iter(range(0, 60_000, 60))
    monkeypatch.setattr(data_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(readings))))
    main(command + ["--max-minutes", "1.5"])
    assert "1 of 2 prompts left: rerun the same command" in capsys.readouterr().out
    assert len((tmp_path / "out.jsonl").read_text().strip().split("\n")) == 1
    monkeypatch.undo()
    main(command)
    lines = (tmp_path / "out.jsonl").read_text().strip().split("\n")
    records = sorted((json.loads(line) for line in lines), key=lambda r: r["id"])
    for text, record in zip(texts, records):
        expected = tokenizer(text + "\n").input_ids
        assert expected[0] == 1 and record["prompt_ids"] == expected[:10]
        prompt = torch.tensor([record["prompt_ids"]])
        reply = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
        reply = reply[0, prompt.shape[1] :]  # with the mask, as self-distill calls it (a tiny model's near-ties)
        assert record["response_ids"] == reply.tolist()


def test_train_refuses_malformed_missing_and_empty_example_files_naming_them(tmp_path, capsys):
    saved_target(tmp_path / "target")
    good = {"prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6]}
    lines = [json.dumps(good)] * 2 + ["{not json"] + [json.dumps(good)] * 5
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "empty.jsonl").write_text(json.dumps({**good, "response_ids": []}) + "\n")
    common = ["train", "--target", str(tmp_path / "target"), "--output_dir", str(tmp_path / "draft")]

    message = cli_failure(capsys, common + ["--train_files", str(tmp_path / "train.jsonl")])
    assert f"{tmp_path / 'train.jsonl'}:3 is not JSON" in message
    with pytest.raises(ValueError, match=r"train.jsonl:3 is not JSON.*--skip_bad_lines"):
        load_examples([tmp_path / "train.jsonl"])
    assert len(load_examples([tmp_path / "train.jsonl"], skip_bad_lines=True)) == 7
    assert "skipped 1 malformed line(s)" in capsys.readouterr().out
    (tmp_path / "keys.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert "keys.jsonl:1 has no ['prompt_ids', 'response_ids']" in cli_failure(
        capsys, common + ["--train_files", str(tmp_path / "keys.jsonl")])
    message = cli_failure(capsys, common + ["--train_files", str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl does not exist" in message
    message = cli_failure(capsys, common + ["--train_files", str(tmp_path / "empty.jsonl"),
                                        "--eval_files", str(tmp_path / "missing-eval.jsonl")])
    assert "missing-eval.jsonl does not exist" in message  # a missing evaluation file is no longer skipped
    message = cli_failure(capsys, common + ["--train_files", str(tmp_path / "empty.jsonl")])
    assert f"No training examples in {tmp_path / 'empty.jsonl'}" in message
    assert "required: --target" in cli_failure(capsys, ["train", "--train_files", "x.jsonl", "--output_dir", "d"], 2)


def test_self_distill_refuses_an_empty_or_missing_prompt_file(tmp_path, capsys):
    saved_target(tmp_path / "target")
    (tmp_path / "empty.jsonl").write_text("")
    common = ["self-distill", "--target", str(tmp_path / "target"), "--output", str(tmp_path / "out.jsonl")]
    assert "No prompts in" in cli_failure(capsys, common + [str(tmp_path / "empty.jsonl")])
    (tmp_path / "bad.jsonl").write_text('{"messages": []}\n{oops\n')
    assert "bad.jsonl:2 is not JSON" in cli_failure(capsys, common + [str(tmp_path / "bad.jsonl")])
    assert "target ./no-such-folder does not exist" in cli_failure(
        capsys, ["self-distill", "--target", "./no-such-folder", "--output", "o.jsonl"])
    assert not (tmp_path / "out.jsonl").exists()
