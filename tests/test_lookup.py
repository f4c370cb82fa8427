"""Context lookup: finding the continuation of the latest earlier match, and scoring proposals once committed."""

import numpy as np
import pytest

from dart_hf.lookup import LookupTracker, find_continuation


def naive_continuation(context: list[int], max_match: int, length: int) -> tuple[int, list[int], bool]:
    for match in range(min(max_match, len(context) - 1), 0, -1):
        suffix = context[-match:]
        starts = [s for s in range(len(context) - match) if context[s : s + match] == suffix]  # with a follower
        if starts:
            latest = starts[-1]
            ambiguous = len({context[s + match] for s in starts}) > 1
            return match, context[latest + match : latest + match + length], ambiguous
    return 0, [], False


def test_the_longest_match_wins_then_the_latest_occurrence_and_disagreement_is_flagged():
    context = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 1, 2, 3])
    match, chain, ambiguous = find_continuation(context, max_match=3, length=3)
    assert match == 3 and chain.tolist() == [7, 4, 1] and ambiguous  # 1, 2, 3 was followed by 9, then by 7
    # a more recent one-token match of 3 loses to the older three-token match of 1, 2, 3
    match, chain, ambiguous = find_continuation(np.array([1, 2, 3, 8, 9, 3, 6, 1, 2, 3]), max_match=3, length=10)
    assert match == 3 and chain.tolist() == [8, 9, 3, 6, 1, 2, 3] and not ambiguous  # one earlier occurrence
    match, chain, ambiguous = find_continuation(np.array([1, 2, 3, 8, 9, 3, 6, 1, 2, 3]), max_match=1, length=2)
    assert match == 1 and chain.tolist() == [6, 1] and ambiguous  # 3 was followed by 8, then by 6
    match, chain, ambiguous = find_continuation(np.array([4, 5, 0, 4, 5, 1, 4, 5]), max_match=2, length=1)
    assert match == 2 and chain.tolist() == [1] and ambiguous
    match, chain, ambiguous = find_continuation(np.array([4, 5, 0, 4, 5, 0, 4, 5]), max_match=2, length=1)
    assert match == 2 and chain.tolist() == [0] and not ambiguous  # every occurrence agrees


def test_no_earlier_occurrence_and_overlapping_repeats():
    assert find_continuation(np.array([1, 2, 3]), 3, 10)[0] == 0
    assert find_continuation(np.array([7]), 3, 10)[1].size == 0
    match, chain, _ = find_continuation(np.array([4, 4, 4]), 3, 10)
    assert match == 2 and chain.tolist() == [4]


@pytest.mark.parametrize("seed", range(20))
def test_matches_a_naive_search(seed):
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 4, rng.integers(1, 40))
    match, chain, ambiguous = find_continuation(context, max_match=3, length=5)
    assert (match, chain.tolist(), ambiguous) == naive_continuation(context.tolist(), 3, 5)


def test_tracker_scores_each_proposal_once_its_tokens_are_committed():
    tracker = LookupTracker()
    context = np.array([1, 2, 3, 4])
    tracker.propose(context, 2, np.array([7, 8, 9]))
    tracker.propose(context, 1, np.array([5]))  # wrong at once
    tracker.propose(context, 3, np.array([]))  # nothing proposed: nothing to score
    assert tracker.resolve(np.array([1, 2, 3, 4, 7, 8])) == [(1, 0)]  # [7, 8, 9] still agrees so far
    tracker.propose(np.array([1, 2, 3, 4, 7, 8]), 3, np.array([9, 9]))
    assert tracker.resolve(np.array([1, 2, 3, 4, 7, 8, 9, 1])) == [(2, 3), (3, 1)]
    assert not tracker.pending
