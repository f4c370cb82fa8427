"""The steps the draft recipes share: a prompt file that only grows, the held-out split, the target's dtype."""

import json

import pytest

from dart_hf import hardware
from dart_hf.training.recipe import interleaved_prompt_file, recipe_dtype, split_held_out


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
