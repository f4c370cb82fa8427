"""DartDraftModel: a one-layer drafter that reads three target layers and predicts `draft_length` tokens at once.

Shapes used below: B batch, T new real rows, M appended mask rows, P cached rows, H target hidden size,
V target vocabulary, V_d draft vocabulary, D = draft_length - 1.

The draft knows nothing of trees or decoding: it maps target features and next-token ids to logits.
"""

import contextlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    repeat_kv,
    rotate_half,
)
from transformers.utils import ModelOutput
from transformers.utils.hub import cached_file

from .attention import reads_grouped_heads_in_place
from .configuration_dart import DartConfig
from .files import with_default_permissions
from .ngram import NGRAM_FILENAME, NgramTable


@dataclass
class DartDraftOutput(ModelOutput):
    """Output of [`DartDraftModel.forward`].

    logits: `[B, R, V_d]` for the kept rows R (by default the last real row and the mask rows, R = D + 1).
    cache: the draft's KV cache, holding the real rows and, until cropped, the mask rows.
    """

    logits: torch.Tensor | None = None
    cache: Cache | None = None


class DartAttention(nn.Module):
    """Self-attention whose query, key and value projections read the 2H-wide [embedding, feature] rows."""

    def __init__(self, config: DartConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        input_size = 2 * config.hidden_size
        bias = config.attention_bias
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(input_size, self.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(input_size, self.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache: Cache | None = None,
        query_rows: int | None = None,
    ) -> torch.Tensor:
        """hidden_states `[B, S, 2H]` -> `[B, Q, H]`. attention_mask: additive float `[B or 1, 1, S, P + S]`, or a
        FlexAttention `BlockMask` over the S rows (training). query_rows: attend from the last Q rows only (all S
        rows still give keys and values): the output of rows nobody reads is skipped (a prompt's catch-up)."""
        batch_size, seq_len, _ = hidden_states.shape
        query_rows = seq_len if query_rows is None else query_rows
        query = self.q_proj(hidden_states[:, seq_len - query_rows :])
        query = query.view(batch_size, query_rows, -1, self.head_dim).transpose(1, 2)
        shape = (batch_size, seq_len, -1, self.head_dim)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)

        cos, sin = position_embeddings  # [B, S, D]
        query = rotate(query, cos[:, seq_len - query_rows :], sin[:, seq_len - query_rows :])
        key = rotate(key, cos, sin)
        if query_rows < seq_len:
            attention_mask = attention_mask[..., seq_len - query_rows :, :]
        if cache is not None:
            key, value = cache.update(key, value, 0)

        if not isinstance(attention_mask, torch.Tensor):  # a FlexAttention BlockMask (training layout)
            output = flex_attention_fn()(
                query, key, value, block_mask=attention_mask, scale=self.scaling, enable_gqa=True
            )
        elif reads_grouped_heads_in_place(query.device):
            output = F.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, scale=self.scaling, enable_gqa=True
            )
        else:
            key = repeat_kv(key, self.num_key_value_groups)
            value = repeat_kv(value, self.num_key_value_groups)
            output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=self.scaling)
        output = output.transpose(1, 2).reshape(batch_size, query_rows, -1)
        return self.o_proj(output)


def rotate(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of query or key states `[B, heads, S, D]` by cos, sin `[B, S, D]`."""
    return states * cos.unsqueeze(1) + rotate_half(states) * sin.unsqueeze(1)


def flex_attention_fn():
    """torch's `flex_attention`, compiled where torch.compile makes its fused kernel (CUDA); eager elsewhere (exact
    but unfused: the training code only picks it on CUDA unless asked)."""
    from torch.nn.attention.flex_attention import flex_attention

    global _COMPILED_FLEX_ATTENTION
    if not torch.cuda.is_available():
        return flex_attention
    if _COMPILED_FLEX_ATTENTION is None:
        _COMPILED_FLEX_ATTENTION = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX_ATTENTION


_COMPILED_FLEX_ATTENTION = None


class DartDecoderLayer(nn.Module):
    """The draft's single decoder layer (`midlayer` in the released checkpoints)."""

    def __init__(self, config: DartConfig):
        super().__init__()
        hidden_size = config.hidden_size
        self.self_attn = DartAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(hidden_size, eps=config.rms_norm_eps)
        self.mask_rep = nn.Parameter(torch.empty(2 * hidden_size))


