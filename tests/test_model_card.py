"""Model cards and `push_to_hub`, against a local stand-in of the Hub.

The stand-in replaces the two `HfApi` calls the upload makes (`create_repo`, `create_commit`, the Hub's documented
commit-operation API) with writes into a local Hugging Face cache in the Hub's own layout
(`models--org--name/snapshots/<revision>/`, `refs/main`), which `from_pretrained(repo_id, cache_dir=...,
local_files_only=True)` reads exactly as it reads a download.
"""

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi, ModelCard

from _helpers import prompts, tiny_target
from dart_hf import DartDraftModel
from dart_hf.model_card import alpha_history_table, draft_model_card
from dart_hf.ngram import NgramTable


class LocalHub:
    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir
        self.commits = []

    def create_repo(self, api, repo_id, **kwargs):
        return SimpleNamespace(repo_id=repo_id)

    def create_commit(self, api, repo_id, operations, commit_message, **kwargs):
        digest = hashlib.sha1()
        for operation in operations:
            digest.update(operation.path_in_repo.encode() + Path(operation.path_or_fileobj).read_bytes())
        revision = digest.hexdigest()
        repo = self.cache_dir / f"models--{repo_id.replace('/', '--')}"
        for operation in operations:
            destination = repo / "snapshots" / revision / operation.path_in_repo
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(operation.path_or_fileobj, destination)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
        self.commits.append((repo_id, commit_message, sorted(op.path_in_repo for op in operations)))
        return SimpleNamespace(oid=revision, commit_message=commit_message)


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    hub = LocalHub(tmp_path / "hub-cache")
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: hub.create_repo(api, repo_id, **kw))
    monkeypatch.setattr(HfApi, "create_commit", lambda api, repo_id, **kw: hub.create_commit(api, repo_id, **kw))
    return hub


def trained_looking_draft():
    target = tiny_target("llama", seed=4)
    target.config._name_or_path = "org/tiny-target"
    torch.manual_seed(0)
    draft = DartDraftModel.from_target(target, draft_vocab_size=64, draft_to_target_ids=torch.arange(0, 128, 2))
    draft.ngram = NgramTable.from_sequences([list(range(1, 60)) * 3], vocab_size=128, order=3)
    return target, draft


def test_pushed_draft_loads_back_by_repo_id_and_generates_identically(local_hub):
    target, draft = trained_looking_draft()
    commit = draft.push_to_hub("org/tiny-dart", training="Three steps on nothing.", license="apache-2.0")
    repo_id, message, files = local_hub.commits[0]
    assert repo_id == "org/tiny-dart" and commit.oid
    assert {"README.md", "config.json", "model.safetensors", "ngram.safetensors", "modeling_dart.py"} <= set(files)

    loaded = DartDraftModel.from_pretrained(
        "org/tiny-dart", target=target, cache_dir=local_hub.cache_dir, local_files_only=True
    )
    assert loaded.ngram is not None and loaded.ngram.describe() == draft.ngram.describe()
    for prompt in prompts(2, seed=5):
        expected = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=draft,
                                   tree_options={"adaptive": False})
        expected_stats = draft.stats.accepted_lengths
        got = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=loaded,
                              tree_options={"adaptive": False})
        assert torch.equal(got, expected) and loaded.stats.accepted_lengths == expected_stats

    snapshot = next((local_hub.cache_dir / "models--org--tiny-dart" / "snapshots").iterdir())
    card = ModelCard.load(snapshot / "README.md")
    assert card.data.library_name == "dart-hf" and card.data.base_model == "org/tiny-target"
    assert card.data.pipeline_tag == "text-generation" and "speculative-decoding" in card.data.tags
    assert card.data.license == "apache-2.0"
    assert 'DartDraftModel.from_pretrained("org/tiny-dart", target=target)' in card.text
    assert "Three steps on nothing." in card.text and "64 of the target's 128" in card.text


def test_model_card_renders_a_results_table_from_a_bench_summary():
    target, draft = trained_looking_draft()
    summary = {"overall": {"vanilla": {"speedup_total": 1.0}, "dart": {"speedup_total": 1.7, "tau": 3.1}}}
    card = draft_model_card(draft, "org/tiny-dart", results=summary)
    parsed = ModelCard(str(card))
    assert parsed.data.base_model == "org/tiny-target"
    assert "| overall | 1.00x | 1.70x (3.10) |" in card.text


def test_model_card_without_a_target_id_names_the_fix():
    target, draft = trained_looking_draft()
    target.config._name_or_path = ""
    with pytest.raises(ValueError, match="base_model="):
        draft_model_card(draft, "org/tiny-dart")


def test_a_base_model_card_continues_text_and_a_chat_card_uses_the_template():
    target, draft = trained_looking_draft()
    base = draft_model_card(draft, "org/tiny-dart", chat=False).text
    chat = draft_model_card(draft, "org/tiny-dart").text
    assert 'tokenizer("Speculative decoding is", return_tensors="pt")' in base and "apply_chat_template" not in base
    assert "apply_chat_template" in chat and "Speculative decoding is" not in chat
    for text in (base, chat):
        assert "{%" not in text and "\nout = target.generate(" in text


def test_alpha_history_table_has_a_row_per_evaluation_only():
    log_history = [
        {"step": 10, "loss": 5.0},
        {"step": 20, "eval_chain_tau": 1.5, **{f"eval_alpha_{k}": 0.5 / k for k in range(1, 9)}},
        {"step": 40, "eval_chain_tau": 1.75, **{f"eval_alpha_{k}": 0.6 / k for k in range(1, 9)}},
    ]
    lines = alpha_history_table(log_history).split("\n")
    assert lines[0].startswith("| step | alpha_1 |") and lines[0].endswith("| chain tau |") and len(lines) == 4
    assert lines[2] == "| 20 | 50.0% | 25.0% | 16.7% | 12.5% | 10.0% | 8.3% | 7.1% | 6.2% | 1.50 |"
    assert lines[3].startswith("| 40 | 60.0% |") and lines[3].endswith("| 1.75 |")
