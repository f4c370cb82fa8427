"""DecodingOptions: every tree and decode-loop setting of one DART `generate` call, resolved once, checked once.

The defaults below are the only ones in the package: `DartConfig`'s `tree_*` fields and the tree policies take
theirs from here. A call's options are the draft config's `tree_*` fields, with the call's `tree_options` (names
without the `tree_` prefix) and the `tree_budget` / `tree_top_k` shortcuts on top:

    options = DecodingOptions.resolve(draft.config, tree_options={"budget": 30}, tree_top_k=10)

This module also holds the checks of what a call gives `generate` (the generation config, the prompt), so that a
bad input is refused in one place, with the fix, before any forward runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache, GenerationConfig

# fields of DecodingOptions that steer the decode loop rather than the tree policy
LOOP_FIELDS = ("adaptive", "lookup_length", "lookup_max_match", "sample_drafts", "compare_policies")


def check_positive_int(name: str, value, default: int) -> None:
    """Raise a ValueError naming `name` and the fix unless `value` is an integer >= 1 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{name} must be a positive integer, got {value!r}. Pass an integer >= 1 (the default is {default}); "
            "to decode without a draft, call `generate` without `assistant_model`."
        )


@dataclass(frozen=True)
class DecodingOptions:
    """The settings of one DART call.

    Tree policy: `policy` "beam" (DART's beam search scored by the N-gram table) or "topk" (per-level top-k);
    `budget` nodes below the root (the largest tree when `adaptive`); `top_k` tokens per level; `beam_width` beams;
    level weight `(l + 1) ** -level_decay`; logit weight `logit_decay ** l`; N-gram weight `ngram_weight`;
    `ngram_at_root` scores level 0 with the N-gram too; `full_softmax` normalises draft probabilities over the whole
    vocabulary instead of the top-k; `use_ngram=False` searches without the draft's N-gram table.

    Decode loop: `adaptive` lets the controller pick each step's budget, down to plain decoding (`dart_hf.budget`);
    `lookup_length` tokens at most of a context-lookup chain (0: off; needs `adaptive`), found after matching up to
    `lookup_max_match` tokens; when sampling, `sample_drafts` > 0 drafts a chain of tokens drawn at that multiple
    of the user's temperature (0 keeps deterministic trees), and `compare_policies` weighs that chain against the
    deterministic tree each step (with `adaptive`)."""

    policy: str = "beam"
    budget: int = 60
    top_k: int = 25
    beam_width: int = 20
    level_decay: float = 0.7
    logit_decay: float = 0.9
    ngram_weight: float = 0.5
    ngram_at_root: bool = False
    full_softmax: bool = False
    use_ngram: bool = True
    adaptive: bool = True
    lookup_length: int = 10
    lookup_max_match: int = 3
    sample_drafts: float = 0.7
    compare_policies: bool = True

    def __post_init__(self):
        if self.policy not in ("beam", "topk"):
            raise ValueError(f"Unknown tree policy {self.policy!r}; use 'beam' or 'topk'.")
        for name in ("budget", "top_k", "beam_width"):
            check_positive_int(f"tree_{name}", getattr(self, name), getattr(DecodingOptions, name))
        lookup_length = self.lookup_length
        if isinstance(lookup_length, bool) or not isinstance(lookup_length, (int, np.integer)) or lookup_length < 0:
            raise ValueError(f"lookup_length must be an integer >= 0 (0 turns context lookup off), got {lookup_length!r}.")
        check_positive_int("lookup_max_match", self.lookup_max_match, DecodingOptions.lookup_max_match)
        if not self.sample_drafts >= 0:
            raise ValueError(
                f"sample_drafts must be >= 0 (0 keeps deterministic trees when sampling), got {self.sample_drafts}."
            )

    @classmethod
    def names(cls) -> list[str]:
        return [option.name for option in dataclasses.fields(cls)]

    @classmethod
    def from_config(cls, config) -> DecodingOptions:
        """The options a `DartConfig` (or any object with `tree_<name>` attributes) holds."""
        return cls(**{name: getattr(config, f"tree_{name}") for name in cls.names() if hasattr(config, f"tree_{name}")})

    @classmethod
    def resolve(
        cls, config, tree_options: dict | None = None, tree_budget: int | None = None, tree_top_k: int | None = None
    ) -> DecodingOptions:
        """The config's options, then `tree_options` (names without `tree_`), then the two shortcuts."""
        overrides = dict(tree_options or {})
        unknown = set(overrides) - set(cls.names())
        if unknown:
            raise ValueError(f"Unknown tree option(s) {sorted(unknown)}; valid options: {cls.names()}.")
        overrides.update({k: v for k, v in (("budget", tree_budget), ("top_k", tree_top_k)) if v is not None})
        return dataclasses.replace(cls.from_config(config), **overrides)

    def lookup_chain_length(self) -> int:
        """The longest context-lookup chain a step may verify: whether one pays is the controller's call, so none
        without `adaptive`."""
        return self.lookup_length if self.adaptive else 0


def decoding_mode(generation_config: GenerationConfig) -> tuple:
    """What decides a tree's acceptance besides the text: greedy, or sampling with its temperature and truncation
    (sampling at T=1 accepts far fewer drafted tokens than greedy decoding of the same text)."""
    if not generation_config.do_sample:
        return ("greedy",)
    warpers = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
    return ("sample",) + tuple(getattr(generation_config, name, None) for name in warpers)


def check_generation_config(input_ids: torch.Tensor, generation_config: GenerationConfig) -> None:
    """Refuse, with the fix, what DART tree decoding does not run: beam search, no cache, a cache other than a
    DynamicCache."""
    if generation_config.num_beams != 1:
        raise ValueError(f"DART tree decoding cannot run beam search (num_beams={generation_config.num_beams}).")
    if generation_config.use_cache is False:
        raise ValueError(
            "DART tree decoding keeps the target's KV cache to verify each tree against it: drop use_cache=False."
        )
    if generation_config.cache_implementation not in (None, "dynamic"):
        raise ValueError(
            f"DART tree decoding needs a DynamicCache; cache_implementation={generation_config.cache_implementation!r} "
            "is not supported."
        )


def check_fresh_cache(cache) -> None:
    """Raise a ValueError with the fix unless `cache` (the one `generate` prepared) is an empty DynamicCache."""
    if not isinstance(cache, DynamicCache) or cache.get_seq_length() > 0:
        raise ValueError(
            "DART tree decoding needs a fresh DynamicCache; a static cache or a cache that already holds a prefix "
            "is not supported (drop `cache_implementation` / `past_key_values`)."
        )


def check_prompt_not_empty(input_ids: torch.Tensor) -> None:
    """Raise a ValueError with the fix when `input_ids` `[1, S]` (padding stripped) holds no token."""
    if input_ids.shape[-1] == 0:
        raise ValueError(
            "The prompt is empty (or all padding): DART decoding starts from at least one prompt token. Pass a "
            "non-empty prompt, e.g. one that begins with the tokenizer's BOS token."
        )


def strip_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a left-padded single sequence `[1, S]` into (padding `[1, P]`, real tokens `[1, S - P]`)."""
    if attention_mask is None or bool(attention_mask.all()):
        return input_ids[:, :0], input_ids
    num_pad = int((attention_mask[0] == 0).sum())
    if bool(attention_mask[0, :num_pad].any()) or not bool(attention_mask[0, num_pad:].all()):
        raise ValueError(
            "DART tree decoding accepts left padding only: each row's attention_mask must be 0...0 1...1 (set "
            "tokenizer.padding_side = 'left')."
        )
    return input_ids[:, :num_pad], input_ids[:, num_pad:]
