"""Profiler traces: real torch.profiler traces from a real 2-rank run, merged onto one time axis."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest
from support.cli import ROOT
from support.clusters import write_cluster

from pictl import errors as E
from pictl.events import RankEvent
from pictl.inventory import load_cluster
from pictl.planning.options import RunOptions
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession
from pictl.run.trace_files import AGREE_POINTS, against_counters, load_trace, merge, rank_breakdown
from pictl.summary_models import RunSummary
from remote.floor import protocol as P


def _throughputs(summary: RunSummary) -> list[dict]:
    """The last rank's throughput events of a run (its record), one per timed pass."""
    run_dir = Path(summary.run_dir or "")
    last = summary.per_stage[-1].host
    return [e for e in map(json.loads, (run_dir / "events" / f"{last}.jsonl").read_text().splitlines())
            if e.get("event") == "throughput"]


def _x(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 4242, "tid": tid}


def test_merge_rebases_each_rank_on_the_controller_clock() -> None:
    # Host b's clock runs 2 ms ahead of ours: its events must move 2 ms earlier.
    a = {"baseTimeNanoseconds": 1_000_000_000, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 4242, "args": {"name": "python"}},
        _x("pictl:compute 5", 100.0, 50.0), {"ph": "s", "id": 7, "ts": 120.0, "pid": 4242, "tid": 1}]}
    b = {"baseTimeNanoseconds": 1_000_000_000 + 2_000_000, "traceEvents": [_x("pictl:compute 5", 160.0, 40.0)]}
    merged = merge({0: ("pi0", a), 1: ("pi1", b)}, {"pi0": 0, "pi1": 2_000_000})
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "pi0/rank 0", 1: "pi1/rank 1"}  # the OS pid's name is gone, one process per rank
    computes = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e.get("name") == "pictl:compute 5"}
    assert computes == {0: 0.0, 1: 60.0}  # 160 us on b's clock is 60 us after a's 100 us on ours
    assert next(e for e in merged["traceEvents"] if e.get("ph") == "s")["id"] == "0:7"
    json.dumps(merged)


def test_breakdown_splits_forward_ranges_into_compute_wait_and_send() -> None:
    data = {"traceEvents": [
        _x("Forward 0", 0.0, 100.0), _x("gloo:recv", 0.0, 30.0), _x("pictl:compute 0", 30.0, 60.0),
        _x("c10d::send", 90.0, 10.0), _x("Forward 1", 150.0, 50.0), _x("pictl:compute 1", 150.0, 50.0),
        _x("PyTorch Profiler (0)", -1000.0, 5000.0)]}
    b = rank_breakdown(data)
    assert b["window_ms"] == 0.2 and b["microbatches"] == 2
    assert (b["compute_pct"], b["recv_wait_pct"], b["send_pct"], b["idle_pct"]) == (55.0, 15.0, 5.0, 25.0)


def test_the_breakdown_reads_the_ranks_own_thread_and_leaves_the_profilers_drain_out() -> None:
    """Rank 0 computes two microbatches and posts each send (c10d::send, 1 us); gloo's send of each lasts until rank 1
    has it (gloo:send, 400 us: the wire, while rank 0 computes on), and after the window the profiler's stop waits
    for the last one (300 us). Counted as sending, that read 32 % of the window against the counters' 2 %."""
    data = {"traceEvents": [
        _x("Forward 0", 0.0, 101.0), _x("pictl:compute 0", 0.0, 100.0), _x("c10d::send", 100.0, 1.0),
        _x("gloo:send", 100.0, 400.0), _x("gloo:send", 100.0, 400.0, tid=7),
        _x("Forward 1", 101.0, 101.0), _x("pictl:compute 1", 101.0, 100.0), _x("c10d::send", 201.0, 1.0),
        _x("gloo:send", 201.0, 400.0), _x("aten::empty", 202.0, 300.0, tid=7)]}
    b = rank_breakdown(data)
    assert b["microbatches"] == 2 and b["window_ms"] == 0.202 and b["drain_ms"] == 0.399
    assert (b["compute_pct"], b["send_pct"], b["recv_wait_pct"], b["idle_pct"]) == (99.0, 1.0, 0.0, 0.0)
    assert (b["compute_ms"], b["send_ms"], b["recv_wait_ms"]) == (0.1, 0.001, 0.0)


