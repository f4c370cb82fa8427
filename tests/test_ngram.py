"""NgramTable: counts and probabilities against brute force, pruning, storage, .trie conversion, Hub loading."""

import os
import random
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dart_hf.ngram import NgramTable


def random_corpus(seed: int, vocab: int = 12, documents: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab - 1) for _ in range(rng.randrange(0, 25))] for _ in range(documents)]


def brute_counts(corpus, eos, order):
    counts = Counter()
    for document in corpus:
        tokens = list(document) + [eos]
        for start in range(len(tokens)):
            for k in range(1, order + 1):
                if start + k <= len(tokens):
                    counts[tuple(tokens[start : start + k])] += 1
    return counts


def brute_probability(counts, context, candidate, order):
    for length in range(min(order - 1, len(context)), 0, -1):
        ctx = tuple(context[-length:])
        if -1 in ctx:
            continue
        if counts[ctx + (candidate,)] > 0:
            return counts[ctx + (candidate,)] / counts[ctx]
    return 0.0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("order", [2, 3, 4])
def test_counts_and_probabilities_equal_brute_force(seed, order):
    vocab, eos = 12, 11
    corpus = random_corpus(seed, vocab)
    table = NgramTable.from_sequences(corpus, vocab_size=vocab, order=order, eos_token_id=eos, chunk_tokens=50,
                                      progress=False)
    counts = brute_counts(corpus, eos, order)
    for ngram, count in counts.items():
        assert int(table.count(np.array([ngram]))[0]) == count
    for k in range(1, order + 1):
        assert table.num_kgrams(k) == sum(1 for g in counts if len(g) == k)
    rng = np.random.default_rng(seed)
    contexts = rng.integers(-1, vocab, (60, 3))
    contexts[:, -1] = np.where(contexts[:, -1] < 0, 0, contexts[:, -1])
    candidates = rng.integers(0, vocab, (60, 7))
    got = table.probabilities(contexts, candidates)
    for row in range(60):
        for column in range(7):
            expected = brute_probability(counts, contexts[row].tolist(), int(candidates[row, column]), order)
            assert got[row, column] == pytest.approx(expected, rel=1e-6)


def test_backoff_cases():
    # documents: "1 2 3", "4 2 5" (EOS 9 appended)
    table = NgramTable.from_sequences([[1, 2, 3], [4, 2, 5]], vocab_size=10, eos_token_id=9, progress=False)
    probs = table.probabilities(np.array([[1, 2], [4, 2], [7, 2], [1, 8], [-1, 2]]), np.array([[3, 5, 9]] * 5))
    assert probs[0].tolist() == [1.0, 0.5, 0.0]  # trigram for 3, backoff to bigram "2 5" for 5, 9 unseen
    assert probs[1].tolist() == [0.5, 1.0, 0.0]
    assert probs[2].tolist() == [0.5, 0.5, 0.0]  # context "7 2" unseen: bigram context "2"
    assert probs[3].tolist() == [0.0, 0.0, 0.0]  # "8" never seen: 0, no unigram fallback
    assert probs[4].tolist() == [0.5, 0.5, 0.0]  # missing first token


def test_min_count_and_top_k_pruning_keep_true_probabilities():
    corpus = [[1, 2, 3]] * 5 + [[1, 2, 4]] * 3 + [[1, 2, 5]]
    full = NgramTable.from_sequences(corpus, vocab_size=10, eos_token_id=9, progress=False)
    pruned = NgramTable.from_sequences(corpus, vocab_size=10, eos_token_id=9, min_count=2, progress=False)
    top1 = NgramTable.from_sequences(corpus, vocab_size=10, eos_token_id=9, top_k=1, progress=False)
    query = (np.array([[1, 2]]), np.array([[3, 4, 5]]))
    assert full.probabilities(*query)[0].tolist() == pytest.approx([5 / 9, 3 / 9, 1 / 9])
    assert pruned.probabilities(*query)[0].tolist() == pytest.approx([5 / 9, 3 / 9, 0])
    assert top1.probabilities(*query)[0].tolist() == pytest.approx([5 / 9, 0, 0])


def test_save_load_round_trip_is_memory_mapped(tmp_path):
    table = NgramTable.from_sequences(random_corpus(0), vocab_size=12, eos_token_id=11, progress=False,
                                      metadata={"tokenizer": "test"})
    path = tmp_path / "ngram.safetensors"
    table.save(path)
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file (named after the process) was renamed away
    loaded = NgramTable.load(path)
    assert not loaded.keys.flags.owndata and isinstance(loaded.keys.base, (np.memmap, __import__("mmap").mmap))
    assert loaded.metadata["tokenizer"] == "test"
    for ours, theirs in zip((table.keys, table.counts), (loaded.keys, loaded.counts)):
        assert np.array_equal(ours, theirs)


