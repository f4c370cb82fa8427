"""NgramTable: token N-gram counts stored as sorted arrays, memory-mapped, queried with per-candidate backoff.

Counting (SPEC section 4): every document gets EOS appended; every k-gram (k = 1..N) at every position is
counted, those that end at the document's end included, so count(x) is exactly the number of occurrences of x.

Query: P(c | context) = count(ctx + c) / count(ctx) for the longest suffix ctx of the context (N - 1 tokens,
then fewer, never the empty context) under which c was seen; 0 when c was seen under none.

Storage: one safetensors file. For each k, `keys_k` (sorted int64: the k-gram packed base-V) and `counts_k`
(int64). Loading maps the file with numpy (no copy into Python objects); lookups are `np.searchsorted`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

FORMAT_NAME = "dart-hf-ngram"
FORMAT_VERSION = "1"
NGRAM_FILENAME = "ngram.safetensors"
_SAFETENSORS_DTYPES = {"I64": np.int64}


class NgramTable:
    """Counts of all k-grams (k = 1..order) of a tokenized corpus.

    keys[k - 1], counts[k - 1]: `[num_kgrams]` int64 arrays, keys sorted ascending.
    """

    def __init__(
        self, order: int, vocab_size: int, keys: list[np.ndarray], counts: list[np.ndarray], metadata: dict | None = None
    ):
        if order < 2:
            raise ValueError(f"An N-gram table needs order >= 2, got {order}.")
        if float(vocab_size) ** order >= 2**63:
            raise ValueError(
                f"vocab_size {vocab_size} ** order {order} does not fit the int64 packed keys; lower the order."
            )
        self.order = order
        self.vocab_size = vocab_size
        self.keys = keys
        self.counts = counts
        self.metadata = dict(metadata or {})

    # ----- building -----------------------------------------------------------------------------------------------

    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Iterable[int]],
        vocab_size: int,
        order: int = 3,
        eos_token_id: int | None = None,
        min_count: int = 1,
        top_k: int | None = None,
        chunk_tokens: int = 2_000_000,
        progress: bool = True,
        metadata: dict | None = None,
    ) -> NgramTable:
        """Count every k-gram (k = 1..order) of `sequences` (one token-id sequence per document).

        eos_token_id: appended to every document. min_count: drop k-grams (k >= 2) seen fewer times.
        top_k: keep only the top_k most frequent continuations of each context. Memory is bounded by the table:
        documents are counted in chunks of about `chunk_tokens` tokens and merged into the running counts.
        """
        table_keys = [np.zeros(0, np.int64) for _ in range(order)]
        table_counts = [np.zeros(0, np.int64) for _ in range(order)]
        num_tokens = num_documents = 0
        chunk: list[np.ndarray] = []
        chunk_size = 0
        bar = tqdm(desc="counting n-grams", unit="tok", unit_scale=True, disable=not progress)

        def flush() -> None:
            nonlocal chunk, chunk_size
            if chunk:
                for k in range(1, order + 1):
                    keys, counts = _count_kgrams(chunk, k, vocab_size)
                    table_keys[k - 1], table_counts[k - 1] = _merge_counts(
                        table_keys[k - 1], table_counts[k - 1], keys, counts
                    )
            chunk, chunk_size = [], 0

        for sequence in sequences:
            tokens = np.asarray(list(sequence) if not isinstance(sequence, np.ndarray) else sequence, dtype=np.int64)
            if eos_token_id is not None:
                tokens = np.append(tokens, eos_token_id)
            if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
                raise ValueError(f"Token ids must lie in [0, {vocab_size}); document {num_documents} has others.")
            chunk.append(tokens)
            chunk_size += tokens.size
            num_tokens += tokens.size
            num_documents += 1
            bar.update(tokens.size)
            if chunk_size >= chunk_tokens:
                flush()
        flush()
        bar.close()

        for k in range(2, order + 1):
            keep = table_counts[k - 1] >= min_count
            table_keys[k - 1], table_counts[k - 1] = table_keys[k - 1][keep], table_counts[k - 1][keep]
            if top_k is not None:
                table_keys[k - 1], table_counts[k - 1] = _keep_top_continuations(
                    table_keys[k - 1], table_counts[k - 1], vocab_size, top_k
                )
        info = {"num_tokens": num_tokens, "num_documents": num_documents, "min_count": min_count, "top_k": top_k}
        info.update(metadata or {})
        return cls(order, vocab_size, table_keys, table_counts, info)

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        tokenizer,
        order: int = 3,
        batch_size: int = 256,
        **kwargs,
    ) -> NgramTable:
        """Tokenize `texts` (one document each) with `tokenizer` (EOS appended) and count them."""

        def token_sequences() -> Iterator[list[int]]:
            batch: list[str] = []
            for text in texts:
                batch.append(text)
                if len(batch) == batch_size:
                    yield from tokenizer(batch, add_special_tokens=False)["input_ids"]
                    batch = []
            if batch:
                yield from tokenizer(batch, add_special_tokens=False)["input_ids"]

        metadata = {"tokenizer": getattr(tokenizer, "name_or_path", "")}
        metadata.update(kwargs.pop("metadata", None) or {})
        return cls.from_sequences(
            token_sequences(), vocab_size=len(tokenizer), order=order, eos_token_id=tokenizer.eos_token_id,
            metadata=metadata, **kwargs,
        )

    # ----- querying -----------------------------------------------------------------------------------------------

    def count(self, ngrams: np.ndarray) -> np.ndarray:
        """Occurrences of each k-gram: ngrams `[M, k]` -> `[M]` int64 (0 when unseen)."""
        ngrams = np.asarray(ngrams, dtype=np.int64)
        return self._lookup(ngrams.shape[-1], _pack(ngrams, self.vocab_size))

    def probabilities(self, contexts: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """P(candidate | context) with per-candidate backoff.

        contexts: `[M, C]` token ids (the last C tokens before the candidates; -1 marks a missing token, for
            example at the start of a text). Only the last `order - 1` are used.
        candidates: `[M, K]` token ids. Returns `[M, K]` float32.
        """
        contexts = np.asarray(contexts, dtype=np.int64)
        candidates = np.asarray(candidates, dtype=np.int64)
        result = np.zeros(candidates.shape, dtype=np.float32)
        found = np.zeros(candidates.shape, dtype=bool)
        for context_len in range(min(self.order - 1, contexts.shape[1]), 0, -1):
            context = contexts[:, -context_len:]
            context_key = _pack(np.maximum(context, 0), self.vocab_size)
            context_count = np.maximum(self._lookup(context_len, context_key), 1)
            full_count = self._lookup(context_len + 1, context_key[:, None] * self.vocab_size + candidates)
            hit = (full_count > 0) & ~found
            valid = (context >= 0).all(axis=1)
            if not valid.all():
                hit &= valid[:, None]
            result = np.where(hit, full_count / context_count[:, None], result).astype(np.float32, copy=False)
            found |= hit
            if found.all():
                break
        return result

    def _lookup(self, k: int, packed: np.ndarray) -> np.ndarray:
        keys, counts = self.keys[k - 1], self.counts[k - 1]
        if keys.shape[0] == 0:
            return np.zeros(packed.shape, dtype=np.int64)
        flat = packed.ravel()
        if flat.size > 64:  # sorted needles walk the table in one direction: far fewer cache misses
            order = np.argsort(flat)
            index = np.empty_like(order)
            index[order] = np.searchsorted(keys, flat[order])
        else:
            index = np.searchsorted(keys, flat)
        np.minimum(index, keys.shape[0] - 1, out=index)
        return np.where(keys[index] == flat, counts[index], 0).reshape(packed.shape)

    # ----- storage ------------------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as one safetensors file (to a temporary name, then renamed into place)."""
        from safetensors.numpy import save_file

        tensors = {}
        for k in range(1, self.order + 1):
            tensors[f"keys_{k}"] = np.ascontiguousarray(self.keys[k - 1], dtype=np.int64)
            tensors[f"counts_{k}"] = np.ascontiguousarray(self.counts[k - 1], dtype=np.int64)
        metadata = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "order": str(self.order),
            "vocab_size": str(self.vocab_size), "info": json.dumps(self.metadata),
        }
        path = Path(path)
        temporary = path.with_name(path.name + ".tmp")
        save_file(tensors, str(temporary), metadata=metadata)
        os.replace(temporary, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> NgramTable:
        """Memory-map a table written by `save`. A truncated or foreign file raises a ValueError naming it."""
        path = Path(path)
        header, data_start = _read_safetensors_header(path)
        metadata = header.get("__metadata__") or {}
        if metadata.get("format") != FORMAT_NAME:
            raise ValueError(f"{path} is not a dart-hf N-gram table (its metadata names no '{FORMAT_NAME}' format).")
        if metadata.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} is a dart-hf N-gram table of format version {metadata.get('version')}; this dart-hf reads "
                f"version {FORMAT_VERSION}. Rebuild it with `dart-hf build-ngram` or upgrade dart-hf."
            )
        order, vocab_size = int(metadata["order"]), int(metadata["vocab_size"])
        file_size = path.stat().st_size
        keys, counts = [], []
        for k in range(1, order + 1):
            pair = []
            for name in (f"keys_{k}", f"counts_{k}"):
                entry = header.get(name)
                if entry is None or entry.get("dtype") not in _SAFETENSORS_DTYPES or len(entry.get("shape", [])) != 1:
                    raise ValueError(f"{path} is missing the int64 array '{name}' or stores it with another layout.")
                begin, end = entry["data_offsets"]
                length = entry["shape"][0]
                if end - begin != 8 * length or data_start + end > file_size:
                    raise ValueError(f"{path} is truncated or corrupt: array '{name}' runs past the end of the file.")
                if length == 0:
                    pair.append(np.zeros(0, np.int64))
                else:
                    mapped = np.memmap(path, dtype=np.int64, mode="r", offset=data_start + begin, shape=(length,))
                    pair.append(np.asarray(mapped))  # a plain view of the mapping: np.memmap indexing is slow
            keys.append(pair[0])
            counts.append(pair[1])
        return cls(order, vocab_size, keys, counts, json.loads(metadata.get("info", "{}")))

    # ----- the reference implementation's .trie ------------------------------------------------------------------

    @classmethod
    def from_trie(cls, path: str | os.PathLike, vocab_size: int, progress: bool = True) -> NgramTable:
        """Convert the reference DART `.trie` binary (layout in SPEC section 4) into a table. No node order or
        child order is assumed: each node's k-gram is rebuilt from its parent links."""
        data = memoryview(Path(path).read_bytes())
        if len(data) < 16:
            raise ValueError(f"{path} is too short to be a .trie file (no 16-byte header).")
        order, node_count = struct.unpack_from("<QQ", data, 0)
        tokens = np.empty(node_count, np.int64)
        parents = np.empty(node_count, np.int64)
        freqs = np.empty(node_count, np.int64)
        offset = 16
        record = struct.Struct("<iQiQ")
        for node in tqdm(range(node_count), desc="reading .trie", disable=not progress, unit="node"):
            if offset + record.size > len(data):
                raise ValueError(f"{path} is truncated: node {node} of {node_count} runs past the end of the file.")
            tokens[node], parents[node], freqs[node], num_children = record.unpack_from(data, offset)
            offset += record.size + 12 * num_children
        if offset > len(data):
            raise ValueError(f"{path} is truncated: the last node's children run past the end of the file.")

        depth = np.zeros(node_count, np.int64)
        packed = np.zeros(node_count, np.int64)
        is_root = np.arange(node_count) == 0
        for _ in range(order):  # propagate depth and packed key from parents, whatever the node order
            parent_depth = np.where(is_root, -1, depth[parents.clip(0, node_count - 1)])
            depth = parent_depth + 1
            packed = np.where(is_root, 0, packed[parents.clip(0, node_count - 1)] * vocab_size + tokens)
        keys, counts = [], []
        for k in range(1, order + 1):
            at_depth = depth == k
            sort = np.argsort(packed[at_depth], kind="stable")
            keys.append(packed[at_depth][sort])
            counts.append(freqs[at_depth][sort])
        return cls(int(order), vocab_size, keys, counts, {"source": f"converted from {Path(path).name}"})


