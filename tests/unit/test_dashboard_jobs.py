"""The dashboard's one job contract: one job beside the runs at a time, a second start refused, and one end
message shown by kind (how a pruning's and a training's end read), with no run started."""

from __future__ import annotations

from pathlib import Path

from support.cli import ROOT

from pictl import errors as E
from pictl.inventory import load_cluster
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.jobs.prune_options import PruneOptions
from pictl.jobs.training.options import TrainOptions
from pictl.planning.options import RunOptions
from pictl.tui.app import PictlApp
from pictl.tui.messages import JobFinished
from pictl.tui.rows import Ending
from pictl.tui.state import DashboardState
from pictl.tui.sweep_state import SweepStep, SweepView

PRUNE = PruneOptions(data_path="/data/cifar10")
"""A pruning job's options (its data is never read: no job runs here)."""


def test_one_job_beside_the_runs_a_sweeps_table_stays_over_its_runs_and_the_next_job_replaces_it() -> None:
    state = DashboardState(load_cluster(ROOT / "hosts.toml"))
    state.show_job(SweepView("sweeps/s", 3))
    assert state.sweep is not None and state.running and state.tune is state.prune is state.train is None
    state.start_run(RunOptions(stages=2), now=1.0)  # the sweep's first run takes the panel
    state.on_job_step(SweepStep(1, 4))
    assert state.sweep is not None and (state.sweep.index, state.sweep.total) == (1, 4)
    state.start_prune(PRUNE, "the controller", now=2.0)
    assert state.prune is not None and state.sweep is None and state.shape == (0, 1)
    state.start_run(RunOptions(stages=2), now=3.0)  # a run after it: no job beside it
    assert state.job is None and state.shape == (2, 1)


async def test_a_second_job_is_refused_while_one_runs_and_nothing_of_it_is_shown(tmp_path: Path) -> None:
    app = PictlApp(load_cluster(ROOT / "hosts.toml"), runs_root=tmp_path / "runs", monitor=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.state.running = True  # (as a job that holds the panel)
        app.start_job(app.train_job(TrainOptions()))
        await pilot.pause()
        assert app.state.train is None and not [w for w in app.workers if w.group == "run"]
        assert [n.message for n in app._notifications] == ["a run is already in progress"]


async def test_each_kinds_end_is_folded_and_said_by_its_kind(tmp_path: Path) -> None:
    app = PictlApp(load_cluster(ROOT / "hosts.toml"), runs_root=tmp_path / "runs", monitor=False)
    async with app.run_test(size=(120, 40)) as pilot:
        app.state.start_prune(PRUNE, "the controller", now=0.0)
        app.post_message(JobFinished("prune", None, Ending.of(E.Interrupted("stopped by the user"))))
        await pilot.pause()
        assert app.state.prune is not None and app.state.prune.summary is None and not app.state.running
        assert app.state.phase == "stopped"
        summary = PruneSummary.model_validate({"kind": "prune", "status": "ok", "job_id": "p", "top1": 0.5,
                                               "artifact": "pruned.pt"})
        app.state.start_prune(PRUNE, "the controller", now=1.0)
        app.post_message(JobFinished("prune", summary, Ending.of()))
        await pilot.pause()
        assert app.state.prune is not None and app.state.prune.summary == summary
        assert app.state.phase_message == "artifact pruned.pt"
        app.state.start_train(TrainOptions(), now=2.0)
        app.post_message(JobFinished("train", None, Ending.of(E.PictlError("host local1: no torch"))))
        await pilot.pause()
        assert app.state.train is not None and app.state.phase == "failed"
        trained = TrainSummary.model_validate({"kind": "train", "status": "ok", "job_id": "t", "mode": "single",
                                               "batch_size": 32, "chunks": 1, "microbatch": 32,
                                               "samples_per_s": 12.5})
        app.state.start_train(TrainOptions(), now=3.0)
        app.post_message(JobFinished("train", trained, Ending.of()))
        await pilot.pause()
        assert app.state.train is not None and app.state.train.summary == trained and app.state.phase == "done"
        said = [(n.title, n.message, n.severity) for n in app._notifications]
    assert said == [("pruning stopped", "stopped by the user", "warning"),
                    ("pruned model written", "top-1 50.00%; run it with --model pruned.pt", "information"),
                    ("training failed", "host local1: no torch", "error"),
                    ("training done", "12.5 samples/s", "information")]
