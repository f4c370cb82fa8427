"""The DART draft as vLLM's EAGLE-3 Llama draft with DART's mask rows (parallel drafting).

vLLM's parallel drafting appends K - 1 mask slots after each request's last real row and drafts K tokens from one
forward, the same shape as a DART step. Its EAGLE-3 draft fills a mask slot with `fc(mask_hidden)` as the feature
and the mask token's embedding; DART's drafts do not: a mask row's attention input is the learned `mask_rep` (2H)
as it is, in place of the [norm(embedding), norm(feature)] concatenation of a real row, and its residual is
`mask_rep[:H]`. This model finds the mask slots by their input id (`mask_token_id`, outside the vocabulary) and
builds them that way; real rows are computed exactly as vLLM's EAGLE-3 draft computes them. Drafts in the released
DART layout apply the final norm twice (`dart_double_final_norm`).
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM, LlamaModel
from vllm.model_executor.models.utils import get_draft_quant_config, maybe_prefix


class DartEagle3Model(LlamaModel):
    """vLLM's one-layer EAGLE-3 Llama model plus the layer's `mask_rep` and DART's mask-row forward."""

    def __init__(self, *, vllm_config: VllmConfig, start_layer_id: int = 0, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, start_layer_id=start_layer_id, prefix=prefix)
        if len(self.layers) != 1:
            raise ValueError(f"A DART draft has one decoder layer; this config asks for {len(self.layers)}.")
        self.layers[0].mask_rep = nn.Parameter(torch.zeros(2 * self.config.hidden_size), requires_grad=False)
        self.mask_token_id = int(self.config.mask_token_id)
        self.double_final_norm = bool(getattr(self.config, "dart_double_final_norm", False))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        # the mask id lies outside the vocabulary; its rows' embeddings are replaced by mask_rep anyway
        return self.embed_tokens(torch.where(input_ids == self.mask_token_id, 0, input_ids))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        input_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids `[N]` (mask slots carry `mask_token_id`), positions `[N]`, hidden_states `[N, H]` (fc of the
        target's three feature layers; mask slots carry whatever vLLM put there) -> (normed hidden `[N, H]` for the
        head, pre-norm hidden `[N, H]`)."""
        if input_embeds is None:
            input_embeds = self.embed_input_ids(input_ids)
        layer = self.layers[0]
        is_mask = (input_ids == self.mask_token_id).unsqueeze(-1)
        rows = torch.cat([layer.input_layernorm(input_embeds), layer.hidden_norm(hidden_states)], dim=-1)
        mask_rep = layer.mask_rep.to(rows.dtype)
        rows = torch.where(is_mask, mask_rep, rows)
        residual = torch.where(is_mask, mask_rep[: self.config.hidden_size], hidden_states)
        attended = layer.self_attn(positions=positions, hidden_states=rows)
        hidden, residual = layer.post_attention_layernorm(attended, residual)
        hidden = layer.mlp(hidden)
        hidden, prenorm = self.norm(hidden, residual)
        if self.double_final_norm:  # the released drafts' reference inference norms twice
            hidden = self.norm(hidden)
        return hidden, prenorm


class Eagle3DartForCausalLM(Eagle3LlamaForCausalLM):
    """A dart-hf draft exported by `dart-hf export-vllm`, served by vLLM's EAGLE-3 proposer with
    `parallel_drafting=True` and `num_speculative_tokens` = the draft's `dart_draft_length`."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        speculative_config = vllm_config.speculative_config
        if speculative_config is None or not speculative_config.parallel_drafting:
            raise ValueError(
                "A DART draft drafts all its tokens in one forward: serve it with speculative_config "
                '{"method": "eagle3", "parallel_drafting": true, "num_speculative_tokens": <draft length>}.'
            )
        self.config = speculative_config.draft_model_config.hf_config
        if getattr(self.config, "draft_vocab_size", None) is None:
            self.config.draft_vocab_size = self.config.vocab_size
        target_layer_num = vllm_config.model_config.get_total_num_hidden_layers()
        self.config.target_layer_count = target_layer_num
        self.model = DartEagle3Model(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"), start_layer_id=target_layer_num
        )
        self.lm_head = ParallelLMHead(
            self.config.draft_vocab_size, self.config.hidden_size,
            quant_config=get_draft_quant_config(vllm_config), prefix=maybe_prefix(prefix, "lm_head"),
        )
        self.logits_processor = LogitsProcessor(self.config.draft_vocab_size, scale=1.0)
        if self.config.draft_vocab_size != vllm_config.model_config.get_vocab_size():
            self.draft_id_to_target_id = nn.Parameter(
                torch.zeros(self.config.draft_vocab_size, dtype=torch.long), requires_grad=False
            )
        else:
            self.draft_id_to_target_id = None
        self.use_parallel_drafting = True
        self.register_buffer("mask_hidden", torch.zeros(1, self.model.fc_input_size), persistent=False)