def _pack(ngrams: np.ndarray, vocab_size: int) -> np.ndarray:
    """`[..., k]` token ids -> `[...]` int64 keys, base vocab_size, most significant token first."""
    packed = np.zeros(ngrams.shape[:-1], dtype=np.int64)
    for position in range(ngrams.shape[-1]):
        packed = packed * vocab_size + ngrams[..., position]
    return packed


def _count_kgrams(documents: list[np.ndarray], k: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique packed k-grams of the documents (windows never cross a document end) and their counts."""
    tokens = np.concatenate(documents)
    lengths = np.array([doc.size for doc in documents], dtype=np.int64)
    document_end = np.repeat(np.cumsum(lengths), lengths)
    starts = np.nonzero(np.arange(tokens.size) + k <= document_end)[0]
    packed = np.zeros(starts.size, dtype=np.int64)
    for position in range(k):
        packed = packed * vocab_size + tokens[starts + position]
    return np.unique(packed, return_counts=True)


def _merge_counts(keys_a, counts_a, keys_b, counts_b) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([keys_a, keys_b])
    counts = np.concatenate([counts_a, counts_b.astype(np.int64)])
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    if keys.size == 0:
        return keys, counts
    first = np.concatenate([[True], keys[1:] != keys[:-1]])
    starts = np.nonzero(first)[0]
    return keys[starts], np.add.reduceat(counts, starts)


def _keep_top_continuations(keys, counts, vocab_size, top_k) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per context (key // vocab_size), the top_k continuations by count (ties: smaller token first)."""
    context = keys // vocab_size
    order = np.lexsort((keys, -counts, context))
    context_sorted = context[order]
    first = np.concatenate([[True], context_sorted[1:] != context_sorted[:-1]]) if keys.size else np.zeros(0, bool)
    group_start = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0)) if keys.size else first
    rank = np.arange(keys.size) - group_start
    kept = np.sort(order[rank < top_k])
    return keys[kept], counts[kept]


def _read_safetensors_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError(f"{path} is too short to be a safetensors N-gram table.")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > 100_000_000 or header_len + 8 > path.stat().st_size:
                raise ValueError(f"{path} is not a safetensors N-gram table (bad header length {header_len}).")
            header = json.loads(handle.read(header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a safetensors N-gram table (unreadable header: {error}).") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors N-gram table (header is not a JSON object).")
    return header, 8 + header_len