REAL_TRACES = ROOT / "tests" / "support" / "data" / "traces_two_ranks"
"""A real `--trace-steps 8` run's two traces (2 stages of DeiT-S on the local cluster, 24 images, 2026-11-26; the
`aten::` events, which lie inside the compute ranges, left out to keep them small) and its stage table."""


def test_a_real_trace_agrees_with_its_runs_counters() -> None:
    """Rank 0's gloo sends each lasted until rank 1 had the data (up to 2 s, while rank 0 computed on), and the
    profiler's stop waited 155 ms for the last ones inside the next step's Forward range: read as sending and
    waiting, they made rank 0 8 % sending and 6 % waiting for input, against its counters' 3 % and 0. Read from
    the rank's own thread, within the traced microbatches, each rank agrees with its counters."""
    run = json.loads((REAL_TRACES / "run.json").read_text())
    for stage in run["per_stage"]:
        rank = stage["rank"]
        data = load_trace(REAL_TRACES / f"{stage['host']}-rank{rank}.json.gz")
        sends = [e["dur"] for e in data["traceEvents"] if e.get("name") == "gloo:send"]
        assert rank != 0 or max(sends) > 1e6  # a send open for over a second: the wire, not this rank's time
        share = rank_breakdown(data)
        assert share["microbatches"] == 8
        found = against_counters(share, stage["measured_ms"], stage["wait_ms"], stage["send_ms"])
        assert found["agrees"] is True and found["differs_points"] <= AGREE_POINTS, (rank, share, found)
        assert share["compute_ms"] == pytest.approx(stage["measured_ms"], rel=0.05)  # the same compute, traced
        if rank == 0:
            assert share["drain_ms"] > 100 and share["recv_wait_pct"] < 1 and share["send_pct"] < 5, share


def test_a_trace_agrees_with_the_counters_within_the_stated_points_or_says_why() -> None:
    share = {"compute_ms": 146.0, "recv_wait_ms": 0.0, "send_ms": 0.5, "microbatches": 8}
    agreed = against_counters(share, 149.0, 0.0, 2.7)
    assert agreed["agrees"] is True and agreed["counters_ms"] == [149.0, 0.0, 2.7] and "why" not in agreed
    assert agreed["differs_points"] == pytest.approx(100 * 2.7 / 151.7 - 100 * 0.5 / 146.5, abs=0.1)
    slowed = against_counters({**share, "compute_ms": 190.0}, 149.0, 0.0, 40.0)
    assert slowed["agrees"] is False and slowed["differs_points"] > AGREE_POINTS
    assert slowed["why"].startswith("the profiler slowed the traced compute to 190.0 ms per microbatch")
    waited = against_counters({**share, "recv_wait_ms": 60.0}, 149.0, 2.0, 2.7)
    assert waited["agrees"] is False and waited["why"].startswith("a different window: the trace holds 8 ")
    assert "waiting for input: 29 % traced, 1 % counted" in waited["why"]
    assert against_counters({"compute_pct": 50.0}, 149.0, 0.0, 2.7) == {}  # an older trace: nothing to compare
    assert against_counters(share, None, 0.0, 2.7) == {}


