"""The watch over the timed passes (`remote.floor.recut`): noise never moves the cut, a slowed host does (once,
after its patience), a recovered one moves it back, and a slowdown no split can help is absorbed."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from remote.floor.balance import CostTable, Link, evaluate
from remote.floor.recut import Watch

PIECES = 24
TABLE = CostTable(compute_s=[[0.001] * PIECES for _ in range(4)], cut_bytes=[1000.0] * PIECES,
                  links=[Link(0.0, 1e12)] * 3)
START = (6, 12, 18)


def _measure(starts: tuple[int, ...], slow: list[float], noise: random.Random | None = None) -> list[float]:
    """What the stages measure for `starts` with hosts `slow` times slower (and up to 5 % of noise)."""
    true = evaluate(TABLE.corrected(slow), starts).stage_s
    return [t * (1 + noise.uniform(-0.05, 0.05)) if noise else t for t in true]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_noise_alone_never_moves_the_cut(seed: int) -> None:
    noise = random.Random(seed)
    watch = Watch(TABLE, START, [1.0] * 4)
    for p in range(60):
        assert watch.observe(_measure(watch.starts, [1.0] * 4, noise), p) is None
    assert watch.starts == START and not watch.decisions


def test_a_slowed_host_moves_the_cut_and_a_recovered_one_moves_it_back() -> None:
    watch = Watch(TABLE, START, [1.0] * 4)
    slow = [1.0, 2.0, 1.0, 1.0]
    decisions = [d for p in range(6) if (d := watch.observe(_measure(watch.starts, slow if p >= 2 else [1.0] * 4),
                                                            p)) is not None]
    (first,) = decisions
    assert first.after_pass == 3 and first.moved and "stage 1 measured 100% slower" in first.reason
    assert first.new_starts[1] - first.new_starts[0] < 6  # fewer pieces on the slowed host
    assert max(first.new_predicted_s) < 0.95 * max(first.old_predicted_s)
    assert watch.factors[1] == 2.0 and watch.factors[0] == 1.0
    # The pass after a re-cut is not judged; the new split then measures as predicted: nothing more happens.
    assert all(watch.observe(_measure(watch.starts, slow), p) is None for p in range(6, 12))
    back = [d for p in range(12, 18) if (d := watch.observe(_measure(watch.starts, [1.0] * 4), p)) is not None]
    assert len(back) == 1 and back[0].moved and back[0].new_starts == START and watch.recuts == 2


def test_max_recuts_and_a_slowdown_no_split_can_help() -> None:
    watch = Watch(TABLE, START, [1.0] * 4, max_recuts=0)
    watch.observe(_measure(START, [1.0] * 4), 0)  # the first timed pass sets the expectation
    found = [d for p in range(1, 5) if (d := watch.observe(_measure(watch.starts, [1.0, 2.0, 1.0, 1.0]), p))]
    assert len(found) == 1 and not found[0].moved and watch.starts == START
    assert watch.factors[1] == 2.0  # corrected all the same: the slow host drifts no more
    assert watch.observe(_measure(START, [1.0, 2.0, 1.0, 1.0]), 5) is None
    even = Watch(TABLE, START, [1.0] * 4)  # every host 1.5x slower: no split is better
    even.observe(_measure(START, [1.0] * 4), 0)
    found = [d for p in range(1, 5) if (d := even.observe(_measure(even.starts, [1.5] * 4), p))]
    assert len(found) == 1 and not found[0].moved and even.starts == START
