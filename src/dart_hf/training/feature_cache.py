"""An optional offline cache of the frozen target's outputs, for repeated epochs on small targets.

Online training runs the whole target on every batch. The cache runs it once per example and stores, per token,
the three feature layers `[L, 3H]` and the input of the target's output layer `[L, H]` (the soft labels are one
matrix product away: `lm_head(last_hidden)`), in safetensors shards under one folder:

    cache.json              format, feature layers, dtype, shard size and a fingerprint of every example
    shard-00000.safetensors "features.{i}" / "last_hidden.{i}" for the examples i of that shard

Per token that is 4 * H values (about 4.6 KB for a 576-wide target in bfloat16), so it pays for small targets
only. Shards are written to a temporary name and renamed, so building resumes after a crash and never reads a
half-written shard. A shard is reused only while it holds the same examples at the same indices, so appending
examples to the data recomputes the last, partial shard and the new ones only; a cache built with other feature
layers, dtype or shard size is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..features import forward_with_features, takes_logits_to_keep
from ..files import write_atomically

FEATURE_CACHE_FORMAT = "dart-hf-features"
FEATURE_CACHE_VERSION = 1
MANIFEST = "cache.json"
SETTINGS = ("format", "version", "feature_layers", "dtype", "shard_size")  # what a cache is built with, beside its data


def example_fingerprint(example: dict) -> str:
    """A short hash of an example's token ids (detects a cache built for other data)."""
    text = json.dumps([example["prompt_ids"], example["response_ids"]])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def output_layer_input(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: list[int]):
    """Run the target once: (features `[B, L, 3H]`, the base model's output `[B, L, H]`, logits `[B, L', V]`).

    The base model's output is what the output layer reads; the caller checks that it alone makes the logits. The
    cache keeps no logits, so where the model takes `logits_to_keep` only the last position's are computed (L' = 1,
    else L' = L): a 151,936-token output layer over every row is a tenth of a 1.5B target's forward and gigabytes
    of float32 a batch.
    """
    captured = {}
    hook = target.base_model.register_forward_hook(lambda module, args, output: captured.update(hidden=output[0]))
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if takes_logits_to_keep(target):
        inputs["logits_to_keep"] = 1
    try:
        outputs, features = forward_with_features(target, layers, **inputs)
    finally:
        hook.remove()
    return features, captured["hidden"], outputs.logits


