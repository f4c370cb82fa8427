"""DART inside Transformers' own assisted decoding loop: a `CandidateGenerator` that proposes a chain.

The tree path (`dart_generate`) verifies a whole token tree per step and is the fast way to run DART. This module
is for code that runs Transformers' `_assisted_decoding` itself (its speculative sampling, its output format,
its hooks): the draft still reads the target's three feature layers (through `requires_model_outputs` /
`model_kwargs_overrides`), predicts all levels in one forward pass, and proposes one chain per step:

- greedy: the best root-to-leaf path of the DART tree (the policy's best child at every level, N-gram aware);
- sampling: one token per level drawn from the draft's processed distribution, returned with those
  distributions so Transformers' speculative sampling accepts or resamples exactly.

    out = target.generate(**inputs, assistant_model=draft, dart_chain=True)   # after draft.bind(target)
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, PreTrainedModel
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.utils import ModelOutput

from .modeling_dart import DartDraftModel
from .options import check_prompt_not_empty
from .stats import DartStats
from .tree import Tree, TreePolicy


class DartCandidateGenerator(CandidateGenerator):
    """Proposes up to `draft_length` tokens per step from one DART draft forward pass.

    draft: a `DartDraftModel` bound to the target. tree_policy: builds the tree whose best path is the greedy
    chain. generation_config / logits_processor: the target's, as `_assisted_decoding` prepares them.
    """

    requires_model_outputs = True

    def __init__(
        self,
        draft: DartDraftModel,
        tree_policy: TreePolicy,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
    ):
        self.draft = draft
        self.tree_policy = tree_policy
        self.model_kwargs_overrides = {"output_hidden_states": list(draft.config.feature_layers)}
        self.max_length = generation_config.max_length
        self.do_sample = generation_config.do_sample
        self.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        self.cache = DynamicCache()
        self.num_masks = draft.config.draft_length - 1
        self.is_prefill = True
        self.chain_length = 0  # tokens proposed for the step being verified
        self.stats = DartStats()  # verify_steps, accepted_lengths (bonus token included) and tau, as the tree path

    @property
    def num_drafting_tokens(self) -> int:
        """The most tokens one step proposes (Transformers 5.25's `_assisted_decoding` sizes the target cache's
        past recording, `activate_past_recording(recurrent_states_to_keep=...)`, with it)."""
        return self.draft.config.draft_length

    @torch.no_grad()
    def get_candidates(
        self,
        input_ids: torch.LongTensor,
        model_kwargs: dict[str, Any] | None = None,
        model_outputs: ModelOutput | None = None,
        is_first_iteration: bool = False,
        n_last_matches: int = 0,
        **kwargs,
    ) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """input_ids `[1, S]` -> (input_ids followed by the chain `[1, S + C]`, its logits `[1, C, V]` or None)."""
        if is_first_iteration:  # the target's prefill must run first: the draft reads its features
            return input_ids, None
        if model_outputs is None or model_outputs.hidden_states is None:
            raise ValueError("DartCandidateGenerator needs the target's hidden states (model_kwargs_overrides).")
        num_new = input_ids.shape[1] - 1 if self.is_prefill else n_last_matches + 1
        self.is_prefill = False
        self.chain_length = 0
        layers = self.model_kwargs_overrides["output_hidden_states"]
        features = torch.cat([model_outputs.hidden_states[index][:, :num_new] for index in layers], dim=-1)
        draft_logits = self.draft(
            features.to(self.draft.device), input_ids=input_ids[:, -num_new:].to(self.draft.device), cache=self.cache
        ).logits[0]  # [L, V_d]
        self.cache.crop(-self.num_masks)

        length = min(draft_logits.shape[0], self.max_length - input_ids.shape[1] - 1)
        if length <= 0:
            return input_ids, None
        if self.do_sample:
            chain, chain_logits = self._sample_chain(input_ids, draft_logits[:length])
        else:
            tree = self.tree_policy(draft_logits, input_ids[0], self.draft.draft_to_target)
            chain, chain_logits = best_path(tree)[:length], None
        self.chain_length = len(chain)
        if not chain:
            return input_ids, None
        return torch.cat([input_ids, input_ids.new_tensor([chain])], dim=-1), chain_logits

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int) -> None:
        """Called by `_assisted_decoding` after each verification: records the step's acceptance."""
        if self.chain_length:
            self.stats.verify_steps += 1
            self.stats.accepted_lengths.append(int(num_matches) + 1)

    def _sample_chain(self, input_ids: torch.Tensor, draft_logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """One token per level from the processed draft distribution, in the target's vocabulary."""
        vocab_size = self.draft.config.vocab_size
        target_ids = self.draft.draft_to_target(torch.arange(draft_logits.shape[-1], device=draft_logits.device))
        logits = draft_logits.new_full((draft_logits.shape[0], vocab_size), float("-inf"), dtype=torch.float32)
        logits[:, target_ids] = draft_logits.float()
        ids = input_ids
        chain = []
        for level in range(logits.shape[0]):
            logits[level] = self.logits_processor(ids, logits[level : level + 1])[0]
            token = int(torch.multinomial(torch.softmax(logits[level], dim=-1), num_samples=1))
            chain.append(token)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=-1)
        return chain, logits[None].to(input_ids.device)


def best_path(tree: Tree) -> list[int]:
    """The tokens below the root along the best child at every level (lowest rank), down to a leaf."""
    ranks = tree.ranks if tree.ranks is not None else torch.arange(len(tree))
    parents = tree.parents.tolist()
    node, path = 0, []
    while True:
        children = [child for child in range(node + 1, len(tree)) if parents[child] == node]
        if not children:
            return path
        node = min(children, key=lambda child: int(ranks[child]))
        path.append(int(tree.tokens[node]))


@contextlib.contextmanager
def dart_candidate_generator(target: PreTrainedModel, draft: DartDraftModel, tree_policy: TreePolicy):
    """Within this block, `target`'s assisted decoding takes its candidates from DART (Transformers 5.x picks the
    candidate generator in `_get_candidate_generator`, which has no registry: this overrides it on the instance)."""
    previous = vars(target).get("_get_candidate_generator")  # an instance-level override of someone else's

    def get_candidate_generator(*args, generation_config, logits_processor, input_ids, **kwargs):
        check_prompt_not_empty(input_ids)
        generator = DartCandidateGenerator(draft, tree_policy, generation_config, logits_processor)
        draft.stats = generator.stats
        return generator

    target._get_candidate_generator = get_candidate_generator
    try:
        yield
    finally:
        del target._get_candidate_generator
        if previous is not None:
            target._get_candidate_generator = previous
