"""Snapshots of the main screen at a fixed size, during and after a run, with time held still.

The events are what a 3-stage run sends (same records, fixed times), fed through
the app's own message handlers; host samples are fixed; the clock is frozen.
Update after an intended change: pytest tests/unit/test_dashboard_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

from support.clusters import write_cluster

from pictl.cluster.monitor import HostSample
from pictl.events import RECORD_TYPES, Placed, RankEvent, StagePlacement
from pictl.inventory import load_cluster
from pictl.planning.options import RunOptions
from pictl.summary_models import RunSummary
from pictl.tui.app import PROGRESS_EVERY, PictlApp
from pictl.tui.messages import Decided, HostHealth, LogLine, PhaseChanged, RankRecord, RunFinished
from pictl.tui.rows import Ending
from pictl.tui.widgets.stage_list import StageList
from remote.floor.records import Record

NOW = 1_800_000_000.0
SIZE = (140, 44)
OPTIONS = RunOptions(stages=3, policy="balanced", chunk=1, images=24, warmup=1, repeats=2)
MODULES = [["patch_embed", "blocks.3"], ["blocks.4", "blocks.7"], ["blocks.8", "head"]]
GAP_POINTS = {"fill_drain": -0.2308, "imbalance": -0.05, "split_overhead": 0.03, "interference": -0.01,
              "communication": -0.03, "runtime": -0.005, "baseline": 0.09, "residual": -0.0082}
"""A 3-stage run's waterfall: 24 microbatches fill and drain (the dominant loss), adding up to 2.786 - 3."""


def _waterfall() -> dict:
    from pictl.run.advice import Bottleneck, advice

    shape = Bottleneck(stages=3, replicas=1, microbatches=24, rank=2, compute_s=0.3, mean_compute_s=0.28,
                       wait_for_cpu_s=0.0)
    return {"stages": 3, "speedup": 2.786, "gap": 0.214, "bottleneck_rank": 2, "microbatches": 24,
            "terms": [{"term": k, "points": v, "share": round(-v / 0.214, 4)} for k, v in GAP_POINTS.items()],
            "dominant": "fill_drain", "advice": advice("fill_drain", {"chunk": 1}, shape), "per_image_ms": {}}


def _rec(kind: str, rank: int, t: float, role: str = "pipeline", **fields) -> Record:  # noqa: ANN003
    """The record a rank sends, built from its class as the hosts build it."""
    return RECORD_TYPES[kind](t=t, role=role, rank=rank, **fields)


def _app(tmp_path: Path) -> PictlApp:
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 4))
    app = PictlApp(cluster, runs_root=tmp_path / "runs", monitor=False, clock=lambda: NOW)
    app.sub_title = "lab: 4 host(s) from hosts.toml"  # not the temporary path
    return app


