"""Benchmark of the tree-search step and the N-gram table (issue: continuity-aware tree pruning).

Measures, on this machine: (1) the median time of one BeamSearchTreePolicy call with the reference defaults
(8 levels x top-25, beam 20, 60 nodes, order-3 table, 49,152-token vocabulary); (2) N-gram lookup throughput
(candidate probabilities per second, batches of 500 as in the tree search, and one large batch); (3) the time to
load (memory-map) a table built from 10 million tokens. The corpus is synthetic (Zipf-distributed token ids in
documents of 50-500 tokens): real text has a similar heavy-tailed n-gram distribution.

    python benchmarks/bench_tree_ngram.py [--tokens 10000000] [--out benchmarks/results/tree_ngram.json]
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _common import report
from dart_hf import BeamSearchTreePolicy, NgramTable

VOCAB = 49_152


def synthetic_documents(num_tokens: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    produced = 0
    while produced < num_tokens:
        length = int(rng.integers(50, 500))
        yield (rng.zipf(1.2, length) - 1) % VOCAB
        produced += length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = {"tokens": args.tokens, "torch_threads": torch.get_num_threads()}

    start = time.perf_counter()
    table = NgramTable.from_sequences(synthetic_documents(args.tokens), vocab_size=VOCAB, eos_token_id=0)
    results["build_seconds"] = time.perf_counter() - start
    results["kgrams"] = [table.num_kgrams(k) for k in range(1, table.order + 1)]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "ngram.safetensors"
        table.save(path)
        results["file_mb"] = path.stat().st_size / 1e6
        load_times = []
        for _ in range(5):
            start = time.perf_counter()
            loaded = NgramTable.load(path)
            load_times.append(time.perf_counter() - start)
        results["load_seconds_median"] = float(np.median(load_times))

        rng = np.random.default_rng(1)
        sample = next(synthetic_documents(10_000, seed=2))
        contexts = np.stack([sample[i : i + 2] for i in range(len(sample) - 2)])
        for batch_rows, label in ((20, "lookups_per_second_500"), (4000, "lookups_per_second_100k")):
            rows = contexts[rng.integers(0, len(contexts), batch_rows)]
            candidates = (rng.zipf(1.2, (batch_rows, 25)) - 1) % VOCAB
            loaded.probabilities(rows, candidates)
            times = []
            for _ in range(max(5, args.repeats // (10 if batch_rows > 100 else 1))):
                start = time.perf_counter()
                loaded.probabilities(rows, candidates)
                times.append(time.perf_counter() - start)
            results[label] = candidates.size / float(np.median(times))

        policy = BeamSearchTreePolicy(ngram=loaded, eos_token_ids=(0,))
        generator = torch.Generator().manual_seed(0)
        times = []
        for repeat in range(args.repeats + 10):
            logits = torch.randn(8, VOCAB, generator=generator) * 4
            context = torch.from_numpy(contexts[repeat % len(contexts)].copy())
            start = time.perf_counter()
            tree = policy(logits, context, lambda ids: ids)
            if repeat >= 10:
                times.append(time.perf_counter() - start)
        results["tree_search_ms_median"] = 1000 * float(np.median(times))
        results["tree_search_ms_p90"] = 1000 * float(np.percentile(times, 90))
        results["tree_nodes"] = len(tree) - 1

    report(results, args.out)


if __name__ == "__main__":
    main()