class DartPreTrainedModel(PreTrainedModel):
    """Weight initialisation and loading rules shared by DART draft models."""
    config: DartConfig
    base_model_prefix = "dart"
    _supports_sdpa = True
    _keys_to_ignore_on_load_unexpected = [r"^embed_tokens\.", r"^model\.embed_tokens\."]

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DartDecoderLayer):
            init.normal_(module.mask_rep, mean=0.0, std=self.config.mask_rep_init_std)
        if isinstance(module, DartDraftModel):
            d2t = module.unknown_vocab_mapping(self.config)
            init.copy_(module.d2t, d2t)
            init.copy_(module.t2d, module.draft_token_mask(d2t, self.config))


class DartDraftModel(DartPreTrainedModel):
    r"""
    The DART drafter. One forward pass maps the target's features of T new positions, plus
    M appended mask rows, to logits for the last real row and every mask row.

    Attach a target with [`DartDraftModel.bind`] (or `from_pretrained(..., target=target)`): the draft then
    embeds tokens with the target's frozen input embedding, which is never stored in the draft, and
    `target.generate(..., assistant_model=draft)` runs DART tree decoding.
    """

    def __init__(self, config: DartConfig):
        super().__init__(config)
        hidden_size, target_hidden_size = config.hidden_size, config.target_hidden_size
        self.fc = nn.Linear(3 * target_hidden_size, hidden_size, bias=False)
        if config.feature_norm:
            self.feature_norms = nn.ModuleList(
                LlamaRMSNorm(target_hidden_size, eps=config.rms_norm_eps) for _ in range(3)
            )
        self.feature_dropout = nn.Dropout(config.feature_dropout)
        self.midlayer = DartDecoderLayer(config)
        self.norm = LlamaRMSNorm(hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden_size, config.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        # filled by _init_weights (an unknown mapping) or by the checkpoint
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self._bound_target: tuple[PreTrainedModel, ...] = ()
        self.ngram: NgramTable | None = None  # travels with the draft: saved beside the weights, loaded with them
        self.stats = None  # the last DART `generate` call's `DartStats`
        self.step_observers = []  # callables given each decoding step's `planner.StepOutcome` and planner
        self._controller_state = None  # created on first use: `controller_state`
        self.post_init()

    # ----- vocabulary mapping -------------------------------------------------------------------------------------

    @staticmethod
    def unknown_vocab_mapping(config: DartConfig) -> torch.Tensor:
        """d2t for a fresh draft: identity for a full vocabulary; for a reduced one an invalid mapping (every
        draft id maps to -1) that `bind` refuses until the real mapping is loaded or set."""
        ids = torch.arange(config.draft_vocab_size, dtype=torch.long, device="cpu")
        if config.draft_vocab_size == config.vocab_size:
            return torch.zeros_like(ids)
        return -ids - 1

    @staticmethod
    def draft_token_mask(d2t: torch.Tensor, config: DartConfig) -> torch.Tensor:
        """t2d `[V]` bool: which target ids exist in the draft vocabulary given d2t `[V_d]`."""
        d2t = d2t.cpu()
        target_ids = torch.arange(d2t.shape[0]) + d2t
        mask = torch.zeros(config.vocab_size, dtype=torch.bool)
        valid = (target_ids >= 0) & (target_ids < config.vocab_size)
        mask[target_ids[valid]] = True
        return mask

    def set_vocab_mapping(self, draft_to_target_ids: torch.Tensor) -> None:
        """Set the reduced vocabulary: `draft_to_target_ids[i]` is the target id of draft id i, `[V_d]`."""
        ids = torch.as_tensor(draft_to_target_ids, dtype=torch.long, device=self.d2t.device)
        if ids.shape != self.d2t.shape:
            raise ValueError(
                f"draft_to_target_ids must have one entry per draft token ({self.d2t.shape[0]}), got {tuple(ids.shape)}."
            )
        d2t = ids - torch.arange(ids.shape[0], device=ids.device)
        self.d2t.copy_(d2t)
        self.t2d.copy_(self.draft_token_mask(d2t, self.config).to(self.t2d.device))
        self.check_vocab_mapping()

    def check_vocab_mapping(self) -> None:
        """Raise if d2t does not map the draft vocabulary one-to-one into the target vocabulary."""
        target_ids = self.draft_to_target(torch.arange(self.d2t.shape[0], device=self.d2t.device))
        vocab_size = self.config.vocab_size
        if bool(((target_ids < 0) | (target_ids >= vocab_size)).any()) or target_ids.unique().numel() != len(target_ids):
            raise ValueError(
                f"The draft vocabulary mapping (d2t) is unknown or invalid: its {self.config.draft_vocab_size} draft ids "
                f"must map one-to-one into the target vocabulary of {vocab_size} ids. Load a checkpoint that holds the "
                "`d2t` buffer, or call `draft.set_vocab_mapping(draft_to_target_ids)`."
            )

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids (any shape) to target-vocabulary ids."""
        return draft_ids + self.d2t[draft_ids]

    # ----- binding to a target ------------------------------------------------------------------------------------

    @classmethod
    def from_target(
        cls, target: PreTrainedModel, draft_to_target_ids: torch.Tensor | None = None, **overrides
    ) -> "DartDraftModel":
        """A fresh, untrained draft sized for `target` (hidden size, heads, vocabulary, feature layers), bound to it.

        Keyword overrides go to `DartConfig` (for example `draft_vocab_size`, `tree_budget`). A reduced draft
        vocabulary needs `draft_to_target_ids` `[V_d]`: the target id of each draft id."""
        text_config = target.config.get_text_config()
        num_layers = text_config.num_hidden_layers
        rope_parameters = getattr(text_config, "rope_parameters", None)
        if isinstance(rope_parameters, dict) and "full_attention" in rope_parameters:
            # one RoPE per layer type (Gemma 3): the draft attends to the whole sequence, as full-attention layers do
            rope_parameters = rope_parameters["full_attention"]
        fields = {
            "vocab_size": text_config.vocab_size,
            "hidden_size": text_config.hidden_size,
            "target_hidden_size": text_config.hidden_size,
            "intermediate_size": getattr(text_config, "intermediate_size", 4 * text_config.hidden_size),
            "num_attention_heads": text_config.num_attention_heads,
            "num_key_value_heads": getattr(text_config, "num_key_value_heads", None)
            or text_config.num_attention_heads,
            "head_dim": getattr(text_config, "head_dim", None),
            "rms_norm_eps": getattr(text_config, "rms_norm_eps", 1e-6),
            "max_position_embeddings": getattr(text_config, "max_position_embeddings", 2048),
            "rope_parameters": rope_parameters,
            "feature_layers": default_feature_layers(num_layers),
            "eos_token_id": getattr(text_config, "eos_token_id", None),
        }
        fields.update(overrides)
        draft = cls(DartConfig(**fields)).to(device=target.device, dtype=target.dtype).eval()
        if draft_to_target_ids is not None:
            draft.set_vocab_mapping(draft_to_target_ids)
        return draft.bind(target)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path,
        *model_args,
        target: PreTrainedModel | None = None,
        ngram: "NgramTable | str | os.PathLike | None" = None,
        **kwargs,
    ):
        """`PreTrainedModel.from_pretrained`, plus: accepts the plain Llama config of the released DART drafts;
        loads the N-gram table saved beside the weights (`ngram.safetensors`, local folder or Hub repo), or the one
        given as `ngram=` (a table, a file path, or a folder / Hub repo holding `ngram.safetensors`); and, with
        `target=`, binds the loaded draft to it."""
        hub_kwargs = {
            key: kwargs[key]
            for key in ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder")
            if key in kwargs
        }
        if "config" not in kwargs:
            config_dict, _ = DartConfig.get_config_dict(pretrained_model_name_or_path, **hub_kwargs)
            if config_dict.get("model_type") == "llama":  # released drafts read the reference's default layers
                kwargs["config"] = DartConfig.from_llama_dict(config_dict)
            elif not config_dict.get("feature_layers"):
                raise ValueError(
                    f"The draft config in {pretrained_model_name_or_path} names no `feature_layers`: a trained draft "
                    "only works with the target layers it was trained on. Add them to its config.json (the "
                    "`feature_layers` the draft was trained with; dart-hf writes them when it saves a bound draft)."
                )
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        draft = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) with output_loading_info
        if isinstance(ngram, NgramTable):
            draft.ngram = ngram
        elif ngram is not None and os.path.isfile(ngram):
            draft.ngram = NgramTable.load(ngram)
        else:
            source = pretrained_model_name_or_path if ngram is None else ngram
            table_file = cached_file(source, NGRAM_FILENAME, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
            if table_file is None and ngram is not None:
                raise ValueError(f"No {NGRAM_FILENAME} found in {ngram!r} (a folder or Hub repo was expected).")
            draft.ngram = NgramTable.load(table_file) if table_file is not None else None
        if target is not None:
            draft.to(device=target.device).bind(target)
        return loaded

    def __getattr__(self, name: str):
        # Transformers' own assisted decoding reads `assistant_model.generation_config` first: reaching it means the
        # generating model was never bound to this draft, so its `generate` does not route to DART.
        if name == "generation_config":
            raise AttributeError(
                "This model's `generate` was not bound to the DART draft, so Transformers tried to use the draft as a "
                "classic assistant model. Call `draft.bind(target)` with the model you generate with (or load the "
                "draft with `DartDraftModel.from_pretrained(path, target=target)`), then "
                "`target.generate(..., assistant_model=draft)`."
            )
        return super().__getattr__(name)

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, plus the N-gram table (if any) as `ngram.safetensors` beside the
        weights, so `push_to_hub` and `from_pretrained` carry it too. The weight files get the umask's permissions
        (safetensors writes them private to their owner)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        for path in Path(save_directory).glob("model*.safetensors"):
            with_default_permissions(path)
        if self.ngram is not None:
            self.ngram.save(os.path.join(save_directory, NGRAM_FILENAME))

    def push_to_hub(self, repo_id: str, **kwargs):
        """Upload the draft (weights, config, remote code, N-gram table) with a generated model card (`README.md`
        with the Hub's metadata header: `library_name: dart-hf`, `base_model`, tags) in one commit.

        Keyword arguments: `commit_message`, `private`, `token`, `revision`, `create_pr`; `model_card` (a ready
        `huggingface_hub.ModelCard`) or the card fields of `dart_hf.model_card.draft_model_card` (`base_model`,
        `results`, `training`, `license`, `datasets`, `limitations`). Returns the `CommitInfo`."""
        model_card = importlib.import_module(f"{__package__}.model_card")  # by name: see `bind`
        return model_card.push_draft_to_hub(self, repo_id, **kwargs)

    @property
    def target(self) -> PreTrainedModel:
        """The target model this draft is bound to (`bind`); raises when unbound."""
        if not self._bound_target:
            raise RuntimeError(
                "This DART draft is not bound to a target model. Call `draft.bind(target)` or load it with "
                "`DartDraftModel.from_pretrained(path, target=target)` before generating."
            )
        return self._bound_target[0]

    def bind(self, target: PreTrainedModel) -> "DartDraftModel":
        """Attach `target`: check that it fits this draft, and route `target.generate(..., assistant_model=self)`
        to DART tree decoding. The target is held by reference, never as a submodule (it is not saved). Binding
        again, or to another target, is allowed; a model once bound keeps its routing until `unbind`.
        A `torch.compile(target)` wrapper binds the model it wraps: `generate` and the routing live there, and the
        wrapper forwards `generate` to it."""
        target = uncompiled(target)
        self.check_target(target)
        self._bound_target = (target,)
        self._routing_module().install_generate_router(target)
        return self

    def unbind(self) -> "DartDraftModel":
        """Detach the bound target and give it back its own `generate` (no DART routing)."""
        if self._bound_target:
            self._routing_module().remove_generate_router(self._bound_target[0])
        self._bound_target = ()
        return self

    @contextlib.contextmanager
    def generating_with(self, model: PreTrainedModel):
        """Within this block the draft runs with `model` as its target (its embeddings): the model that generates,
        which may be the bound target, a copy of it or any model the draft fits. The binding is restored after."""
        if self._bound_target and self._bound_target[0] is model:
            yield self
            return
        self.check_target(model)
        bound = self._bound_target
        self._bound_target = (model,)
        try:
            yield self
        finally:
            self._bound_target = bound

    def check_target(self, target: PreTrainedModel) -> None:
        """Raise a ValueError naming the mismatch if `target` cannot run with this draft (hidden size, vocabulary,
        layer count, cache layer types, vocabulary mapping); fill `feature_layers` from it where unset."""
        text_config = target.config.get_text_config()
        if target.config.is_encoder_decoder:
            raise ValueError("DART drafts need a decoder-only target; got an encoder-decoder model.")
        checks = [
            ("hidden size", self.config.target_hidden_size, text_config.hidden_size),
            ("vocabulary size", self.config.vocab_size, target.get_input_embeddings().weight.shape[0]),
        ]
        for name, draft_value, target_value in checks:
            if draft_value != target_value:
                raise ValueError(
                    f"The draft expects a target {name} of {draft_value}, but the target has {target_value}. "
                    "Use a draft trained for this target, or build one with `DartDraftModel.from_target(target)`."
                )
        num_layers = text_config.num_hidden_layers
        if self.config.feature_layers is None:
            self.config.feature_layers = default_feature_layers(num_layers)
        if max(self.config.feature_layers) > num_layers or min(self.config.feature_layers) < 0:
            raise ValueError(
                f"The draft reads target hidden states {self.config.feature_layers}, but the target has only "
                f"{num_layers} layers (valid hidden-state indices are 0..{num_layers})."
            )
        check_cache_layers(target)
        self.check_vocab_mapping()
        if self.ngram is not None:
            self.ngram.check_fits(self.config.vocab_size)

    @property
    def controller_state(self):
        """What the decode loop's budget controller remembers across `generate` calls with this draft (calibrated
        costs, evidence per decoding mode): a `dart_hf.controller_state.ControllerState`, created on first use."""
        if self._controller_state is None:
            self._controller_state = importlib.import_module(f"{__package__}.controller_state").ControllerState()
        return self._controller_state

    @controller_state.setter
    def controller_state(self, state) -> None:
        self._controller_state = state

    def _routing_module(self):
        # Imported by name at call time rather than with `from .routing import ...`: a saved draft carries a
        # copy of this file for `trust_remote_code`, and Transformers copies every `from .x import` it finds;
        # the decoding stack (with its kernels subpackage, which that copy cannot follow) must stay out of it.
        return importlib.import_module(f"{__package__}.routing")

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target input embeddings of `input_ids` `[B, T]` -> `[B, T, H]` (frozen, taken from the bound target)."""
        with torch.no_grad():
            return self.target.get_input_embeddings()(input_ids).to(self.dtype)

    # ----- forward ------------------------------------------------------------------------------------------------

    def forward(
        self,
        target_hidden_states: torch.Tensor,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        num_masks: int | None = None,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor | None = None,
    ) -> DartDraftOutput:
        r"""
        target_hidden_states: `[B, T, 3H]`, the three feature layers of the target at T new real positions,
            concatenated low, mid, high.
        input_ids / inputs_embeds: `[B, T]` / `[B, T, H]`, the token that FOLLOWS each of those positions (real row t
            carries (h_t, emb(x_{t+1})) and predicts x_{t+2}).
        position_ids: `[B, T + M]`; default: the real rows continue after the cache, mask rows after them.
        num_masks: M mask rows appended after the real rows; default `draft_length - 1`.
        attention_mask: optional additive float mask `[B or 1, 1, T + M, P + T + M]`; default causal.
        logits_to_keep: how many trailing rows get the MLP and the head; default `num_masks + 1`, 0 keeps all; or a
            1D tensor of the row indices `[K]` that get them (training computes logits only where the loss reads).

        Returns logits `[B, R, V_d]` (R = kept rows) and the cache, which now also holds the M mask rows: crop them
        (`cache.crop(-M)`) before the next step.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds to the DART draft.")
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids)
        num_masks = self.config.draft_length - 1 if num_masks is None else num_masks
        logits_to_keep = num_masks + 1 if logits_to_keep is None else logits_to_keep
        batch_size, num_real, _ = inputs_embeds.shape
        layer = self.midlayer
        hidden_size = self.config.hidden_size

        features = target_hidden_states.to(self.dtype)
        if self.config.feature_norm:
            features = torch.cat([norm(part) for norm, part in zip(self.feature_norms, features.chunk(3, dim=-1))], -1)
        fused = self.fc(self.feature_dropout(features))
        rows = torch.cat([layer.input_layernorm(inputs_embeds), layer.hidden_norm(fused)], dim=-1)
        residual = fused
        if num_masks > 0:
            mask_rows = layer.mask_rep.view(1, 1, -1).expand(batch_size, num_masks, -1)
            rows = torch.cat([rows, mask_rows], dim=1)
            residual = torch.cat([residual, mask_rows[..., :hidden_size]], dim=1)

        past_len = cache.get_seq_length() if cache is not None else 0
        seq_len = num_real + num_masks
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + seq_len, device=rows.device).unsqueeze(0)
        if attention_mask is None:
            attention_mask = causal_mask(seq_len, past_len, rows.dtype, rows.device)
        position_embeddings = self.rotary_emb(rows, position_ids)

        # the attention output, the MLP and the head are per row: rows whose logits nobody reads skip them (their
        # keys and values still go to the cache and to the kept rows' attention); the trailing rows are cut out
        # inside the attention, a row subset (training's BlockMask layout) after it
        trailing_rows = not isinstance(logits_to_keep, torch.Tensor) and logits_to_keep > 0
        query_rows = seq_len
        if trailing_rows and isinstance(attention_mask, torch.Tensor):
            query_rows = min(logits_to_keep, seq_len)
        attended = layer.self_attn(rows, position_embeddings, attention_mask, cache, query_rows=query_rows)
        hidden = residual[:, seq_len - query_rows :] + attended
        if isinstance(logits_to_keep, torch.Tensor):
            hidden = hidden[:, logits_to_keep]
        elif logits_to_keep > 0:
            hidden = hidden[:, -logits_to_keep:]
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.norm(hidden)
        if self.config.double_final_norm:  # the released drafts' reference inference norms twice
            hidden = self.norm(hidden)
        logits = self.lm_head(hidden)
        return DartDraftOutput(logits=logits, cache=cache)


def default_feature_layers(num_layers: int) -> list[int]:
    """Three distinct feature layers as `output_hidden_states` indices: EAGLE-3's [2, L // 2, L - 3] (what the
    released drafts read) from 7 layers up; below that, where EAGLE-3's would repeat one, [1, L // 2, L - 1]."""
    if num_layers < 4:
        raise ValueError(
            f"Cannot choose three distinct feature layers for a target with {num_layers} layers; set "
            "`feature_layers` in the DartConfig explicitly."
        )
    if num_layers < 7:
        return [1, num_layers // 2, num_layers - 1]
    return [2, num_layers // 2, num_layers - 3]


def uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The model a `torch.compile(model)` wrapper holds (its `_orig_mod`), else `model` itself."""
    inner = getattr(model, "_orig_mod", None) if type(model).__name__ == "OptimizedModule" else None
    return inner if isinstance(inner, torch.nn.Module) else model


def causal_mask(seq_len: int, past_len: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive causal mask `[1, 1, S, P + S]`: row i sees cache rows and new rows up to itself."""
    query = torch.arange(seq_len, device=device).unsqueeze(1) + past_len
    key = torch.arange(past_len + seq_len, device=device).unsqueeze(0)
    mask = torch.zeros(seq_len, past_len + seq_len, dtype=dtype, device=device)
    mask.masked_fill_(key > query, torch.finfo(dtype).min)
    return mask.view(1, 1, seq_len, past_len + seq_len)


def check_cache_layers(target: PreTrainedModel) -> None:
    """Refuse targets whose cache holds state other than plain per-token keys and values (linear attention,
    recurrent state), since tree verification must keep exactly the accepted tokens in the cache."""
    cache = DynamicCache(config=target.config)
    for index, cache_layer in enumerate(cache.layers):
        if type(cache_layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise ValueError(
                f"Target layer {index} uses a {type(cache_layer).__name__} cache; DART tree verification supports "
                "full-attention and sliding-window attention layers only."
            )


# A saved draft carries this code and an `auto_map`, so it also loads with `trust_remote_code=True` where dart-hf
# is not installed.
DartConfig.register_for_auto_class()
DartDraftModel.register_for_auto_class("AutoModel")
