"""Model cards for DART drafts: the Hub's metadata header plus what a user of the draft needs to know.

The template is `model_cards/dart_draft.md` (shipped inside the package as `dart_hf.model_cards`); it is filled
with `huggingface_hub.ModelCard.from_template`, so the header is exactly what the Hub parses.
"""

from __future__ import annotations

import os
import tempfile
from importlib.resources import files
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, ModelCardData

TEMPLATE = "dart_draft.md"
TAGS = ["dart", "speculative-decoding", "draft-model"]


def draft_model_card(
    draft,
    model_id: str,
    base_model: str | None = None,
    results: str | dict | None = None,
    training: str | None = None,
    license: str | None = None,
    datasets: list[str] | None = None,
    limitations: str = "",
    chat: bool = True,
) -> ModelCard:
    """The model card of `draft` (a `DartDraftModel`) published as `model_id`.

    base_model: the target's Hub id (default: the bound target's `name_or_path`). results: a markdown table, or a
    `dart-hf bench` summary dict (rendered with its markdown table). training: how the draft was trained (data
    and licences, recipe, commands). chat: the usage example prompts through the chat template; False for a
    base model, which continues text.
    """
    if base_model is None:
        base_model = draft.target.config._name_or_path if draft._bound_target else None
    if not base_model:
        raise ValueError("The model card needs the target's Hub id: pass base_model='org/target-model'.")
    if isinstance(results, dict):
        from .bench import markdown_table

        results = "Speedup over vanilla `generate` (total time) and tau per prompt set:\n\n" + markdown_table(results)
    config = draft.config
    card_data = ModelCardData(
        library_name="dart-hf",
        base_model=base_model,
        pipeline_tag="text-generation",
        tags=list(TAGS),
        license=license,
        datasets=datasets,
    )
    ngram = draft.ngram.describe() if draft.ngram is not None else "none (the tree search uses the draft alone)"
    tree = (
        f"{config.tree_policy} policy, up to {config.tree_budget} nodes, top-{config.tree_top_k} per level"
        + (", budget adapted to the measured costs" if config.tree_adaptive else "")
        + (f", context lookup of up to {config.tree_lookup_length} tokens when it pays"
           if config.tree_adaptive and config.tree_lookup_length else "")
    )
    return ModelCard.from_template(
        card_data,
        template_str=files("dart_hf.model_cards").joinpath(TEMPLATE).read_text(encoding="utf-8"),
        model_id=model_id,
        base_model=base_model,
        draft_length=config.draft_length,
        num_parameters=f"{sum(p.numel() for p in draft.parameters()):,}",
        draft_vocab_size=f"{config.draft_vocab_size:,}",
        vocab_size=f"{config.vocab_size:,}",
        feature_layers=", ".join(str(layer) for layer in config.feature_layers),
        tree=tree,
        ngram=ngram,
        results=results or "Not measured yet.",
        training=training or "Not recorded.",
        limitations=limitations,
        chat=chat,
    )


def alpha_history_table(log_history: list[dict]) -> str:
    """A markdown table of the held-out evaluations in a `Trainer` log history (`trainer_state.json`'s
    `log_history`): step, alpha_1..8 and chain tau, one row per evaluation."""
    rows = ["| step | " + " | ".join(f"alpha_{k}" for k in range(1, 9)) + " | chain tau |", "|" + " --- |" * 10]
    for entry in (e for e in log_history if "eval_chain_tau" in e):
        alphas = " | ".join(f"{float(entry[f'eval_alpha_{k}']):.1%}" for k in range(1, 9))
        rows.append(f"| {entry['step']} | {alphas} | {float(entry['eval_chain_tau']):.2f} |")
    return "\n".join(rows)


def push_draft_to_hub(
    draft,
    repo_id: str,
    *,
    commit_message: str = "Upload DART draft",
    private: bool | None = None,
    token: str | bool | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    model_card: ModelCard | None = None,
    **card_kwargs,
):
    """Upload `draft` (weights, config, remote code, N-gram table) and its model card to `repo_id` in one commit.

    model_card: a ready card; by default `draft_model_card(draft, repo_id, **card_kwargs)`. Returns the
    `huggingface_hub.CommitInfo`.
    """
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    card = model_card if model_card is not None else draft_model_card(draft, repo_id, **card_kwargs)
    with tempfile.TemporaryDirectory() as folder:
        draft.save_pretrained(folder)
        card.save(os.path.join(folder, "README.md"))
        operations = [
            CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
            for path in sorted(Path(folder).rglob("*"))
            if path.is_file()
        ]
        return api.create_commit(
            repo_id, operations=operations, commit_message=commit_message, revision=revision, create_pr=create_pr
        )
