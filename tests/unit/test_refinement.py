"""`balanced`'s refinement during a run (`remote.floor.refinement`): measured with its noise, a move only beyond it.

The refiner is driven as rank 0 drives it: one `observe` per calibration pass, with every stage's microbatch
times, made here from a true cost table (each host some factor off its profile) and noise of two kinds: a
factor per pass and stage (a pass that runs slow or fast as a whole, as at 4 threads on shared memory) and
jitter per microbatch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pictl.headless import refine_line
from remote.floor.balance import CostTable, Link, balanced_split, evaluate
from remote.floor.refinement import Refiner, Spread, stage_spread
from remote.floor.run_records import Refine, Refined


def _table(rng: random.Random, stages: int, pieces: int) -> CostTable:
    return CostTable(compute_s=[[rng.uniform(0.5, 3.0) for _ in range(pieces)]] * stages,
                     cut_bytes=[0.0] * pieces, links=[Link()] * (stages - 1))


def _pass(truth: CostTable, starts: Sequence[int], rng: random.Random, *, per_pass: Sequence[float],
          jitter: float, microbatches: int = 24) -> list[list[float]]:
    """One calibration pass: each stage's microbatch times, its true time x its pass factor x jitter."""
    return [[t * f * rng.uniform(1 - jitter, 1 + jitter) for _ in range(microbatches)]
            for t, f in zip(evaluate(truth, starts).stage_s, per_pass, strict=True)]


def _refine(refiner: Refiner, truth: CostTable, rng: random.Random, pass_noise: float, jitter: float) -> list[
        tuple[tuple[int, ...], tuple[int, ...], Spread, Spread]]:
    """Runs the refiner to its end; returns every change of the adopted split with both splits' measured
    bottlenecks at the moment of the decision (old, new, old's, new's)."""
    moves = []
    nxt: tuple[int, ...] | None = refiner.starts
    while nxt is not None:
        held = refiner.adopted
        per_pass = [rng.uniform(1 - pass_noise, 1 + pass_noise) for _ in range(truth.stages)]
        nxt = refiner.observe(_pass(truth, refiner.starts, rng, per_pass=per_pass, jitter=jitter))
        if refiner.adopted != held:
            moves.append((held, refiner.adopted, refiner.measured(held), refiner.measured(refiner.adopted)))
        assert len(refiner.rounds) <= refiner.max_rounds + refiner.max_repeats  # the budget holds
    return moves


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stages=st.integers(2, 4), seed=st.integers(0, 10_000), pass_noise=st.floats(0.0, 0.4),
       jitter=st.floats(0.0, 0.5), spread=st.floats(1.0, 3.0))
def test_a_gain_inside_the_noise_is_never_adopted(stages: int, seed: int, pass_noise: float, jitter: float,
                                                  spread: float) -> None:
    """Whatever the cluster and however noisy the passes: the adopted split changes only when the new split's
    measured bottleneck interval lies wholly below the old one's and its median is lower by min_gain; the
    timed passes run the split the last round names; and the budget of passes holds."""
    rng = random.Random(seed)
    profiled = _table(rng, stages, 16)
    truth = profiled.corrected([rng.uniform(1 / spread, spread) for _ in range(stages)])
    refiner = Refiner(profiled, balanced_split(profiled).starts)
    for old, new, held, found in _refine(refiner, truth, rng, pass_noise, jitter):
        assert new != old and found.high < held.low and found.median <= held.median * (1 - refiner.min_gain)
    last = refiner.rounds[-1]
    assert last.next_starts is None and last.adopted_round == refiner.chosen_round
    assert last.reason.endswith(f"the timed passes run round {refiner.chosen_round}'s split")
    assert refiner.rounds[refiner.chosen_round - 1].starts == refiner.chosen


@settings(max_examples=100, deadline=None)
@given(stages=st.integers(2, 4), seed=st.integers(0, 10_000), slow=st.floats(2.0, 4.0),
       fast=st.booleans())
