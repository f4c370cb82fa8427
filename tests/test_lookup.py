"""Context lookup: finding the continuations of the latest and earliest earlier matches, and scoring proposals
once committed."""

import numpy as np
import pytest

from dart_hf.lookup import LookupTracker, find_continuations


def naive_continuations(context: list[int], max_match: int, length: int) -> list[tuple[tuple, list[int]]]:
    for match in range(min(max_match, len(context) - 1), 0, -1):
        suffix = context[-match:]
        starts = [s for s in range(len(context) - match) if context[s : s + match] == suffix]  # with a follower
        if starts:
            ambiguous = len({context[s + match] for s in starts}) > 1
            found = [((match, ambiguous, "latest"), context[starts[-1] + match : starts[-1] + match + length])]
            earliest = context[starts[0] + match : starts[0] + match + length]
            if earliest != found[0][1]:
                found.append(((match, ambiguous, "earliest"), earliest))
            return found
    return []


def chains(candidates) -> list[tuple[tuple, list[int]]]:
    return [(kind, chain.tolist()) for kind, chain in candidates]


def test_the_longest_match_wins_with_its_latest_and_earliest_occurrences():
    context = np.array([5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 1, 2, 3])
    assert chains(find_continuations(context, max_match=3, length=3)) == [
        ((3, True, "latest"), [7, 4, 1]),  # 1, 2, 3 was followed by 9, then by 7: the occurrences disagree
        ((3, True, "earliest"), [9, 1, 2]),
    ]
    # a more recent one-token match of 3 loses to the older three-token match of 1, 2, 3
    context = np.array([1, 2, 3, 8, 9, 3, 6, 1, 2, 3])
    assert chains(find_continuations(context, max_match=3, length=10)) == [
        ((3, False, "latest"), [8, 9, 3, 6, 1, 2, 3]),
    ]
    assert chains(find_continuations(context, max_match=1, length=2)) == [
        ((1, True, "latest"), [6, 1]),  # 3 was followed by 8, then by 6
        ((1, True, "earliest"), [8, 9]),
    ]
    # the occurrences agree on the next token, and the earliest's continuation differs only after it
    context = np.array([4, 5, 0, 1, 4, 5, 0, 2, 4, 5])
    assert chains(find_continuations(context, max_match=2, length=2)) == [
        ((2, False, "latest"), [0, 2]),
        ((2, False, "earliest"), [0, 1]),
    ]
    context = np.array([4, 5, 0, 4, 5, 0, 4, 5])  # every occurrence is followed alike: one candidate
    assert chains(find_continuations(context, max_match=2, length=1)) == [((2, False, "latest"), [0])]


def test_no_earlier_occurrence_and_overlapping_repeats():
    assert find_continuations(np.array([1, 2, 3]), 3, 10) == []
    assert find_continuations(np.array([7]), 3, 10) == []
    assert chains(find_continuations(np.array([4, 4, 4]), 3, 10)) == [((2, False, "latest"), [4])]


@pytest.mark.parametrize("seed", range(20))
def test_matches_a_naive_search(seed):
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 4, rng.integers(1, 40))
    assert chains(find_continuations(context, max_match=3, length=5)) == naive_continuations(context.tolist(), 3, 5)


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
