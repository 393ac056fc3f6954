"""The dashboard's state (no Textual): how a job's end is decided and shown, from the typed records it gets."""

from __future__ import annotations

from support.cli import ROOT

from pictl import errors as E
from pictl.events import BaselineReady, HostDropped, Placed, SplitChosen, StagePlacement
from pictl.inventory import load_cluster
from pictl.planning.options import RunOptions
from pictl.summary_models import RunSummary
from pictl.tui.rows import Ending
from pictl.tui.state import DashboardState


def _state() -> DashboardState:
    state = DashboardState(load_cluster(ROOT / "hosts.toml"))
    state.start_run(RunOptions(stages=2, policy="equal"), now=0.0)
    state.on_decided(Placed((StagePlacement("local0", (0,), 1), StagePlacement("local1", (1,), 1)), "local0", 2))
    return state


def test_stages_are_placed_where_the_session_says_never_guessed() -> None:
    """Before `Placed` every rank has a panel and no host; `balanced` may then choose the last hosts."""
    state = DashboardState(load_cluster(ROOT / "hosts.toml"))
    state.start_run(RunOptions(stages=2, policy="balanced"), now=0.0)
    assert sorted(state.stages) == [0, 1] and all(st.host == "" for st in state.stages.values())
    assert not any(r.ranks for r in state.hosts.values())
    state.on_phase("balance", "choosing the fastest hosts")
    state.on_decided(Placed((StagePlacement("local2", (0,), 2), StagePlacement("local3", (1,), 2)), "local2", 2))
    assert [(st.host, st.label) for _, st in sorted(state.stages.items())] == [("local2", "stage 0"),
                                                                                ("local3", "stage 1")]
    assert {r.name: r.ranks for r in state.hosts.values() if r.ranks} == {"local2": [0], "local3": [1]}


def test_an_ending_is_decided_by_the_exceptions_type_not_its_text() -> None:
    assert Ending.of(E.Interrupted("stopped by the user")).outcome == "stopped"
    assert Ending.of(E.RunFailed("interrupted by a host that rebooted")).outcome == "failed"  # the word alone: no
    assert Ending.of() == Ending("done") and Ending.of(failed="1 of 3 sweep run(s) failed").outcome == "failed"


def test_a_failed_run_marks_its_failing_host_and_stops_the_others() -> None:
    state = _state()
    busy = [r.name for r in state.hosts.values() if r.ranks]
    summary = RunSummary.model_validate({
        "status": "failed", "run_id": "r", "stages": 2,
        "error": {"type": "RunFailed", "message": "rank 1 died", "host": busy[1], "rank": 1, "last_lines": ["x"]}})
    exc = E.RunFailed.on(busy[1], 1, "the pipeline", "rank 1 died", ["x"])
    state.finish(summary, Ending.of(exc))
    assert state.phase == "failed" and "rank 1 died" in state.phase_message and not state.running
    assert state.failure is not None and (state.failure.host, state.failure.rank) == (busy[1], 1)
    assert {r.name: r.activity for r in state.hosts.values() if r.ranks} == {busy[0]: "stopped", busy[1]: "failed"}
    assert exc.where == {"host": busy[1], "rank": 1, "message": "rank 1 died", "last_lines": ["x"]}


def test_a_finished_run_shows_its_own_throughput() -> None:
    state = _state()
    state.pipeline_ips = [3.0, 5.0]
    assert state.live_ips == 4.0  # while it runs: the passes so far
    state.finish(RunSummary.model_validate({"status": "ok", "run_id": "r", "stages": 2, "throughput_ips": 4.5}),
                 Ending.of())
    assert state.phase == "done" and state.live_ips == 4.5 and state.progress()[0] == 1.0


def test_decisions_are_taken_as_announced() -> None:
    """The split and the baseline come as the session's own events: the panel shows them while the run goes on,
    never worked out again here."""
    state = _state()
    state.on_decided(SplitChosen(("blocks.6",), "equal"))
    state.on_decided(BaselineReady("h0", 3.45, reused=True, age_s=60.0))
    assert state.split_points == ["blocks.6"] and (state.serial_ips, state.serial_reused) == (3.45, True)
    state.start_run(RunOptions(stages=2), now=1.0)  # the next run starts with nothing decided
    assert state.split_points == [] and state.serial_ips is None


def test_a_lost_host_stays_marked_lost_and_the_next_segment_gets_its_own_panels() -> None:
    state = DashboardState(load_cluster(ROOT / "hosts.toml"))
    state.start_run(RunOptions(stages=3, policy="equal"))
    state.on_decided(Placed(tuple(StagePlacement(f"local{i}", (i,), 1) for i in range(3)), "local0", 2))
    state.on_decided(HostDropped("local1", "the rank died without reporting an error"))
    assert state.hosts["local1"].activity == "lost"
    # The run goes on with 2 stages on the hosts left: two panels, the lost host still marked, holding no rank.
    state.on_decided(Placed((StagePlacement("local0", (0,), 1), StagePlacement("local2", (1,), 1)), "local0", 2))
    assert sorted(state.stages) == [0, 1] and state.shape == (2, 1)
    assert [state.stages[r].host for r in (0, 1)] == ["local0", "local2"]
    assert (state.hosts["local1"].activity, state.hosts["local1"].ranks) == ("lost", [])
    state.start_run(RunOptions(stages=3, policy="equal"))  # the next run asks for every host again
    assert not state.lost and state.hosts["local1"].activity == "idle"