def test_a_clear_gain_is_adopted(stages: int, seed: int, slow: float, fast: bool) -> None:
    """One host's profile is off by 2-4x (slower or faster than it is) and the passes are steady (2 %): the
    split the corrected table gives gains 30 % or more, and it is adopted in round 2, then run."""
    rng = random.Random(seed)
    profiled = _table(rng, stages, 16)
    hidden = [1.0] * stages
    hidden[rng.randrange(stages)] = 1 / slow if fast else slow
    truth = profiled.corrected(hidden)
    first, best = balanced_split(profiled).starts, balanced_split(truth)
    assume(best.bottleneck_s < 0.7 * evaluate(truth, first).bottleneck_s)
    refiner = Refiner(profiled, first)
    moves = _refine(refiner, truth, rng, pass_noise=0.02, jitter=0.02)
    assert moves and moves[0][:2] == (first, refiner.rounds[1].starts) and refiner.rounds[1].adopted_round == 2
    assert evaluate(truth, refiner.chosen).bottleneck_s <= 1.05 * best.bottleneck_s
    assert refiner.factors == pytest.approx(hidden, rel=0.05)


def test_the_field_notes_noisy_neighbouring_cuts_end_in_a_tie() -> None:
    """The 16-core run of the field notes (section 12): the profile is right, but rank 0 measures 14.3, then
    9.3, then 15.2 ms for neighbouring cuts. One pass each would have moved the cut; measured again, the
    intervals overlap, it is a tie within the noise, and the first split is run, saying so."""
    profiled = CostTable(compute_s=[[0.00126] * 40] * 4, cut_bytes=[0.0] * 40, links=[Link()] * 3)
    first = balanced_split(profiled).starts
    refiner = Refiner(profiled, first)
    stage0 = iter([0.0143, 0.0093, 0.0152, 0.0120])  # rank 0's median per pass, whatever its pieces
    rng = random.Random(1)
    nxt: tuple[int, ...] | None = first
    while nxt is not None:
        true, rank0 = evaluate(profiled, refiner.starts).stage_s, next(stage0)
        pass_ = [[rank0 * rng.uniform(0.99, 1.01) for _ in range(24)]]
        pass_ += [[t * rng.uniform(0.99, 1.01) for _ in range(24)] for t in true[1:]]
        nxt = refiner.observe(pass_)
    assert [r.first_round for r in refiner.rounds] == [1, 2, 1, 2]  # the challenger, then both again
    assert refiner.chosen == first and refiner.chosen_round == 1
    assert "a tie within the noise" in refiner.rounds[-1].reason
    assert refiner.rounds[-1].reason.endswith("the timed passes run round 1's split")


def test_a_split_worse_than_the_adopted_one_is_dropped_and_the_adopted_one_runs() -> None:
    """Round 2's split is adopted; round 3's measures slower: the timed passes run round 2's split, and round
    3's record says so (not "keep it" of the split it measured)."""
    table = CostTable(compute_s=[[1.0] * 20] * 2, cut_bytes=[0.0] * 20, links=[Link()])
    refiner = Refiner(table, (10,))
    steady = lambda a, b: [[a] * 12, [b] * 12]  # noqa: E731
    assert refiner.observe(steady(10.0, 30.0)) == (15,)  # host 1 measured 3x its profile: a cut further right
    # Round 2 measures host 0 slower than round 1 said (its pooled factor rises): another cut is tried.
    nxt = refiner.observe(steady(20.0, 12.0))
    assert refiner.rounds[-1].adopted_round == 2 and nxt is not None and nxt != (15,)
    assert refiner.observe(steady(40.0, 40.0)) is None  # round 3 measures far slower: dropped
    assert refiner.chosen == (15,) and refiner.chosen_round == 2
    assert refiner.rounds[-1].reason.endswith("the timed passes run round 2's split")


def test_refinement_finds_the_true_optimum_when_each_host_is_uniformly_off() -> None:
    rng = random.Random(5)
    profiled = _table(rng, 4, 30)
    hidden = [1.0, 2.0, 0.5, 1.3]
    truth = profiled.corrected(hidden)
    refiner = Refiner(profiled, balanced_split(profiled).starts)
    steady = [1.0] * 4
    assert refiner.observe(_pass(truth, refiner.starts, rng, per_pass=steady, jitter=0.0)) == \
        balanced_split(truth).starts
    assert refiner.factors == pytest.approx(hidden)
    assert refiner.observe(_pass(truth, refiner.starts, rng, per_pass=steady, jitter=0.0)) is None
    assert refiner.chosen == balanced_split(truth).starts and refiner.chosen_round == 2
    assert refiner.predicted(refiner.chosen).stage_s == pytest.approx(evaluate(truth, refiner.chosen).stage_s)


