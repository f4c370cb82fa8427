"""`dart-hf build-ngram` / `convert-trie` end to end with a tokenizer built in the test; every subcommand's
failures as one or two lines and an exit code (the traceback only with --debug)."""

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dart_hf import NgramTable
from dart_hf.cli import main
from _helpers import cli_failure
from test_ngram import random_corpus, write_trie


def make_tokenizer(folder):
    words = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    tokenizer.save_pretrained(folder)
    return tokenizer


def test_build_ngram_from_jsonl(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "tok")
    texts = ["the cat sat on the mat", "the dog sat on a mat", "a cat sat"]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps({"content": t}) for t in texts) + "\n")
    main(["build-ngram", "--tokenizer", str(tmp_path / "tok"), str(tmp_path / "data.jsonl"), "--field", "content",
          "--output", str(tmp_path / "ngram.safetensors")])
    table = NgramTable.load(tmp_path / "ngram.safetensors")
    direct = NgramTable.from_sequences(
        [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts], vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id, progress=False,
    )
    for ours, theirs in zip((table.keys, table.counts), (direct.keys, direct.counts)):
        assert np.array_equal(np.asarray(ours), theirs)
    ids = tokenizer.convert_tokens_to_ids
    # P(sat | the cat) = 1; P(on | cat sat): "cat sat" twice, once followed by "on"
    probs = table.probabilities(np.array([[ids("the"), ids("cat")], [ids("cat"), ids("sat")]]),
                                np.array([[ids("sat")], [ids("on")]]))
    assert probs[:, 0].tolist() == [1.0, 0.5]


def test_convert_trie(tmp_path):
    corpus = random_corpus(4)
    write_trie(tmp_path / "small.trie", corpus, eos=11, order=3, seed=0)
    main(["convert-trie", str(tmp_path / "small.trie"), "--vocab-size", "12", "--output", str(tmp_path / "t.safetensors")])
    converted = NgramTable.load(tmp_path / "t.safetensors")
    direct = NgramTable.from_sequences(corpus, vocab_size=12, eos_token_id=11, progress=False)
    assert np.array_equal(converted.keys, direct.keys) and np.array_equal(converted.counts, direct.counts)


def test_generate_command_prints_the_answer_tau_and_speedup(tmp_path, capsys):
    from _helpers import char_tokenizer, tiny_target
    from dart_hf import DartDraftModel

    target = tiny_target("llama", seed=8)
    tokenizer = char_tokenizer()
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    DartDraftModel.from_target(target).save_pretrained(tmp_path / "draft")
    main(["generate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompt", "hi",
          "--max-new-tokens", "16", "--rounds", "1", "--dtype", "float32"])
    printed = capsys.readouterr().out
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    vanilla = target.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(vanilla[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert printed.startswith(answer) and "tau " in printed
    assert "speedup over vanilla generate" in printed and "identical to vanilla" in printed


def test_generate_command_picks_the_dtype_by_hardware_and_judges_bfloat16_by_near_ties(tmp_path, capsys, monkeypatch):
    """Without --dtype the target loads in the hardware's fastest dtype (here: a CPU said to multiply bfloat16),
    printed with the reason; the comparison line is then the near-tie judgement, not a bare identity."""
    from _helpers import char_tokenizer, tiny_target
    from dart_hf import DartDraftModel, hardware

    monkeypatch.setattr(hardware, "cpu_info", lambda: hardware.CpuInfo("Test Xeon", ("amx_bf16", "avx512_bf16")))
    target = tiny_target("llama", seed=8)
    char_tokenizer().save_pretrained(tmp_path / "target")
    target.save_pretrained(tmp_path / "target")
    DartDraftModel.from_target(target).save_pretrained(tmp_path / "draft")
    main(["generate", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "draft"), "--prompt", "hi",
          "--max-new-tokens", "16", "--rounds", "1"])
    printed = capsys.readouterr().out
    assert "in bfloat16 on cpu: Test Xeon [amx_bf16 avx512_bf16] multiplies bfloat16 natively" in printed
    assert "torch.bfloat16: " in printed and "0 real divergences" in printed


def test_generate_and_bench_name_a_target_or_draft_that_cannot_be_loaded(tmp_path, capsys):
    assert "target ./no-such-model does not exist" in cli_failure(
        capsys, ["generate", "--target", "./no-such-model", "--draft", "d", "--dtype", "float32"])
    assert "--max-new-tokens: must be an integer >= 1, got 0" in cli_failure(
        capsys, ["generate", "--target", "t", "--draft", "d", "--max-new-tokens", "0"], 2)
    assert "target ./no-such-model does not exist" in cli_failure(capsys, ["bench", "--target", "./no-such-model"])
    assert "--prompts-per-set: must be an integer >= 1, got -3" in cli_failure(
        capsys, ["bench", "--prompts-per-set", "-3"], 2)
    (tmp_path / "config.json").write_text("{}")  # a folder that is not a model
    assert "dart-hf generate: error:" in cli_failure(
        capsys, ["generate", "--target", str(tmp_path), "--draft", "d", "--dtype", "float32"])


def test_build_ngram_names_a_missing_binary_or_malformed_input(tmp_path, capsys):
    make_tokenizer(tmp_path / "tok")
    common = ["build-ngram", "--tokenizer", str(tmp_path / "tok"), "--output", str(tmp_path / "t.safetensors")]
    assert f"No such file or directory: {tmp_path / 'missing.jsonl'}" in cli_failure(
        capsys, common + [str(tmp_path / "missing.jsonl")])
    (tmp_path / "binary.jsonl").write_bytes(bytes(range(256)))
    assert "binary.jsonl is not UTF-8 text" in cli_failure(capsys, common + [str(tmp_path / "binary.jsonl")])
    (tmp_path / "bad.jsonl").write_text('{"text": "the cat"}\n[1, 2\n')
    assert "bad.jsonl:2 is not JSON" in cli_failure(capsys, common + [str(tmp_path / "bad.jsonl")])
    assert "Is a directory" in cli_failure(capsys, common + [str(tmp_path)])
    assert "tokenizer ./no-tokenizer does not exist" in cli_failure(
        capsys, ["build-ngram", "--tokenizer", "./no-tokenizer", str(tmp_path / "bad.jsonl")])
    assert not (tmp_path / "t.safetensors").exists()


def test_convert_trie_names_a_missing_or_wrong_file_and_debug_shows_the_traceback(tmp_path, capsys):
    assert "No such file or directory" in cli_failure(
        capsys, ["convert-trie", str(tmp_path / "x.trie"), "--vocab-size", "12"])
    assert "Is a directory" in cli_failure(capsys, ["convert-trie", str(tmp_path), "--vocab-size", "12"])
    (tmp_path / "noise.trie").write_bytes(np.random.default_rng(0).bytes(4000))
    assert "not a reference DART .trie file" in cli_failure(
        capsys, ["convert-trie", str(tmp_path / "noise.trie"), "--vocab-size", "12"])
    assert "required: trie, --vocab-size" in cli_failure(capsys, ["convert-trie"], 2)
    with pytest.raises(ValueError, match="not a reference DART .trie file"):
        main(["convert-trie", str(tmp_path / "noise.trie"), "--vocab-size", "12", "--debug"])