async def _during(pilot) -> None:  # noqa: ANN001
    app: PictlApp = pilot.app
    app.state.start_run(OPTIONS, NOW - 30)
    await app.query_one(StageList).reset(app.state)
    for i in range(4):
        app.post_message(HostHealth(HostSample(f"h{i}", True, NOW, 97.0 - i, 610 + i, 3796, 55.5 + i,
                                               "0x0" if i else "0x50000", runnable=4 + i, cpu_wait=0.02 * i,
                                               busy_cores=round(4 * (97.0 - i) / 100, 2), cpus=4)))
    # Where the session put the stages (`balanced` on 4 hosts chose the first three here).
    app.post_message(Decided(Placed(tuple(StagePlacement(f"h{r}", (r,), 1) for r in range(3)), "h0", 1)))
    await pilot.pause()  # (a session announces it before anything runs on the ranks)
    app.post_message(PhaseChanged("baseline", "serial baseline reused: 3.45 img/s on h0"))
    app.post_message(PhaseChanged("pipeline", "launching 3 stage(s) on 3 host(s), rendezvous 10.0.0.1:29500"))
    app.post_message(RankRecord("serial", "h0", _rec("throughput", 0, NOW - 40, role="serial", ips=3.45, repeat=0)))
    for rank in range(3):
        host = f"h{rank}"
        app.post_message(RankRecord(host, host, _rec("stage_ready", rank, NOW - 20, modules=MODULES[rank],
                                                     params=7_000_000 + rank, load_s=1.2)))
        app.post_message(LogLine(f"rank{rank}", host, "stdout", f"ready: {MODULES[rank][0]} .. {MODULES[rank][1]}"))
    # `balanced` measured its first split, moved a cut, and kept the second
    app.post_message(RankRecord("h0", "h0", _rec("refine", 0, NOW - 16, round=1, split_points=["blocks.3", "blocks.8"],
                                                 predicted_ms=[301.0, 298.0, 305.0], measured_ms=[352.0, 250.0, 301.0],
                                                 factors=[1.17, 0.84, 0.99],
                                                 next_split=["blocks.4", "blocks.8"])))
    app.post_message(RankRecord("h0", "h0", _rec("refine", 0, NOW - 13, round=2, split_points=["blocks.4", "blocks.8"],
                                                 predicted_ms=[290.0, 293.0, 301.0], measured_ms=[296.0, 291.0, 303.0],
                                                 factors=[1.02, 0.99, 1.01],
                                                 next_split=None)))
    app.post_message(RankRecord("h0", "h0", _rec("refined", 0, NOW - 13, rounds=2,
                                                 split_points=["blocks.4", "blocks.8"],
                                                 predicted_ms=[296.0, 291.0, 303.0], factors=[1.02, 0.99, 1.01])))
    # One tick per rank a progress draw, through the bridge (where a newer tick replaces a waiting one), each one
    # drawn (the app takes the waiting ticks every PROGRESS_EVERY frames: once a second).
    for k in range(1, 9):
        for rank in range(3):
            app.bridge(RankEvent(f"h{rank}", f"h{rank}", _rec(
                "progress", rank, NOW - 10 + k, stage=rank, phase="timed", repeat=0, microbatches_total=24,
                microbatches=(2 + k % 3) * k, compute_s=0.3 * k, wait_s=0.05 * k * rank,
                send_s=0.02 * k * (2 - rank), bytes_sent=3 * k * 302_592 * (rank < 2))))
        for _ in range(PROGRESS_EVERY):
            app.render_dirty()
        await pilot.pause()
    app.state.pipeline_started_at = NOW - 12  # the phase message took the frozen clock
    app.render_all()
    await pilot.pause()


async def _after(pilot, traces: bool = True) -> None:  # noqa: ANN001
    await _during(pilot)
    app: PictlApp = pilot.app
    summary = {"status": "ok", "run_id": "20270115-080000-s3-abcd", "stages": 3,
               "split_points": ["blocks.4", "blocks.8"],
               "throughput_ips": 9.61, "serial_ips": 3.45, "serial_reused": True, "speedup": 2.786,
               "baseline": {"host": "h0", "reused": True, "age_s": 1260.0, "measured_at": 1.7e9},
               "flags": [{"code": "throughput_spread", "message": "pipeline throughput varied from 8.70 to 10.40 "
                                                                   "img/s across the timed passes (18% of its mean)"},
                         {"code": "fill_drain_bound", "message": "24 microbatches through 3 stages: efficiency "
                                                                 "capped at 0.92"}],
               "waterfall": _waterfall(), "latency": {
                   "pipeline": {"p50_ms": 812.4, "p95_ms": 880.1, "p99_ms": 901.7, "mean_ms": 820.0,
                                "microbatches": 48},
                   "serial": {"p50_ms": 289.9, "p95_ms": 301.2, "p99_ms": 305.0, "mean_ms": 290.3,
                              "microbatches": 48},
                   "clock_aligned": True, "traced": None},
               "outputs_match": True, "max_abs_diff": 0.0, "accuracy": None, "traces": [
                   {"id": "run", "directory": "/runs/20270115-080000-s3-abcd/traces", "files": {"0": "a", "1": "b"},
                    "missing": {"2": "no trace from h2 within 120 s"},
                    "per_rank": {"0": {"compute_pct": 71.0, "send_pct": 9.0, "recv_wait_pct": 0.0, "idle_pct": 20.0},
                                 "1": {"compute_pct": 88.0, "send_pct": 2.0, "recv_wait_pct": 8.0, "idle_pct": 2.0}}}]}
    if not traces:
        summary["traces"] = []
    app.post_message(RunFinished(RunSummary.model_validate(summary), Ending.of()))
    await pilot.pause()
    app.render_all()
    await pilot.pause()


