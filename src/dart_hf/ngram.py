"""NgramTable: token N-gram counts stored as one sorted array, memory-mapped, queried with per-candidate backoff.

Counting (as the reference implementation counts): every document gets EOS appended; every k-gram (k = 1..N) at
every position is counted, those that end at the document's end included, so count(x) is exactly the number of
occurrences of x.

Query: P(c | context) = count(ctx + c) / count(ctx) for the longest suffix ctx of the context (N - 1 tokens,
then fewer, never the empty context) under which c was seen; 0 when c was seen under none.

Storage: one safetensors file with two int64 arrays, `keys` (sorted) and `counts`. A k-gram's key is its tokens
written in base V + 1 with digits token + 1 (no zero digit), so k-grams of every length share one sorted array
and one binary search answers all the lookups of a query; the key of a k-gram's context is `key // (V + 1)`.
Loading maps the file with numpy (no copy into Python objects); lookups are `np.searchsorted`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .files import write_atomically

FORMAT_NAME = "dart-hf-ngram"
FORMAT_VERSION = "1"
MAX_TRIE_ORDER = 16  # the reference builds trigram tables; an order beyond this is a header that is not a .trie
NGRAM_FILENAME = "ngram.safetensors"


class NgramTable:
    """Counts of all k-grams (k = 1..order) of a tokenized corpus.

    keys, counts: `[num_kgrams]` int64 arrays, keys sorted ascending (encoding in the module docstring).
    """

    def __init__(self, order: int, vocab_size: int, keys: np.ndarray, counts: np.ndarray, metadata: dict | None = None):
        if order < 2:
            raise ValueError(f"An N-gram table needs order >= 2, got {order}.")
        if float(vocab_size + 1) ** order >= 2**63:
            raise ValueError(
                f"(vocab_size + 1) ** order = {vocab_size + 1} ** {order} does not fit the int64 keys; lower the order."
            )
        self.order = order
        self.vocab_size = vocab_size
        self.keys = keys
        self.counts = counts
        self.metadata = dict(metadata or {})

    def check_fits(self, vocab_size: int) -> None:
        """Raise a ValueError naming the fix unless this table counts token ids of a `vocab_size`-token vocabulary
        (the target's): its keys pack ids in base `self.vocab_size + 1`, so other ids would read other n-grams."""
        if self.vocab_size != vocab_size:
            raise ValueError(
                f"The N-gram table counts a vocabulary of {self.vocab_size} tokens, but the target has {vocab_size}. "
                "Use the table built for this target's tokenizer: `dart-hf build-ngram` with its tokenizer, or "
                f"`dart-hf convert-trie --vocab-size {vocab_size}` for a reference .trie; or set `draft.ngram = None`."
            )

    def num_kgrams(self, k: int) -> int:
        """How many distinct k-grams the table holds."""
        base = self.vocab_size + 1
        low, high = np.searchsorted(self.keys, [base ** (k - 1), base**k])
        return int(high - low)

    def describe(self) -> str:
        """'12 1-grams, 30 2-grams, 41 3-grams'."""
        return ", ".join(f"{self.num_kgrams(k):,} {k}-grams" for k in range(1, self.order + 1))

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
        keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        num_tokens = num_documents = 0
        chunk: list[np.ndarray] = []
        chunk_size = 0
        bar = tqdm(desc="counting n-grams", unit="tok", unit_scale=True, disable=not progress)

        def flush() -> None:
            nonlocal chunk, chunk_size, keys, counts
            if chunk:
                for k in range(1, order + 1):
                    keys, counts = _merge_counts(keys, counts, *_count_kgrams(chunk, k, vocab_size))
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

        is_unigram = keys < vocab_size + 1
        keep = is_unigram | (counts >= min_count)
        keys, counts = keys[keep], counts[keep]
        if top_k is not None:
            keys, counts = _keep_top_continuations(keys, counts, vocab_size, top_k)
        info = {"num_tokens": num_tokens, "num_documents": num_documents, "min_count": min_count, "top_k": top_k}
        info.update(metadata or {})
        return cls(order, vocab_size, keys, counts, info)

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
        return self._lookup(_pack(np.asarray(ngrams, dtype=np.int64), self.vocab_size))

    def probabilities(self, contexts: np.ndarray, candidates: np.ndarray, min_context: int = 1) -> np.ndarray:
        """P(candidate | context) with per-candidate backoff.

        contexts: `[M, C]` token ids (the last C tokens before the candidates; -1 marks a missing token, for
            example at the start of a text). Only the last `order - 1` are used.
        candidates: `[M, K]` token ids; -1 marks a slot to skip (probability 0, no lookup).
        min_context: back off no further than contexts of this many tokens (default 1: the full backoff). A
            caller that already holds the shorter-context probabilities asks only for the longer ones.
        Returns `[M, K]` float32.
        """
        contexts = np.asarray(contexts, dtype=np.int64)
        candidates = np.asarray(candidates, dtype=np.int64)
        base = self.vocab_size + 1
        lengths = range(min(self.order - 1, contexts.shape[1]), min_context - 1, -1)
        if len(lengths) == 0:
            return np.zeros(candidates.shape, dtype=np.float32)
        # one key per context suffix, longest first; a suffix with a missing token gets key 0 (never stored)
        context_keys = []
        for length in lengths:
            suffix = contexts[:, -length:]
            context_keys.append(np.where((suffix >= 0).all(axis=1), _pack(suffix, self.vocab_size), 0))
        context_keys = np.stack(context_keys)  # [S, M]
        asked = (context_keys[..., None] > 0) & (candidates >= 0)  # [S, M, K]
        full_keys = (context_keys[..., None] * base + candidates + 1)[asked]
        found = self._lookup(np.concatenate([context_keys.ravel(), full_keys]))  # one binary search for all
        context_counts = np.maximum(found[: context_keys.size], 1).reshape(context_keys.shape)
        full_counts = np.zeros(asked.shape, dtype=np.int64)
        full_counts[asked] = found[context_keys.size :]

        result = np.zeros(candidates.shape, dtype=np.float64)
        for index in range(len(context_keys) - 1, -1, -1):  # shortest first, so longer contexts overwrite
            seen = full_counts[index] > 0
            result = np.where(seen, full_counts[index] / context_counts[index][:, None], result)
        return result.astype(np.float32)

    def _lookup(self, packed: np.ndarray) -> np.ndarray:
        """Counts of packed keys (any shape), 0 for keys not in the table."""
        keys, counts = self.keys, self.counts
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

        tensors = {
            "keys": np.ascontiguousarray(self.keys, dtype=np.int64),
            "counts": np.ascontiguousarray(self.counts, dtype=np.int64),
        }
        metadata = {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "order": str(self.order),
            "vocab_size": str(self.vocab_size), "info": json.dumps(self.metadata),
        }
        write_atomically(path, lambda temporary: save_file(tensors, temporary, metadata=metadata))

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
        arrays = []
        for name in ("keys", "counts"):
            entry = header.get(name)
            if not isinstance(entry, dict) or entry.get("dtype") != "I64" or len(entry.get("shape", [])) != 1:
                raise ValueError(f"{path} is missing the int64 array '{name}' or stores it with another layout.")
            begin, end = entry["data_offsets"]
            length = entry["shape"][0]
            if end - begin != 8 * length or data_start + end > file_size:
                raise ValueError(f"{path} is truncated or corrupt: array '{name}' runs past the end of the file.")
            if length == 0:
                arrays.append(np.zeros(0, np.int64))
            else:
                mapped = np.memmap(path, dtype=np.int64, mode="r", offset=data_start + begin, shape=(length,))
                arrays.append(np.asarray(mapped))  # a plain view of the mapping: np.memmap indexing is slow
        keys, counts = arrays
        if keys.shape != counts.shape:
            raise ValueError(f"{path} is corrupt: 'keys' and 'counts' differ in length.")
        return cls(order, vocab_size, keys, counts, json.loads(metadata.get("info", "{}")))

    # ----- the reference implementation's .trie ------------------------------------------------------------------

    @classmethod
    def from_trie(cls, path: str | os.PathLike, vocab_size: int, progress: bool = True) -> NgramTable:
        """Convert the reference DART `.trie` binary into a table. Layout (little-endian, no padding): a header
        `u64 order, u64 node_count`, then per node `i32 token, u64 parent, i32 count, u64 n_children` followed by
        n_children `(i32 token, u64 child id)` pairs; node 0 is the root. No node order or child order is assumed:
        each node's k-gram is rebuilt from its parent links, and every node is checked (`_check_trie`)."""
        data = memoryview(Path(path).read_bytes())
        if len(data) < 16:
            raise ValueError(f"{path} is too short to be a .trie file (no 16-byte header).")
        order, node_count = struct.unpack_from("<QQ", data, 0)
        record = struct.Struct("<iQiQ")
        if not 1 <= order <= MAX_TRIE_ORDER or 16 + node_count * record.size > len(data):
            raise ValueError(
                f"{path} is not a reference DART .trie file: its header reads order {order} and {node_count} nodes, "
                f"which a {len(data)}-byte file cannot hold. Pass the .trie file of the reference release; a table "
                "saved by dart-hf (ngram.safetensors) loads with `NgramTable.load`."
            )
        tokens = np.empty(node_count, np.int64)
        parents = np.empty(node_count, np.int64)
        freqs = np.empty(node_count, np.int64)
        child_counts = np.empty(node_count, np.int64)
        offset = 16
        for node in tqdm(range(node_count), desc="reading .trie", disable=not progress, unit="node"):
            if offset + record.size > len(data):
                raise ValueError(f"{path} is truncated: node {node} of {node_count} runs past the end of the file.")
            tokens[node], parents[node], freqs[node], child_counts[node] = record.unpack_from(data, offset)
            offset += record.size + 12 * child_counts[node]
        if offset > len(data):
            raise ValueError(f"{path} is truncated: the last node's children run past the end of the file.")
        _check_trie(path, data, order, vocab_size, tokens, parents, freqs, child_counts)

        packed = np.zeros(node_count, np.int64)
        is_root = np.arange(node_count) == 0
        for _ in range(order):  # propagate the packed key from the parents, whatever the node order
            packed = np.where(is_root, 0, packed[parents] * (vocab_size + 1) + tokens + 1)
        sort = np.argsort(packed[1:], kind="stable") + 1
        return cls(int(order), vocab_size, packed[sort], freqs[sort], {"source": f"converted from {Path(path).name}"})


def _check_trie(path, data, order, vocab_size, tokens, parents, freqs, child_counts) -> None:
    """Raise a ValueError naming the first inconsistency of a `.trie`'s nodes: a token outside the vocabulary, a
    count that is not positive, a parent link out of range or deeper than the order, or a child list that does not
    name exactly the nodes whose parent is that node, with their tokens."""
    node_count = tokens.size
    problems = [
        ((tokens[1:] < 0) | (tokens[1:] >= vocab_size), "token ids outside the vocabulary of {vocab} tokens",
         "pass the target's vocabulary size (--vocab-size / vocab_size=)"),
        (freqs[1:] <= 0, "counts that are not positive", "the file is damaged"),
        ((parents[1:] < 0) | (parents[1:] >= node_count), "parent links outside the file's nodes",
         "the file is damaged"),
    ]
    for bad, what, fix in problems:
        if bad.any():
            node = int(np.argmax(bad)) + 1
            raise ValueError(
                f"{path} has {what.format(vocab=vocab_size)} (node {node}: token {tokens[node]}, count {freqs[node]}, "
                f"parent {parents[node]}): {fix}."
            )
    depth = np.zeros(node_count, np.int64)
    is_root = np.arange(node_count) == 0
    for _ in range(order + 1):
        depth = np.where(is_root, 0, depth[parents] + 1)
    if (depth > order).any():
        raise ValueError(f"{path} has n-grams longer than its order {order} (or a parent cycle): the file is damaged.")
    # each node's child records follow its own record: (i32 token, u64 child id) pairs
    record_starts = 16 + np.concatenate([[0], np.cumsum(24 + 12 * child_counts)[:-1]])
    owners = np.repeat(np.arange(node_count), child_counts)
    first_child = np.repeat(record_starts + 24, child_counts)
    rank = np.arange(owners.size) - np.repeat(np.cumsum(child_counts) - child_counts, child_counts)
    starts, raw = first_child + 12 * rank, np.frombuffer(data, np.uint8)
    child_tokens, children = np.empty(starts.size, np.int64), np.empty(starts.size, np.uint64)
    for begin in range(0, starts.size, 1 << 22):  # in slices: the gathered bytes are 12 per child
        byte = raw[starts[begin : begin + (1 << 22), None] + np.arange(12)]
        child_tokens[begin : begin + (1 << 22)] = byte[:, :4].copy().view("<i4")[:, 0]
        children[begin : begin + (1 << 22)] = byte[:, 4:].copy().view("<u8")[:, 0]
    consistent = owners.size == node_count - 1 and bool((children < node_count).all())
    if consistent:
        children = children.astype(np.int64)
        consistent = bool((parents[children] == owners).all() and (tokens[children] == child_tokens).all())
        consistent = consistent and np.unique(children).size == children.size and not (children == 0).any()
    if not consistent:
        raise ValueError(f"{path}'s child lists do not match its parent links: the file is damaged.")


def _pack(ngrams: np.ndarray, vocab_size: int) -> np.ndarray:
    """`[..., k]` token ids -> `[...]` int64 keys: digits token + 1 in base vocab_size + 1, first token first."""
    packed = np.zeros(ngrams.shape[:-1], dtype=np.int64)
    for position in range(ngrams.shape[-1]):
        packed = packed * (vocab_size + 1) + ngrams[..., position] + 1
    return packed


def _count_kgrams(documents: list[np.ndarray], k: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique packed k-grams of the documents (windows never cross a document end) and their counts."""
    tokens = np.concatenate(documents)
    lengths = np.array([doc.size for doc in documents], dtype=np.int64)
    document_end = np.repeat(np.cumsum(lengths), lengths)
    starts = np.nonzero(np.arange(tokens.size) + k <= document_end)[0]
    windows = tokens[starts[:, None] + np.arange(k)]
    return np.unique(_pack(windows, vocab_size), return_counts=True)


def _merge_counts(keys_a, counts_a, keys_b, counts_b) -> tuple[np.ndarray, np.ndarray]:
    keys = np.concatenate([keys_a, keys_b])
    counts = np.concatenate([counts_a, counts_b.astype(np.int64)])
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    if keys.size == 0:
        return keys, counts
    starts = np.nonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))[0]
    return keys[starts], np.add.reduceat(counts, starts)


def _keep_top_continuations(keys, counts, vocab_size, top_k) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per context (key // (vocab_size + 1)), the top_k continuations by count (ties: smaller key first).
    Unigrams have no context and are all kept."""
    if keys.size == 0:
        return keys, counts
    context = np.where(keys < vocab_size + 1, -1 - np.arange(keys.size), keys // (vocab_size + 1))
    order = np.lexsort((keys, -counts, context))
    context_sorted = context[order]
    first = np.concatenate([[True], context_sorted[1:] != context_sorted[:-1]])
    group_start = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0))
    rank = np.arange(keys.size) - group_start
    kept = np.sort(order[rank < top_k])
    return keys[kept], counts[kept]


def _read_safetensors_header(path: Path) -> tuple[dict, int]:
    def not_a_table(why: str) -> ValueError:
        return ValueError(
            f"{path} is not a safetensors N-gram table ({why}). A reference DART `.trie` file converts with "
            "`NgramTable.from_trie` or `dart-hf convert-trie`."
        )

    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError(f"{path} is too short to be a safetensors N-gram table.")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > 100_000_000 or header_len + 8 > path.stat().st_size:
                raise not_a_table(f"bad header length {header_len}")
            header = json.loads(handle.read(header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise not_a_table(f"unreadable header: {error}") from None
    if not isinstance(header, dict):
        raise not_a_table("header is not a JSON object")
    return header, 8 + header_len
