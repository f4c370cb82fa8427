"""dart-hf drafts in vLLM: registers the `Eagle3DartForCausalLM` architecture with vLLM's model registry.

vLLM calls `register` through its `vllm.general_plugins` entry point in every process it starts (the front end,
the engine core, each worker). The model class is imported lazily, by name, so that registering costs nothing.
This package imports neither dart-hf nor a newer Transformers than vLLM's own: the drafts it serves are written by
`dart-hf export-vllm`.
"""

ARCHITECTURE = "Eagle3DartForCausalLM"


def register() -> None:
    """Make `architectures: ["Eagle3DartForCausalLM"]` in a draft's config.json resolve to the DART draft model."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "dart_hf_vllm.model:Eagle3DartForCausalLM")
