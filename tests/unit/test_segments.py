"""A run's segments and the controller's watch (`pictl.run.segments`): it starts from what refinement ended on,
judges each timed pass rank 0 reports, records its decision as the run's records (`recut`, then `refined`), and a
moved cut ends one segment and opens the next, each summed up over its own passes against one reference.
The functional side (real ranks waiting for the answer) is tests/functional/test_balanced.py."""

from __future__ import annotations

from pictl.run.segments import RecutWatch, Segments
from remote.floor.balance import evaluate
from remote.floor.refinement import table_of
from remote.floor.run_records import PassWatched, Recut, Refined
from remote.floor.spec import RefineSpec

PIECES = [f"blocks.{i}" for i in range(12)]
REFINE = RefineSpec(compute_s=[[0.001] * 12, [0.001] * 12], cut_bytes=[1000.0] * 12, links=[[0.0, 1e12]],
                    comm_s_per_byte=[0.0, 0.0])


def _watched(after_pass: int, split: list[str], slow: list[float]) -> PassWatched:
    """What rank 0 reports for `split` with hosts `slow` times slower."""
    stage_s = evaluate(table_of(REFINE).corrected(slow), tuple(PIECES.index(n) for n in split)).stage_s
    return PassWatched(after_pass=after_pass, measured_ms=[s * 1000 for s in stage_s], rank=0)


def test_a_drifting_host_ends_the_segment_and_the_decision_is_recorded_as_the_run_s() -> None:
    segments = Segments()
    segments.begin(["blocks.4"], ["h0", "h1"])  # the controller's first split
    watch = RecutWatch(REFINE, PIECES, segments, "h0")
    watch.on_refined(Refined(rounds=2, split_points=["blocks.6"], predicted_ms=[6.0, 6.0], factors=[1.0, 1.0],
                             chosen_round=2))
    assert segments.items[0].split_points == ["blocks.6"]  # refinement chose what the timed passes begin on
    said = [watch.judge(_watched(p, ["blocks.6"], [1.0, 2.0] if p >= 1 else [1.0, 1.0])) for p in range(2)]
    assert said == [([], None), ([], None)]  # the first pass sets the expectation; one drifting pass is patience
    records, split = watch.judge(_watched(2, ["blocks.6"], [1.0, 2.0]))
    recut, refined = records
    assert isinstance(recut, Recut) and isinstance(refined, Refined) and recut.moved and split == recut.next_split
    assert recut.after_pass == 2 and "stage 1 measured 100% slower" in recut.reason and refined.split_points == split
    assert PIECES.index(split[0]) > 6 and refined.factors == [1.0, 2.0]  # less on the slowed host
    assert {(r.role, r.rank, r.host) for r in records} == {("controller", 0, "h0")} and recut.t > 0
    # The pass right after a re-cut is not judged (a rebuilt stage is cold): nothing said, the split stays.
    assert watch.judge(_watched(3, split, [1.0, 2.0])) == ([], None)

    first, second = segments.summary([4.0, 3.0, 3.1, 4.4, 4.6], images=8, serial_ips=2.0, planned=[])
    assert (first["passes"], first["split_points"], first["ended_by"]) == ([0, 2], ["blocks.6"], "re-cut")
    assert (second["passes"], second["split_points"], second["ended_by"]) == ([3, 4], split, None)
    assert second["pass_ips"] == [4.4, 4.6] and second["ips"] == 4.5 and second["speedup"] == 2.25
    assert first["images"] == 24 and second["images"] == 16 and second["hosts"] == ["h0", "h1"]


def test_without_re_cutting_a_run_is_one_segment_on_its_planned_split() -> None:
    segments = Segments()
    segments.begin([], ["h0", "h1", "h2"])  # `equal`: the hosts' plan makes the split
    off = RefineSpec(**{**REFINE.__dict__, "recut": False})
    watch = RecutWatch(off, PIECES, segments, "h0")
    watch.on_refined(Refined(rounds=1, split_points=["blocks.4"], predicted_ms=[1.0], factors=[1.0, 1.0],
                             chosen_round=1))
    assert watch.judge(_watched(1, ["blocks.4"], [1.0, 5.0])) == ([], None)  # no watch: nothing judged
    (only,) = segments.summary([3.0, 5.0], images=4, serial_ips=None, planned=["blocks.3", "blocks.7"])
    assert only["passes"] == [0, 1] and only["ips"] == 4.0 and only["speedup"] is None
    assert only["split_points"] == ["blocks.4"] and only["ended_by"] is None
    assert Segments().summary([], images=4, serial_ips=1.0, planned=[]) == []  # a serial-only run: none


def test_a_lost_host_ends_the_segment_and_the_next_counts_every_pass_once() -> None:
    segments = Segments()
    segments.begin([], ["h0", "h1", "h2"])
    segments.ran(["blocks.4", "blocks.8"])  # (equal's split, in the ranks' own words)
    segments.host_lost("h1", 1, [], ["h0", "h2"])
    segments.ran(["blocks.6"])
    rows = segments.summary([10.0, 7.0, 7.5], 12, 5.0, ["planned"])
    assert [(r["hosts"], r["split_points"], r["passes"], r["images"], r["ended_by"], r["lost_host"]) for r in rows] == [
        (["h0", "h1", "h2"], ["blocks.4", "blocks.8"], [0, 0], 12, "host-lost", "h1"),
        (["h0", "h2"], ["blocks.6"], [1, 2], 24, None, None)]
    assert rows[1]["ips"] == 7.25 and rows[1]["speedup"] == 1.45
    # Lost before any timed pass of its own: the segment shows none, and the next runs them all.
    early = Segments()
    early.begin(["blocks.6"], ["h0", "h1"])
    early.host_lost("h1", 0, ["blocks.3"], ["h0", "h2"])
    first, second = early.summary([8.0, 8.0], 6, None, [])
    assert (first["passes"], first["images"], first["ips"]) == (None, 0, None) and second["passes"] == [0, 1]
