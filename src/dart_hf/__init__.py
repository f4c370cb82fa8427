"""dart-hf: DART speculative decoding as a native Hugging Face Transformers generation strategy."""

from transformers import AutoConfig, AutoModel

from .configuration_dart import DartConfig
from .generation import dart_generate
from .modeling_dart import DartDraftModel
from .ngram import NgramTable
from .options import DecodingOptions
from .stats import DartStats
from .tree import BeamSearchTreePolicy, TopKTreePolicy, Tree

AutoConfig.register("dart", DartConfig, exist_ok=True)
AutoModel.register(DartConfig, DartDraftModel, exist_ok=True)

__all__ = [
    "BeamSearchTreePolicy",
    "DartConfig",
    "DartDraftModel",
    "DartStats",
    "DecodingOptions",
    "NgramTable",
    "TopKTreePolicy",
    "Tree",
    "dart_generate",
]
__version__ = "0.1.0"
