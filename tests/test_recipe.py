"""The steps the draft recipes share: a prompt file that only grows, the held-out split, the target's dtype."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from dart_hf import hardware
from dart_hf.training.recipe import interleaved_prompt_file, recipe_dtype, run_child, split_held_out


def test_the_prompt_file_interleaves_kinds_in_proportion_and_only_grows(tmp_path):
    pools = {"code": [f"c{i}" for i in range(10)], "chat": [f"t{i}" for i in range(10)]}
    path = tmp_path / "prompts.jsonl"
    interleaved_prompt_file(path, pools, {"code": 2, "chat": 1}, 5)
    first = path.read_text().split("\n")[:-1]
    assert [json.loads(line)["messages"][0]["content"] for line in first] == ["c0", "c1", "t0", "c2", "c3"]
    interleaved_prompt_file(path, pools, {"code": 2, "chat": 1}, 8)
    assert path.read_text().split("\n")[:5] == first  # ids already used by a self-distilled file never move
    with pytest.raises(ValueError, match="fewer than the 40 asked for"):
        interleaved_prompt_file(tmp_path / "more.jsonl", pools, {"code": 2, "chat": 1}, 40)


def test_every_twentieth_record_is_held_out(tmp_path):
    (tmp_path / "all.jsonl").write_text("\n".join(json.dumps({"id": i}) for i in range(45)) + "\n")
    split_held_out(tmp_path / "all.jsonl", tmp_path)
    held_out = [json.loads(line)["id"] for line in (tmp_path / "heldout.jsonl").read_text().split("\n")[:-1]]
    assert held_out == [0, 20, 40] and len((tmp_path / "train.jsonl").read_text().split("\n")[:-1]) == 42


def test_the_recipe_dtype_is_the_cpus_fast_one_unless_named(monkeypatch, capsys):
    monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo("Test EPYC", ("avx512_bf16",)))
    assert recipe_dtype("auto") == "bfloat16" and "multiplies bfloat16 natively" in capsys.readouterr().out
    monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo("Test EPYC", ()))
    assert recipe_dtype("auto") == "float32" and "no bfloat16 matrix instructions" in capsys.readouterr().out
    assert recipe_dtype("bfloat16") == "bfloat16" and capsys.readouterr().out == ""


def test_a_sitting_stopped_with_sigterm_stops_its_child_and_a_failing_child_raises(tmp_path):
    """The recipes run `dart-hf train` / `self-distill` as a child process: `kill` on the recipe must not leave
    the child (the target in memory, training on) running without it."""
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", "import sys; from dart_hf.training.recipe import run_child; "
                               f"run_child([sys.executable, '-c', {child!r}])"])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child_pid = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    returncode = parent.wait(timeout=60)
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)  # gone, and reaped by the parent
    assert returncode == 128 + signal.SIGTERM
    with pytest.raises(subprocess.CalledProcessError):
        run_child([sys.executable, "-c", "raise SystemExit(3)"])


def test_shipping_a_recipe_checkpoint_builds_its_missing_ngram_table_first(tmp_path, monkeypatch):
    from _helpers import tiny_target

    from dart_hf import zoo
    from dart_hf.modeling_dart import DartDraftModel
    from dart_hf.ngram import NgramTable
    from dart_hf.training.recipe import ship_recipe_draft

    target = tiny_target("qwen2")
    checkpoint = tmp_path / "checkpoint-10"
    DartDraftModel.from_target(target).save_pretrained(checkpoint)
    built = []

    def build_ngram(folder):
        built.append(folder)
        table = NgramTable.from_sequences([[1, 2, 3, 1, 2]], vocab_size=target.config.vocab_size, order=3)
        table.save(folder / "ngram.safetensors")

    monkeypatch.setattr(zoo, "load_target", lambda name, dtype: (target, None))
    monkeypatch.setattr(zoo, "draft_path", lambda name: str(tmp_path / "shipped"))
    ship_recipe_draft(checkpoint, "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-dart", build_ngram)
    assert built == [checkpoint]
    shipped = DartDraftModel.from_pretrained(tmp_path / "shipped", target=target)
    assert shipped.dtype == torch.bfloat16 and shipped.ngram is not None
    ship_recipe_draft(checkpoint, "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-dart", build_ngram)
    assert built == [checkpoint]  # a checkpoint with its table ships as it is