def test_refinement_keeps_a_split_whose_predicted_gain_is_small() -> None:
    table = CostTable(compute_s=[[1.0] * 20] * 2, cut_bytes=[0.0] * 20, links=[Link()])
    refiner = Refiner(table, (10,), min_gain=0.03)
    # Stage 1 measured 2 % slower than predicted: moving a piece would gain less than 3 %.
    assert refiner.observe([[10.0] * 8, [10.2] * 8]) is None
    assert refiner.chosen == (10,) and len(refiner.rounds) == 1


def test_a_stage_spread_holds_the_noise_seen_and_an_allowance_for_passes_not_seen() -> None:
    one = stage_spread([[10.0] * 24], pass_noise=0.1)  # one steady pass: the allowance alone
    assert (one.median, one.low, one.high, one.seen) == pytest.approx((10.0, 9.0, 11.0, 0.0))
    two = stage_spread([[10.0] * 24, [12.0] * 24], pass_noise=0.1)  # two passes 20 % apart: their range
    assert two.median == pytest.approx(11.0) and two.seen == pytest.approx(1 / 11)
    assert (two.low, two.high) == pytest.approx((10.0, 12.0))
    wide = stage_spread([[10.0 + i % 5 for i in range(25)]], pass_noise=0.0)  # one pass, IQR 2 over 25
    assert wide.median == 12.0 and (wide.high - wide.median) == pytest.approx(1.57 * 2 / 5)


def test_the_lines_say_which_round_s_split_the_timed_passes_run() -> None:
    round_ = Refine(round=3, split_points=["blocks.3"], predicted_ms=[12.0, 12.5], measured_ms=[15.2, 12.1],
                    low_ms=[13.7, 11.0], high_ms=[16.7, 13.2], first_round=3, passes=1, factors=[1.2, 1.0],
                    adopted_round=2, reason="round 3's split 15.2 ms (13.7-16.7) against round 2's split 13.1 ms "
                    "(12.2-14.0): not faster by 3%; the timed passes run round 2's split")
    line = refine_line(round_)
    assert line.startswith("pictl refine: round 3: blocks.3: measured 15.2 / 12.1 ms (slowest 15.2, 13.7-16.7 "
                           "over 1 pass(es))") and line.endswith("the timed passes run round 2's split")
    done = Refined(rounds=3, split_points=["blocks.4"], predicted_ms=[12.4, 12.6], factors=[1.1, 1.0],
                   chosen_round=2, measured_ms=[13.1, 12.9], low_ms=[12.2, 12.0], high_ms=[14.0, 13.8], passes=2,
                   calibration_passes=3, calibration_s=4.25)
    assert refine_line(done) == ("pictl refine: the timed passes run round 2's split blocks.4: measured 13.1 / "
                                 "12.9 ms (slowest 13.1, 12.2-14.0 over 2 pass(es)), predicted 12.4 / 12.6 ms per "
                                 "microbatch; refinement added 3 untimed pass(es), 4.2 s, to start-up")


def test_a_stage_that_outpaces_its_link_does_not_correct_its_host() -> None:
    """MobileNetV2's case (docs/benchmarks.md): stage 0 computes 2 ms a microbatch but feeds a link that needs
    8 ms for its cut's bytes, so its sends back up and its measured compute is 10 ms. That says nothing of host
    0's speed: its factor stays, while stage 1 (not link-bound) is corrected as measured. Counted, the factor
    would have been 5x, and under it a cut where the big activation crosses a slower link would look best."""
    pieces = 10
    table = CostTable(compute_s=[[1.0e-3] * pieces] * 2, cut_bytes=[0.0, 0.0, 8e5, *([1e4] * (pieces - 3))],
                      links=[Link(latency_s=0.0, bytes_per_s=1e8)])  # 0.8 MB at 100 MB/s: 8 ms
    refiner = Refiner(table, (2,))
    assert evaluate(table, (2,)).link_s[0] > evaluate(table, (2,)).stage_s[0]  # stage 0 outpaces its link
    refiner.observe([[10e-3] * 12, [9.6e-3] * 12])
    assert refiner.factors[0] == 1.0  # not 5.0
    assert refiner.factors[1] == pytest.approx(1.2)  # 9.6 ms measured over 8 pieces of 1 ms
    # A split whose first stage does not outpace its link corrects host 0 as it measures.
    unbound = Refiner(table, (6,))
    unbound.observe([[12e-3] * 12, [4e-3] * 12])
    assert unbound.factors[0] == pytest.approx(2.0)
