"""Fixtures for the vLLM plugin's tests (`integrations/vllm/tests`), written from dart-hf's environment, since
vLLM's pins a Transformers too old for dart-hf:

    python tests/vllm_fixtures.py DIR

DIR/target: a tiny random Llama (head size 32, which vLLM's CPU attention takes) with a character tokenizer.
DIR/<layout>/hf: a draft as dart-hf saves it; DIR/<layout>/vllm: the same draft exported for vLLM. Layouts:
"dart" (dart-hf's own: feature norms, a reduced 96-token vocabulary) and "released" (the released DART drafts'
Llama layout, random weights: double final norm, full vocabulary). With `--smollm2`, DIR/smollm2 also holds the
shipped SmolLM2 draft exported and DIR/smollm2/target.txt the converted target's folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _helpers import char_tokenizer, tiny_target  # noqa: E402
from dart_hf import DartDraftModel  # noqa: E402
from dart_hf.export_vllm import export_vllm  # noqa: E402

TARGET = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512)


def fixture_target():
    return tiny_target("llama", seed=5, **TARGET)


def released_layout_draft(target, folder: Path) -> DartDraftModel:
    """A draft in the released checkpoints' Llama layout (random weights), loaded the way a released draft is."""
    from safetensors.torch import save_file

    hidden, generator = TARGET["hidden_size"], torch.Generator().manual_seed(3)
    shapes = {
        "fc.weight": (hidden, 3 * hidden), "lm_head.weight": (128, hidden), "norm.weight": (hidden,),
        "midlayer.self_attn.q_proj.weight": (128, 2 * hidden), "midlayer.self_attn.k_proj.weight": (64, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (64, 2 * hidden), "midlayer.self_attn.o_proj.weight": (hidden, 128),
        "midlayer.mlp.gate_proj.weight": (256, hidden), "midlayer.mlp.up_proj.weight": (256, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, 256), "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.hidden_norm.weight": (hidden,), "midlayer.post_attention_layernorm.weight": (hidden,),
        "midlayer.mask_rep": (2 * hidden,),
    }
    tensors = {name: torch.randn(shape, generator=generator) * 0.2 for name, shape in shapes.items()}
    for name in shapes:
        if name.endswith("norm.weight"):
            tensors[name] = 1 + 0.1 * tensors[name]
    tensors["d2t"], tensors["t2d"] = torch.zeros(128, dtype=torch.long), torch.ones(128, dtype=torch.bool)
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 128, "draft_vocab_size": 128, "draft_length": 7,
        "target_hidden_size": hidden, "max_position_embeddings": 512, "torch_dtype": "float32",
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return DartDraftModel.from_pretrained(folder, target=target)


def write_fixtures(folder: Path, smollm2: bool = False) -> None:
    target = fixture_target()
    target.save_pretrained(folder / "target")
    char_tokenizer().save_pretrained(folder / "target")
    torch.manual_seed(0)
    dart = DartDraftModel.from_target(target, feature_norm=True, draft_vocab_size=96,
                                      draft_to_target_ids=torch.arange(96) + 16)
    released = released_layout_draft(target, folder / "released" / "reference")
    for name, draft in (("dart", dart), ("released", released)):
        draft.save_pretrained(folder / name / "hf")
        export_vllm(draft, folder / name / "vllm")
    if smollm2:
        from dart_hf.zoo import cache_root, load_draft, load_target

        target, _ = load_target("smollm2-135m-instruct", dtype=torch.float32)
        export_vllm(load_draft("smollm2-135m-instruct-dart", target), folder / "smollm2" / "vllm")
        (folder / "smollm2" / "target.txt").write_text(str(cache_root() / "smollm2-135m-instruct"))


if __name__ == "__main__":
    write_fixtures(Path(sys.argv[1]), smollm2="--smollm2" in sys.argv)