@pytest.mark.slow
async def test_traces_from_a_live_two_rank_run(tmp_path: Path) -> None:
    """A planned window (--trace-steps) and one requested mid-run, as the dashboard's `t` does."""
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    options = RunOptions(stages=2, images=12, chunk=1, warmup=1, repeats=3, trace_steps=4, policy="equal")
    grabs: list[asyncio.Task] = []
    session: RunSession

    def on_event(event: object) -> None:
        # Ask as soon as the pipeline reports progress: the run is live and has passes to go.
        if isinstance(event, RankEvent) and event.record.EVENT == P.PROGRESS and not grabs \
                and event.source != "serial":
            grabs.append(asyncio.get_running_loop().create_task(session.grab_traces(3, timeout_s=60)))

    session = RunSession(cluster, options, on_event=on_event, runs_root=tmp_path / "runs",
                         baseline_cache=BaselineCache(tmp_path / "cache" / "baselines"))
    summary = await session.run()
    assert summary.status == "ok" and summary.outputs_match is True
    live = await grabs[0]
    assert not live.missing and sorted(live.files) == [0, 1]
    # A timed pass the live window touched is kept out of the throughput figures (the planned window runs in
    # an extra pass after the timed ones); which passes it touches depends on when the request lands.
    counted = [e for e in _throughputs(summary) if not e.get("traced")]
    assert len(counted) == 3 - (summary.traced_passes or 0)
    assert summary.throughput_spread_ips == [min(e["ips"] for e in counted), max(e["ips"] for e in counted)]
    assert (summary.throughput_ips or 0) > 0
    planned = next(g for g in summary.traces if g.id == "run")
    run_dir = Path(summary.run_dir or "")
    for grab_dir, steps in ((Path(planned.directory or ""), 4), (live.directory, 3)):
        files = sorted(p.name for p in grab_dir.glob("*.json.gz"))
        assert files == ["h0-rank0.json.gz", "h1-rank1.json.gz"]
        assert grab_dir.parent == run_dir
        raw = json.loads(gzip.open(grab_dir / "h0-rank0.json.gz").read())
        assert raw["distributedInfo"]["rank"] == 0 and raw["baseTimeNanoseconds"] > 0
        timeline = json.loads((grab_dir / "timeline.json").read_text())
        events = timeline["traceEvents"]
        procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert procs == {0: "h0/rank 0", 1: "h1/rank 1"}
        assert {e["pid"] for e in events} == {0, 1}
        # The same steps on both ranks, and on the common axis every microbatch leaves rank 0
        # (compute, then send) before rank 1 finishes receiving it and computes it.
        compute = {(e["pid"], int(e["name"].split()[1])): e for e in events
                   if e.get("ph") == "X" and e["name"].startswith(P.TRACE_COMPUTE_RANGE)}
        steps_seen = sorted({s for _, s in compute})
        assert len(steps_seen) == steps and all((r, s) in compute for r in (0, 1) for s in steps_seen)
        sends = sorted(e["ts"] for e in events if e["pid"] == 0 and e.get("name") == "c10d::send")
        recvs = sorted(e["ts"] + e["dur"] for e in events if e["pid"] == 1 and e.get("name") == "c10d::recv_")
        assert len(sends) >= steps and len(recvs) >= steps
        for s in steps_seen:
            c0, c1 = compute[(0, s)], compute[(1, s)]
            assert c0["ts"] + c0["dur"] <= c1["ts"], f"step {s}: rank 1 computed before rank 0 finished"
            sent = min(t for t in sends if t >= c0["ts"] + c0["dur"])
            assert sent <= c1["ts"]
        per_rank = json.loads((grab_dir / "summary.json").read_text())["per_rank"]
        for share in per_rank.values():
            assert share["microbatches"] == steps and share["compute_pct"] > 20
            assert sum(share[k] for k in ("compute_pct", "send_pct", "recv_wait_pct", "idle_pct")) \
                == pytest.approx(100, abs=0.5)
    # Beside the run's own counters, each rank's traced microbatch agrees with its row of the stage table
    # within AGREE_POINTS, or says why (the profiler slowed it, or a window of a few microbatches of one pass).
    for grab in summary.traces:
        for rank, share in grab.per_rank.items():
            stage = summary.per_stage[int(rank)]
            assert share.counters_ms == [stage.measured_ms, stage.wait_ms, stage.send_ms], (rank, share)
            assert share.agrees is not None and (share.agrees or share.why), (rank, share)
            assert share.agrees == ((share.differs_points or 0) <= AGREE_POINTS), (rank, share)
    assert live.directory.name == "traces-2" or Path(planned.directory or "").name == "traces-2"


async def test_a_trace_request_without_a_live_pipeline_is_refused(tmp_path: Path) -> None:
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    session = RunSession(cluster, RunOptions(stages=2), runs_root=tmp_path / "runs")
    with pytest.raises(E.ConfigError, match="no pipeline is running"):
        await session.grab_traces(4)