def test_main_screen_during_a_run(snap_compare, tmp_path: Path) -> None:
    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=_during)


def test_main_screen_after_a_run(snap_compare, tmp_path: Path) -> None:
    assert snap_compare(_app(tmp_path), terminal_size=SIZE, run_before=_after)


def test_a_small_terminal_still_renders_the_essentials(snap_compare, tmp_path: Path) -> None:
    assert snap_compare(_app(tmp_path), terminal_size=(80, 24), run_before=_during)


async def test_80x24_keeps_the_result_and_quit_in_view(tmp_path: Path) -> None:
    """Beyond the picture: on 80x24 the words a result is read by are on screen."""
    import html
    import re

    app = _app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await _after(pilot)
        svg = app.export_screenshot()
        text = " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())
        for shown in ("speedup 2.79x", "why not 3", "outputs match", "progress", "100%", "q quit", "? help",
                      "stage 1 on h1"):
            assert shown in text, shown


async def test_a_finished_run_shows_why_not_n_and_its_latency(tmp_path: Path) -> None:
    """The waterfall's bar (the dominant term named), the latency, and (without traces below the flags to
    keep in view) the waterfall's whole line."""
    import html
    import re

    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _after(pilot, traces=False)
        svg = app.export_screenshot()
        text = " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())
        packed = text.replace(" ", "")  # the SVG splits a line where its colour changes
        for shown in ("why not 3", "-0.21points:fill/drain", "latency p50 812 p95 880 ms serial p50 290",
                      "gap 2.79x of 3: fill/drain -0.23"):  # losses negative, as in every view
            assert shown.replace(" ", "") in packed, shown


async def test_120x36_shows_the_flags_without_scrolling(tmp_path: Path) -> None:
    """What makes the figures suspect sits right under them: at 120x36 the flags were below the panel's fold."""
    import html
    import re

    app = _app(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await _after(pilot)
        svg = app.export_screenshot()
        text = " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())
        for shown in ("speedup 2.79x", "outputs match", "flags throughput_spread:", "fill_drain_bound:"):
            assert shown in text, shown


async def test_grabbed_traces_say_where_they_are_and_how_to_open_them(tmp_path: Path) -> None:
    """The dashboard's `t`: once the traces are written, the notice and the run panel name the merged timeline and
    Perfetto's UI (Open trace file); a path too long for the panel folds, never cut short."""
    from pictl.summary_models import TraceRecord
    from pictl.tui.messages import TracesGrabbed

    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _during(pilot)
        timeline = "/runs/20270115-080000-s3-abcd/traces/timeline.json"
        app.post_message(TracesGrabbed(TraceRecord(id="t1", directory="/runs/20270115-080000-s3-abcd/traces",
                                                   files={"0": "a", "1": "b", "2": "c"}, timeline=timeline)))
        await pilot.pause()
        app.render_all()
        await pilot.pause()
        hint = f'open {timeline} at https://ui.perfetto.dev ("Open trace file")'
        assert any(hint in n.message for n in app._notifications), [n.message for n in app._notifications]
        panel = app.query_one("#summary")
        lines = [line.text for line in panel.render_lines(panel.region.reset_offset)]
        shown = "".join("".join(lines[next(i for i, line in enumerate(lines) if "traces    open" in line):]).replace(
            "│", "").split())
        assert f"open{timeline}athttps://ui.perfetto.dev" in shown, lines
