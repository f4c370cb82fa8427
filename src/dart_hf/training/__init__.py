"""Training DART drafts: data (prompts, self-distillation), the prefix-shared layout, the loss, the Trainer."""

from .data import (
    DartDataCollator,
    conversation_examples,
    load_conversations,
    load_examples,
    mix_examples,
    self_distill,
    tokenize_conversation,
)
from .feature_cache import CachedFeatureDataset, FeatureCache, build_feature_cache
from .layout import PrefixSharedLayout, prefix_shared_layout
from .loss import dart_loss
from .trainer import DartTrainer, DartTrainingArguments, evaluate_draft
from .widen import widen_mlp

__all__ = [
    "CachedFeatureDataset",
    "FeatureCache",
    "build_feature_cache",
    "DartDataCollator",
    "DartTrainer",
    "DartTrainingArguments",
    "conversation_examples",
    "PrefixSharedLayout",
    "dart_loss",
    "evaluate_draft",
    "load_conversations",
    "load_examples",
    "mix_examples",
    "prefix_shared_layout",
    "self_distill",
    "tokenize_conversation",
    "widen_mlp",
]
