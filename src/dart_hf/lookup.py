"""Context lookup: continuations copied from earlier in the sequence, scored for free against what gets committed.

Text often repeats itself (code that reuses the prompt's names, a summary quoting its article, a list that repeats
its pattern). Like Transformers' prompt-lookup decoding, `find_continuations` finds the latest earlier occurrence
of the sequence's last few tokens and proposes the tokens that followed it (and those that followed the earliest
occurrence, when they differ); the target verifies such a chain like any tree, so it is lossless.

Unlike a drafted tree, a lookup costs nothing to propose, so whether it would have been accepted can be measured
on every step without verifying it: `LookupTracker` remembers each step's proposal and, once the following tokens
are committed (by whatever kind of step), records how many of its leading tokens they matched, per kind of
proposal (its match length, whether the earlier occurrences disagree on what follows, which occurrence). Under
greedy decoding that is exactly the count verification would have accepted; under sampling, a proposed token is
committed with the target's probability of it either way. `dart_hf.budget` turns those counts into the choice of
verifying a lookup chain (and how long) or not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def find_continuations(context: np.ndarray, max_match: int, length: int) -> list[tuple[tuple, np.ndarray]]:
    """Candidate continuations of the context, each with its kind: for the largest n <= `max_match` whose last n
    tokens occur earlier, the tokens that followed their latest earlier occurrence, and, when there are several
    occurrences and the earliest one's continuation differs, the tokens that followed the earliest.

    context: `[S]` token ids (the last one is the step's root). Returns a list of (kind, up to `length` tokens),
    empty when not even the last token occurs earlier. kind = (n, whether the occurrences disagree on the token
    that follows, "latest" or "earliest"): the controller keeps evidence per kind, and they hold at very different
    rates (after matches whose occurrences disagree, the earliest occurrence's continuation holds far more often
    than the latest's in code, where the definition comes first and its later uses vary; `benchmarks/lookup_replay.py`
    measures them: `docs/decoding.md`, "Measurements behind the code").
    """
    size = context.shape[0]
    for match in range(min(max_match, size - 1), 0, -1):
        suffix = context[size - match :]
        windows = sliding_window_view(context[: size - 1], match)  # [S - match, match]: every start with a follower
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            ambiguous = bool((context[hits + match] != context[hits[-1] + match]).any())
            latest = context[hits[-1] + match : hits[-1] + match + length]
            candidates = [((match, ambiguous, "latest"), latest)]
            earliest = context[hits[0] + match : hits[0] + match + length]
            if hits.size > 1 and not np.array_equal(earliest, latest):
                candidates.append(((match, ambiguous, "earliest"), earliest))
            return candidates
    return []


class LookupTracker:
    """Scores proposals against the tokens committed after them.

    `propose(context, kind, chain)` is called for each candidate of a step before it runs (context `[S]`, kind: a
    key such as `find_continuations` gives, chain: the proposed next tokens); `resolve(context)` after tokens are
    committed returns `(kind, matched)` for every proposal now decided:
    `matched` is the number of leading chain tokens the committed text equals (a mismatch or the whole chain seen).
    """

    def __init__(self):
        self.pending: deque[tuple[int, Hashable, np.ndarray]] = deque()  # (position of its first token, kind, chain)

    def propose(self, context: np.ndarray, kind: Hashable, chain: np.ndarray) -> None:
        if chain.size:
            self.pending.append((context.shape[0], kind, chain))

    def resolve(self, context: np.ndarray) -> list[tuple[Hashable, int]]:
        decided, still_pending = [], deque()
        for position, kind, chain in self.pending:
            seen = context[position : position + chain.size]
            differs = np.flatnonzero(seen != chain[: seen.size])
            if differs.size:
                decided.append((kind, int(differs[0])))
            elif seen.size == chain.size:
                decided.append((kind, int(chain.size)))
            else:
                still_pending.append((position, kind, chain))
        self.pending = still_pending
        return decided