def test_truncated_or_foreign_files_get_clear_errors(tmp_path):
    table = NgramTable.from_sequences(random_corpus(1), vocab_size=12, eos_token_id=11, progress=False)
    path = tmp_path / "ngram.safetensors"
    table.save(path)
    data = path.read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(data[: len(data) - 40])
    with pytest.raises(ValueError, match="truncated"):
        NgramTable.load(tmp_path / "truncated.safetensors")
    (tmp_path / "garbage.bin").write_bytes(b"\x00" * 3)
    with pytest.raises(ValueError, match="too short"):
        NgramTable.load(tmp_path / "garbage.bin")
    (tmp_path / "noise.bin").write_bytes(os.urandom(4000))
    with pytest.raises(ValueError, match="not a safetensors N-gram table"):
        NgramTable.load(tmp_path / "noise.bin")
    from safetensors.numpy import save_file
    save_file({"weight": np.zeros(3, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not a dart-hf N-gram table"):
        NgramTable.load(tmp_path / "model.safetensors")


def write_trie(path, corpus, eos, order, seed):
    """The reference `.trie` layout: u64 order, u64 node_count, then per node i32 token, u64 parent, i32 freq,
    u64 n_children and n_children (i32 token, u64 child id) pairs. Insertion-order ids, shuffled child order."""
    tokens, parents, freqs, children = [0], [0], [0], [{}]
    for document in corpus:
        sequence = list(document) + [eos]
        for start in range(len(sequence)):
            node = 0
            freqs[0] += 1
            for token in sequence[start : start + order]:
                if token not in children[node]:
                    children[node][token] = len(tokens)
                    tokens.append(token), parents.append(node), freqs.append(0), children.append({})
                node = children[node][token]
                freqs[node] += 1
    rng = random.Random(seed)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<QQ", order, len(tokens)))
        for node in range(len(tokens)):
            items = list(children[node].items())
            rng.shuffle(items)
            handle.write(struct.pack("<iQiQ", tokens[node], parents[node], freqs[node], len(items)))
            for token, child in items:
                handle.write(struct.pack("<iQ", token, child))


@pytest.mark.parametrize("seed", range(3))
def test_trie_conversion_equals_direct_build(tmp_path, seed):
    corpus = random_corpus(seed)
    write_trie(tmp_path / "full.trie", corpus, eos=11, order=3, seed=seed)
    converted = NgramTable.from_trie(tmp_path / "full.trie", vocab_size=12, progress=False)
    direct = NgramTable.from_sequences(corpus, vocab_size=12, eos_token_id=11, progress=False)
    for ours, theirs in zip((converted.keys, converted.counts), (direct.keys, direct.counts)):
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))
    data = (tmp_path / "full.trie").read_bytes()
    (tmp_path / "cut.trie").write_bytes(data[:-30])
    with pytest.raises(ValueError, match="truncated"):
        NgramTable.from_trie(tmp_path / "cut.trie", vocab_size=12, progress=False)


def test_a_file_that_is_not_what_its_loader_reads_gets_an_error_naming_the_right_one(tmp_path):
    table = NgramTable.from_sequences(random_corpus(2), vocab_size=12, eos_token_id=11, progress=False)
    table.save(tmp_path / "ngram.safetensors")
    write_trie(tmp_path / "full.trie", random_corpus(2), eos=11, order=3, seed=0)
    with pytest.raises(ValueError, match="not a reference DART .trie file.*NgramTable.load"):
        NgramTable.from_trie(tmp_path / "ngram.safetensors", vocab_size=12, progress=False)
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(0).bytes(4000))
    with pytest.raises(ValueError, match="not a reference DART .trie file"):
        NgramTable.from_trie(tmp_path / "noise.bin", vocab_size=12, progress=False)
    with pytest.raises(ValueError, match="not a safetensors N-gram table.*from_trie"):
        NgramTable.load(tmp_path / "full.trie")


def test_a_table_for_another_vocabulary_is_refused_with_the_fix():
    import torch

    from _helpers import VOCAB_SIZE, prompts, tiny_target
    from dart_hf import DartDraftModel

    target = tiny_target("llama", seed=4)
    draft = DartDraftModel.from_target(target)
    small = NgramTable.from_sequences(random_corpus(3), vocab_size=12, eos_token_id=11, progress=False)
    draft.ngram = small  # set after binding: refused when a tree would use it
    prompt = prompts(1, seed=4)[0]
    with pytest.raises(ValueError, match=f"vocabulary of 12 tokens, but the target has {VOCAB_SIZE}.*build-ngram"):
        target.generate(prompt, max_new_tokens=4, assistant_model=draft)
    with pytest.raises(ValueError, match=f"convert-trie --vocab-size {VOCAB_SIZE}"):
        target.generate(prompt, max_new_tokens=4, assistant_model=draft, dart_chain=True)
    with pytest.raises(ValueError, match="vocabulary of 12 tokens"):  # and when binding
        draft.bind(target)
    fitting = NgramTable.from_sequences(random_corpus(3), vocab_size=VOCAB_SIZE, eos_token_id=11, progress=False)
    draft.ngram = fitting
    expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(prompt, max_new_tokens=12, do_sample=False, assistant_model=draft), expected)


