"""The balanced policy's dynamic programme against brute force, on synthetic cost tables (its refinement during
a run: test_refinement.py)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from remote.floor.balance import CostTable, Link, NoFeasibleSplit, balanced_split, brute_force_split, evaluate


def _table(rng: random.Random, stages: int, pieces: int, *, speeds: list[float] | None = None,
           memory: bool = False) -> CostTable:
    base = [rng.uniform(0.5, 3.0) for _ in range(pieces)]
    speeds = speeds or [1.0] * stages
    weights = [rng.uniform(1, 10) for _ in range(pieces)]
    limit = [sum(weights) / stages * rng.uniform(1.1, 1.8) for _ in range(stages)] if memory else []
    return CostTable(compute_s=[[t / speed for t in base] for speed in speeds],
                     cut_bytes=[0.0, *(rng.uniform(1e5, 1e6) for _ in range(pieces - 1))],
                     links=[Link(rng.uniform(0, 0.01), rng.uniform(1e6, 1e8)) for _ in range(stages - 1)],
                     piece_bytes=weights if memory else [], memory_limit=limit)


@pytest.mark.parametrize("stages", range(2, 9))
@pytest.mark.parametrize("kind", ["homogeneous", "heterogeneous", "memory-limited"])
def test_dynamic_programme_finds_the_brute_force_bottleneck(stages: int, kind: str) -> None:
    rng = random.Random(stages * 31 + len(kind))
    for trial in range(5):
        speeds = [rng.choice([0.5, 1.0, 2.0]) for _ in range(stages)] if kind == "heterogeneous" else None
        table = _table(rng, stages, 12, speeds=speeds, memory=kind == "memory-limited")
        try:
            expected = brute_force_split(table)
        except NoFeasibleSplit:
            with pytest.raises(NoFeasibleSplit):
                balanced_split(table)
            continue
        found = balanced_split(table)
        assert found.bottleneck_s == pytest.approx(expected.bottleneck_s), (trial, found, expected)
        assert evaluate(table, found.starts).stage_s == found.stage_s  # the prediction is the split's own


def test_a_half_speed_host_gets_a_proportionally_smaller_share() -> None:
    table = CostTable(compute_s=[[1.0] * 24, [2.0] * 24], cut_bytes=[0.0] * 24, links=[Link()])
    split = balanced_split(table)
    assert split.starts == (16,)  # 16 pieces at 1 s and 8 at 2 s: both stages take 16 s
    assert split.stage_s == (16.0, 16.0)


def test_transfer_cost_moves_the_cut_to_a_cheap_place() -> None:
    # Equal compute; cutting before piece 2 sends 1000x less than anywhere else.
    table = CostTable(compute_s=[[1.0] * 4] * 2, cut_bytes=[0.0, 1e9, 1e6, 1e9], links=[Link(0.0, 1e9)])
    assert balanced_split(table).starts == (2,)


def test_impossible_inputs_are_refused() -> None:
    with pytest.raises(NoFeasibleSplit, match="3 stages but only 2 pieces"):
        balanced_split(CostTable(compute_s=[[1.0, 1.0]] * 3, cut_bytes=[0.0, 0.0], links=[Link(), Link()]))
    tight = CostTable(compute_s=[[1.0] * 4] * 2, cut_bytes=[0.0] * 4, links=[Link()], piece_bytes=[5.0] * 4,
                      memory_limit=[6.0, 6.0])
    with pytest.raises(NoFeasibleSplit, match="memory limit"):
        balanced_split(tight)
    assert math.isinf(evaluate(tight, [2]).bottleneck_s)


def test_links_bound_the_pipeline_apart_from_the_stages() -> None:
    # A slow wire: 1 MB at 10 MB/s is 0.1 s per microbatch, more than either stage computes.
    table = CostTable(compute_s=[[0.01] * 4] * 2, cut_bytes=[0.0, 1e6, 1e5, 1e6], links=[Link(0.0, 1e7)])
    split = balanced_split(table)
    assert split.starts == (2,) and split.link_s == pytest.approx((0.01,)) and split.bottleneck_s == 0.02
    copies = CostTable(compute_s=[[0.01] * 4] * 2, cut_bytes=[0.0, 1e6, 1e5, 1e6], links=[Link()],
                       comm_s_per_byte=[1e-8, 1e-8])
    assert evaluate(copies, (2,)).stage_s == pytest.approx((0.021, 0.021))  # each side copies 100 kB


def test_what_a_slow_links_bytes_cost_the_hosts_moves_the_cut_to_a_small_activation() -> None:
    # Six equal pieces: the even cut (before piece 3) sends 3 MB, any other 0.1 MB. The wire itself is fast.
    compute, cut = [[1.0] * 6] * 2, [0.0, 1e5, 1e5, 3e6, 1e5, 1e5]
    free = CostTable(compute_s=compute, cut_bytes=cut, links=[Link(0.0, 1e9)])
    assert balanced_split(free).starts == (3,)
    # Measured on the link: every byte received takes 0.5 us of the receiver's compute (a quota-bound host
    # woken for each few packets), so 3 MB cost it 1.5 s and a cut beside the large activation wins.
    dear = CostTable(compute_s=compute, cut_bytes=cut, links=[Link(0.0, 1e9, send_s_per_byte=1e-8,
                                                                    recv_s_per_byte=5e-7)])
    split = balanced_split(dear)  # (before piece 4, the receiver's 0.05 s lands on the stage with less work)
    assert split.starts == (4,) and split.stage_s == pytest.approx((4.001, 2.05))
    assert evaluate(dear, (3,)).stage_s == pytest.approx((3.03, 4.5))  # the sender pays its 10 ns a byte too
    # A local copy dearer than the link's own cost counts instead (the larger of the two, never both).
    copies = CostTable(compute_s=compute, cut_bytes=cut, links=[dear.links[0]], comm_s_per_byte=[1e-7, 1e-7])
    assert evaluate(copies, (3,)).stage_s == pytest.approx((3.3, 4.5))
    # A run's correction (a host found twice as slow) scales what its end of the link costs it.
    slowed = dear.corrected([1.0, 2.0])
    assert slowed.links[0].recv_s_per_byte == pytest.approx(1e-6) and slowed.links[0].send_s_per_byte == 1e-8


def test_when_one_piece_bounds_the_pipeline_the_shortest_way_through_wins_the_tie() -> None:
    # The last piece (5 s) is the bottleneck wherever the other cut goes; of those ties, the split whose first
    # microbatch crosses the pipeline soonest (stages and links added up) fills and drains each pass fastest.
    table = CostTable(compute_s=[[1.0, 1.0, 1.0, 1.0, 5.0]] * 3, cut_bytes=[0.0, 1e6, 1e3, 1e6, 1e3],
                      links=[Link(0.0, 1e7)] * 2)
    split = balanced_split(table)
    assert split.bottleneck_s == 5.0 and split.starts == (2, 4)
    before = evaluate(table, (1, 4))  # (the first tie found, scanning left to right: 1 MB on the first link)
    assert sum(split.stage_s) + sum(split.link_s) < sum(before.stage_s) + sum(before.link_s) - 0.09
    # Every split that ties is no shorter (brute force over them).
    ties = [evaluate(table, st) for st in itertools.combinations(range(1, 5), 2)]
    shortest = min(sum(t.stage_s) + sum(t.link_s) for t in ties if t.bottleneck_s == 5.0)
    assert sum(split.stage_s) + sum(split.link_s) == pytest.approx(shortest)
