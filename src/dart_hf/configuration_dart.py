"""DartConfig: the draft model's architecture and its default tree policy."""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import RopeParameters

from .options import DecodingOptions


@strict
class DartConfig(PreTrainedConfig):
    r"""
    Configuration of a [`DartDraftModel`]: a one-layer Llama-style drafter that reads three hidden layers of a
    target model and predicts `draft_length` future tokens in one forward pass.

    The architecture fields follow `LlamaConfig` (the released DART drafts ship a plain Llama config, which
    [`DartConfig.from_llama_dict`] translates). `target_hidden_size` is the target's hidden size H (the draft's
    own `hidden_size` equals it in the released drafts). `feature_layers` are the three `output_hidden_states`
    indices of the target (0 = embeddings, i + 1 = output of decoder layer i); `None` picks `[2, L // 2, L - 3]`
    for an L-layer target when the draft is bound.

    `double_final_norm` applies the final RMSNorm twice before the head, `lm_head(norm(norm(h)))`, as the reference
    implementation's inference does for the released drafts (its forward ends with the norm and its logits
    function norms again); with trained, non-unit norm weights that is another function than `lm_head(norm(h))`,
    and the released drafts were tuned for it. [`DartConfig.from_llama_dict`] sets it; drafts trained here leave it
    off.

    Training-side options: `feature_norm` adds one RMSNorm per feature layer before `fc` (target
    layers differ in scale by an order of magnitude; off in the released drafts, which have no such weights);
    `feature_dropout` drops target features while training; `mask_rep_init_std` is the initial scale of `mask_rep`.

    Tree policy defaults (saved with the draft, overridable per `generate` call with `tree_options={...}` using
    the names without the `tree_` prefix): `tree_policy` is "beam" (DART's continuity-aware beam search scored by
    the N-gram table, with the reference defaults below) or "topk" (the plain per-level top-k tree); `tree_budget` nodes
    below the root; `tree_top_k` tokens per level; `tree_beam_width` beams; level weight
    `(l + 1) ** -tree_level_decay`; logit weight `tree_logit_decay ** l`; N-gram weight `tree_ngram_weight`;
    `tree_ngram_at_root` scores level 0 with the N-gram too (paper variant); `tree_full_softmax` normalises the
    draft probabilities over the whole vocabulary instead of the top-k (paper variant). With `tree_adaptive`
    `tree_budget` is the largest tree, and each step uses the budget the measured target forward costs and the
    draft's acceptance say is fastest, down to plain decoding when drafting loses (`dart_hf.budget`); it also
    weighs verifying, instead of a drafted tree, up to `tree_lookup_length` tokens copied from where the last
    `tree_lookup_max_match` tokens (or fewer) occurred earlier in the sequence (`dart_hf.lookup`; 0 turns it off).
    When sampling (T > 0), `tree_sample_drafts` > 0 drafts a chain whose tokens are drawn from the draft's
    distributions at `tree_sample_drafts` times the user's temperature and verified by speculative sampling
    (`dart_hf.tree.SampledChainPolicy`); 0 keeps the deterministic trees of `tree_policy` for sampling too. With
    `tree_compare_policies` and `tree_adaptive`, each sampling step drafts with whichever of the drawn chain and the
    deterministic tree the measured costs and acceptance make faster (`dart_hf.budget.PolicyChoice`).
    """

    model_type = "dart"

    vocab_size: int = 32000
    draft_vocab_size: int | None = None
    hidden_size: int = 4096
    target_hidden_size: int | None = None
    intermediate_size: int = 11008
    num_hidden_layers: int = 1
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    rope_parameters: RopeParameters | dict | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    draft_length: int = 8
    feature_layers: list[int] | None = None
    double_final_norm: bool = False
    feature_norm: bool = False
    feature_dropout: float = 0.0
    mask_rep_init_std: float = 1.0
    # the tree and decoding defaults: `DecodingOptions` holds them (and checks them, `validate_architecture`)
    tree_policy: str = DecodingOptions.policy
    tree_budget: int = DecodingOptions.budget
    tree_top_k: int = DecodingOptions.top_k
    tree_beam_width: int = DecodingOptions.beam_width
    tree_level_decay: float = DecodingOptions.level_decay
    tree_logit_decay: float = DecodingOptions.logit_decay
    tree_ngram_weight: float = DecodingOptions.ngram_weight
    tree_ngram_at_root: bool = DecodingOptions.ngram_at_root
    tree_full_softmax: bool = DecodingOptions.full_softmax
    tree_adaptive: bool = DecodingOptions.adaptive
    tree_lookup_length: int = DecodingOptions.lookup_length
    tree_lookup_max_match: int = DecodingOptions.lookup_max_match
    tree_sample_drafts: float = DecodingOptions.sample_drafts
    tree_compare_policies: bool = DecodingOptions.compare_policies

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        super().__post_init__(**kwargs)

    def validate_architecture(self):
        """Part of `@strict` validation: the values a draft cannot be built from."""
        if self.draft_length < 1:
            raise ValueError(f"draft_length must be at least 1, got {self.draft_length}.")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size ({self.draft_vocab_size}) cannot exceed the target vocabulary size "
                f"vocab_size ({self.vocab_size})."
            )
        if self.feature_layers is not None and len(self.feature_layers) != 3:
            raise ValueError(
                f"feature_layers must name exactly three target hidden-state indices (low, mid, high), "
                f"got {self.feature_layers}."
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})."
            )
        DecodingOptions.from_config(self)  # the tree fields, checked where every decoding option is

    @classmethod
    def from_llama_dict(cls, config_dict: dict[str, Any]) -> DartConfig:
        """Translate the plain Llama config of a released DART draft (`"model_type": "llama"` plus
        `draft_length`, `draft_vocab_size` and optionally `target_hidden_size`) into a `DartConfig` that computes
        the reference implementation's logits: the reference appends `draft_length` mask rows and keeps
        `draft_length + 1` rows of logits, where this config's `draft_length` counts the logit rows; and it applies
        the final norm twice (`double_final_norm`)."""
        known = set(cls.__dataclass_fields__)
        translated = {key: value for key, value in config_dict.items() if key in known}
        for legacy in ("rope_theta", "rope_scaling"):
            if config_dict.get(legacy) is not None:
                translated[legacy] = config_dict[legacy]
        translated.pop("model_type", None)
        translated.pop("architectures", None)
        translated.pop("transformers_version", None)
        translated["num_hidden_layers"] = 1
        translated["draft_length"] = config_dict.get("draft_length", cls.draft_length - 1) + 1
        translated["double_final_norm"] = True
        return cls(**translated)