def test_draft_carries_its_ngram_locally_and_from_an_offline_hub_cache(tmp_path):
    from _helpers import tiny_target
    from dart_hf import DartDraftModel

    target = tiny_target("llama")
    draft = DartDraftModel.from_target(target)
    draft.ngram = NgramTable.from_sequences(random_corpus(2, vocab=128), vocab_size=128, progress=False)
    draft.save_pretrained(tmp_path / "draft")
    assert (tmp_path / "draft" / "ngram.safetensors").exists()
    loaded = DartDraftModel.from_pretrained(tmp_path / "draft", target=target)
    assert np.array_equal(loaded.ngram.keys, draft.ngram.keys)

    # a separate table attached with ngram= (a file, or a folder holding ngram.safetensors)
    other = NgramTable.from_sequences(random_corpus(3, vocab=128), vocab_size=128, progress=False)
    other.save(tmp_path / "other.safetensors")
    attached = DartDraftModel.from_pretrained(tmp_path / "draft", target=target, ngram=tmp_path / "other.safetensors")
    assert np.array_equal(attached.ngram.keys, other.keys)

    # the Hub path: a cache laid out as huggingface_hub lays it out, HF_HUB_OFFLINE=1, repo ids
    cache = tmp_path / "hub"
    for repo, files in {"org--draft": ["config.json", "model.safetensors"], "org--ngram": []}.items():
        snapshot = cache / f"models--{repo}" / "snapshots" / ("a" * 40)
        snapshot.mkdir(parents=True)
        (cache / f"models--{repo}" / "refs").mkdir()
        (cache / f"models--{repo}" / "refs" / "main").write_text("a" * 40)
        for name in files:
            (snapshot / name).write_bytes((tmp_path / "draft" / name).read_bytes())
    (cache / "models--org--draft" / "snapshots" / ("a" * 40) / "ngram.safetensors").write_bytes(
        (tmp_path / "draft" / "ngram.safetensors").read_bytes())
    (cache / "models--org--ngram" / "snapshots" / ("a" * 40) / "ngram.safetensors").write_bytes(
        (tmp_path / "other.safetensors").read_bytes())
    script = (
        "import numpy as np, torch, sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from _helpers import tiny_target, prompts\n"
        "from dart_hf import DartDraftModel, NgramTable\n"
        "target = tiny_target('llama')\n"
        "draft = DartDraftModel.from_pretrained('org/draft', target=target)\n"
        f"assert np.array_equal(draft.ngram.keys, NgramTable.load({str(tmp_path / 'draft' / 'ngram.safetensors')!r}).keys)\n"
        "draft = DartDraftModel.from_pretrained('org/draft', target=target, ngram='org/ngram')\n"
        f"assert np.array_equal(draft.ngram.keys, NgramTable.load({str(tmp_path / 'other.safetensors')!r}).keys)\n"
        "prompt = prompts(1)[0]\n"
        "assert torch.equal(target.generate(prompt, max_new_tokens=24, assistant_model=draft),\n"
        "                   target.generate(prompt, max_new_tokens=24, do_sample=False))\n"
        "print('hub ok')\n"
    )
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "home"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and "hub ok" in result.stdout, result.stderr[-3000:]


def test_a_trie_with_ids_outside_the_vocabulary_bad_counts_or_broken_links_is_refused(tmp_path):
    write_trie(tmp_path / "good.trie", random_corpus(3), eos=11, order=3, seed=0)
    data = bytearray((tmp_path / "good.trie").read_bytes())
    node_1 = 16 + 24 + 12 * struct.unpack_from("<Q", data, 16 + 16)[0]  # the record after the root's

    def damaged(field_offset: int, fmt: str, value) -> Path:
        copy = bytearray(data)
        struct.pack_into(fmt, copy, node_1 + field_offset, value)
        (tmp_path / "bad.trie").write_bytes(bytes(copy))
        return tmp_path / "bad.trie"

    with pytest.raises(ValueError, match="outside the vocabulary of 11 tokens.*vocab-size"):
        NgramTable.from_trie(tmp_path / "good.trie", vocab_size=11, progress=False)  # token 11 (eos) is out
    with pytest.raises(ValueError, match="outside the vocabulary"):
        NgramTable.from_trie(damaged(0, "<i", -6), vocab_size=12, progress=False)
    with pytest.raises(ValueError, match="counts that are not positive"):
        NgramTable.from_trie(damaged(12, "<i", -3), vocab_size=12, progress=False)
    with pytest.raises(ValueError, match="parent links outside"):
        NgramTable.from_trie(damaged(4, "<Q", 10**9), vocab_size=12, progress=False)
    with pytest.raises(ValueError, match="longer than its order 3 .or a parent cycle"):
        NgramTable.from_trie(damaged(4, "<Q", 1), vocab_size=12, progress=False)  # its own parent
    token = struct.unpack_from("<i", data, node_1)[0]
    with pytest.raises(ValueError, match="child lists do not match"):  # the root lists it under its old token
        NgramTable.from_trie(damaged(0, "<i", (token + 1) % 11), vocab_size=12, progress=False)
    NgramTable.from_trie(tmp_path / "good.trie", vocab_size=12, progress=False)  # the undamaged file converts