def right_padded(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists as a right-padded batch: (input_ids `[B, L]`, attention_mask `[B, L]`), L the longest."""
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
    return input_ids, attention_mask


@torch.no_grad()
def build_feature_cache(
    target,
    examples: list[dict],
    feature_layers: list[int],
    directory: str | os.PathLike,
    dtype: torch.dtype = torch.bfloat16,
    shard_size: int = 256,
    batch_size: int = 8,
    progress: bool = True,
) -> "FeatureCache":
    """Compute (or finish computing) the cache of `examples` in `directory`, and open it.

    examples: `{"prompt_ids", "response_ids"}` dicts, in the order the training dataset will index them.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fingerprints = [example_fingerprint(e) for e in examples]
    manifest = {
        "format": FEATURE_CACHE_FORMAT,
        "version": FEATURE_CACHE_VERSION,
        "feature_layers": list(feature_layers),
        "dtype": str(dtype).removeprefix("torch."),
        "shard_size": shard_size,
        "num_examples": len(examples),
        "fingerprint": hashlib.sha1("".join(fingerprints).encode()).hexdigest(),
    }
    manifest_path = directory / MANIFEST
    existing = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    changed = sorted(k for k in SETTINGS if existing is not None and existing.get(k) != manifest[k])
    if changed:
        raise ValueError(
            f"The feature cache in {directory} was built with other settings ({', '.join(changed)} differ); "
            "delete that folder or pick another feature_cache_dir."
        )
    if existing != manifest:
        write_atomically(manifest_path, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1)))

    head_checked = False
    num_shards = -(-len(examples) // shard_size)
    for path in directory.glob("shard-*.safetensors"):  # left by a build for more examples than these
        if int(path.stem.removeprefix("shard-")) >= num_shards:
            path.unlink()
    for shard in tqdm(range(num_shards), desc="caching target features", disable=not progress):
        path = directory / f"shard-{shard:05d}.safetensors"
        indices = list(range(shard * shard_size, min((shard + 1) * shard_size, len(examples))))
        if _shard_fingerprints(path) == [fingerprints[i] for i in indices]:
            continue
        tensors = {}
        # batched by length, so that a batch pads its rows little (the stored rows do not depend on it)
        by_length = sorted(indices, key=lambda i: len(examples[i]["prompt_ids"]) + len(examples[i]["response_ids"]))
        for start in range(0, len(by_length), batch_size):
            chunk = by_length[start : start + batch_size]
            sequences = [examples[i]["prompt_ids"] + examples[i]["response_ids"] for i in chunk]
            input_ids, attention_mask = right_padded(sequences)
            features, hidden, logits = output_layer_input(
                target, input_ids.to(target.device), attention_mask.to(target.device), feature_layers
            )
            if not head_checked:
                last = hidden[:, -logits.shape[1] :]  # the positions whose logits were computed
                if not torch.allclose(target.get_output_embeddings()(last), logits):
                    raise ValueError(
                        f"{type(target).__name__} changes its hidden state before its output layer or its logits "
                        "after it (e.g. soft-capping), so the cache cannot rebuild them; train without "
                        "feature_cache_dir (online features)."
                    )
                head_checked = True
            for row, (index, sequence) in enumerate(zip(chunk, sequences)):
                tensors[f"features.{index}"] = features[row, : len(sequence)].to(dtype).cpu().contiguous()
                tensors[f"last_hidden.{index}"] = hidden[row, : len(sequence)].to(dtype).cpu().contiguous()
        metadata = {"format": FEATURE_CACHE_FORMAT, "fingerprints": json.dumps([fingerprints[i] for i in indices])}
        write_atomically(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    return FeatureCache(directory)


def _shard_fingerprints(path: Path) -> list[str] | None:
    """The fingerprints of the examples a shard holds, in index order; None if there is no such shard."""
    if not path.exists():
        return None
    with safe_open(path, framework="pt") as shard:
        return json.loads(shard.metadata()["fingerprints"])


class FeatureCache:
    """Read side of a feature cache: `cache[i]` -> (features `[L_i, 3H]`, output-layer input `[L_i, H]`)."""

    def __init__(self, directory: str | os.PathLike, examples: list[dict] | None = None):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST
        if not manifest_path.exists():
            raise FileNotFoundError(f"No feature cache in {self.directory} (no {MANIFEST}); build it first.")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != FEATURE_CACHE_FORMAT or self.manifest.get("version") != FEATURE_CACHE_VERSION:
            raise ValueError(f"{manifest_path} is not a dart-hf feature cache of version {FEATURE_CACHE_VERSION}.")
        self.feature_layers = self.manifest["feature_layers"]
        self.shard_size = self.manifest["shard_size"]
        self._shards: dict[int, object] = {}
        if examples is not None:
            self._check_examples(examples)

    def __len__(self) -> int:
        return self.manifest["num_examples"]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"feature cache index {index} out of range [0, {len(self)})")
        shard = self._shard(index // self.shard_size)
        return shard.get_tensor(f"features.{index}"), shard.get_tensor(f"last_hidden.{index}")

    def _shard(self, number: int):
        if number not in self._shards:  # opened lazily: each DataLoader worker opens its own handles
            self._shards[number] = safe_open(self.directory / f"shard-{number:05d}.safetensors", framework="pt")
        return self._shards[number]

    def _check_examples(self, examples: list[dict]) -> None:
        if len(examples) != len(self):
            raise ValueError(f"The feature cache holds {len(self)} examples, the dataset {len(examples)}; rebuild it.")
        for number in range(-(-len(self) // self.shard_size)):
            stored = json.loads(self._shard(number).metadata()["fingerprints"])
            expected = [example_fingerprint(examples[i]) for i in range(number * self.shard_size, len(self))]
            if stored != expected[: len(stored)]:
                raise ValueError(f"Shard {number} of the feature cache in {self.directory} holds other examples; rebuild it.")


class CachedFeatureDataset(Dataset):
    """Examples with their cached target outputs attached (`target_features`, `target_last_hidden`), for
    `DartDataCollator` and `DartTrainer`: the trainer then skips the target's forward pass."""

    def __init__(self, examples: list[dict], cache: FeatureCache):
        cache._check_examples(examples)
        self.examples = examples
        self.cache = cache

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict:
        features, last_hidden = self.cache[index]
        return dict(self.examples[index], target_features=features, target_last_hidden=last_hidden)

