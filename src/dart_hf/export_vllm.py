"""Export a DART draft as the folder vLLM's parallel drafting loads through the `dart-hf-vllm` plugin.

vLLM serves EAGLE-3-layout drafts with parallel drafting (one forward drafts K tokens: the last real row and K - 1
appended mask slots). The plugin (`integrations/vllm`, architecture `Eagle3DartForCausalLM`) subclasses vLLM's
EAGLE-3 Llama draft so that the mask slots are built DART's way: their attention input is `mask_rep` (2H) as it
is, their residual `mask_rep[:H]`, and the final norm applies twice for the released drafts. This module writes
what that plugin loads, without importing vLLM: a Llama-style `config.json` naming the plugin's architecture, the
draft's feature layers as vLLM's auxiliary hidden-state layer ids (the same indices as Transformers'
`output_hidden_states`), the mask token id, and the weights under the names vLLM's EAGLE-3 loader maps.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from .files import with_default_permissions
from .modeling_dart import DartDraftModel

VLLM_ARCHITECTURE = "Eagle3DartForCausalLM"


def vllm_config(draft: DartDraftModel) -> dict:
    """The `config.json` vLLM reads for `draft`: a one-layer Llama draft with EAGLE-3's fields and DART's own."""
    config = draft.config
    if config.feature_layers is None:
        raise ValueError("The draft names no feature_layers: bind it to its target (or load it with target=) first.")
    rope = dict(config.rope_parameters) if config.rope_parameters else {"rope_type": "default", "rope_theta": 10000.0}
    return {
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": rope.get("rope_theta", 10000.0),
        "rope_parameters": rope,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "tie_word_embeddings": False,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.feature_layers),
        "fc_norm": bool(config.feature_norm),  # vLLM's per-feature RMSNorm before fc: DART's feature_norm
        "norm_before_residual": False,  # DART's residual is fc's output before hidden_norm
        # the mask slots' input id: outside the vocabulary, so it never collides with a real token
        "mask_token_id": config.vocab_size,
        "dart_draft_length": config.draft_length,
        "dart_double_final_norm": bool(config.double_final_norm),
        "torch_dtype": str(draft.dtype).removeprefix("torch."),
    }


def vllm_weights(draft: DartDraftModel) -> dict[str, torch.Tensor]:
    """The draft's weights under the names vLLM's EAGLE-3 loader maps (`midlayer.` becomes `layers.0.`, `d2t`
    `draft_id_to_target_id`): the feature norms as `fc_norm.i`, the d2t mapping only for a reduced vocabulary
    (vLLM has no mapping for a full one), and a zero `mask_hidden` that parallel drafting requires (the plugin
    builds DART's mask rows from `mask_rep` instead)."""
    weights = {}
    for name, tensor in draft.state_dict().items():
        if name == "t2d" or name.startswith("rotary_emb."):
            continue
        if name == "d2t" and draft.config.draft_vocab_size == draft.config.vocab_size:
            continue
        weights[name.replace("feature_norms.", "fc_norm.")] = tensor.detach().contiguous().cpu()
    weights["mask_hidden"] = torch.zeros(3 * draft.config.target_hidden_size, dtype=draft.dtype)
    return weights


def export_vllm(draft: DartDraftModel, output_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike | None = None):
    """Write `draft` as the folder vLLM loads with `speculative_config={"method": "eagle3", "model": output_dir,
    "num_speculative_tokens": <draft_length>, "parallel_drafting": True}` and the `dart-hf-vllm` plugin installed.
    The folder is written under a temporary name and renamed into place; `tokenizer_dir`'s tokenizer files are
    copied in when given (vLLM reads the target's tokenizer, but some tools expect one beside every model)."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=output_dir.name + ".tmp"))
    try:
        (temporary / "config.json").write_text(json.dumps(vllm_config(draft), indent=2) + "\n")
        save_file(vllm_weights(draft), str(temporary / "model.safetensors"), metadata={"format": "pt"})
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if tokenizer_dir is not None and (Path(tokenizer_dir) / name).is_file():
                shutil.copy(Path(tokenizer_dir) / name, temporary / name)
        for path in [temporary, *temporary.iterdir()]:  # a server's user may be another one
            with_default_permissions(path)
        if output_dir.exists():
            shutil.rmtree(output_dir)
        os.replace(temporary, output_dir)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return output_dir
