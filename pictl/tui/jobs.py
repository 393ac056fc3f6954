"""The dashboard's jobs beside a single run: sweeps (many runs, one table), pruning and training (one job
each, with its own panel), and the forms that start them. PictlApp builds on this; the run itself stays in `app`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from textual.app import App
from textual.screen import Screen

from pictl import errors as E
from pictl.inventory import Cluster
from pictl.jobs.prune_options import PruneOptions
from pictl.jobs.sweep_rounds import RoundsPlan
from pictl.jobs.training.options import TrainOptions
from pictl.jobs.tune import TuneSettings
from pictl.planning.options import RunOptions
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession
from pictl.tui.bridge import SessionBridge
from pictl.tui.messages import (
    PruneFinished,
    RunFinished,
    SweepRows,
    SweepRunStarted,
    TrainFinished,
    TuneRows,
    TuneRunStarted,
)
from pictl.tui.rows import Ending
from pictl.tui.state import DashboardState
from pictl.tui.sweep_state import SweepView
from pictl.tui.tune_state import TuneView
from pictl.tui.widgets.prune_form import PruneForm
from pictl.tui.widgets.stage_list import StageList
from pictl.tui.widgets.sweep_form import SweepForm
from pictl.tui.widgets.train_form import TrainForm
from pictl.tui.widgets.tune_form import TuneForm


class JobsApp(App):
    """Starts sweeps and pruning jobs in the `run` worker group, as PictlApp starts runs."""

    cluster: Cluster
    state: DashboardState
    bridge: SessionBridge
    runs_root: Path
    baseline_cache: BaselineCache | None
    session: RunSession | None
    clock: Callable[[], float]
    _dirty: set[str]
    """What the next frame redraws (PictlApp renders it)."""

    def render_all(self) -> None:
        raise NotImplementedError

    async def _reset_stages(self) -> None:
        await self.query_one(StageList).reset(self.state)

    @property
    def run_active(self) -> bool:
        return self.state.running

    async def on_sweep_run_started(self, msg: SweepRunStarted) -> None:
        self.follow(msg.session)
        if self.state.sweep is not None:
            self.state.sweep.index, self.state.sweep.total = msg.index, msg.total
        await self._reset_stages()
        self._dirty.update({"hosts", "summary"})

    def on_sweep_rows(self, msg: SweepRows) -> None:
        if self.state.sweep is not None:
            self.state.sweep.rows, self.state.sweep.directory = msg.rows, msg.directory
        self._dirty.add("summary")

    sweep_rounds: RoundsPlan | None = None
    """How many rounds a sweep measures (None: `pictl sweep`'s defaults)."""

    def start_sweep(self, base: RunOptions, points: list, profile: str | None = None) -> None:
        from pictl.jobs.sweep import run_sweep

        out = self.runs_root.parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S")
        self.state.sweep = SweepView(str(out), len(points))
        self.state.tune = None

        def on_session(session: RunSession, index: int, planned: int) -> None:  # (rounds: n grows as they are added)
            self.post_message(SweepRunStarted(session, index, planned))

        async def sweep() -> None:
            self.state.running = True  # until the first point's session takes over
            try:
                rows = await run_sweep(self.cluster, base, points, out, on_event=self.bridge, on_session=on_session,
                                       cache=self.baseline_cache, runs_root=self.runs_root, rounds=self.sweep_rounds,
                                       on_rows=lambda rows: self.post_message(SweepRows(rows, str(out))))
            except E.PictlError as exc:
                self.post_message(RunFinished(self.session.last_summary if self.session else None, Ending.of(exc)))
                return
            self.post_message(SweepRows(rows, str(out)))
            failed = [r for r in rows if r["status"] != "ok"]
            self.post_message(RunFinished(self.session.last_summary if self.session else None, Ending.of(
                failed=f"{len(failed)} of {len(rows)} sweep run(s) failed" if failed else None)))

        self.run_worker(sweep(), name="sweep", group="run", exclusive=True, exit_on_error=False)

    profiles_dir: Path | None = None
    """Where a tune's winner is saved as a preset (None: the user's presets directory, as `pictl tune` saves it)."""

    def start_tune(self, base: RunOptions, settings: TuneSettings, profile: str | None = None) -> None:
        """A tune: each candidate's run followed on the panel, the ranked table above it; the winner saved as
        the `tuned` preset, which the run form then offers."""
        from pictl.jobs.tune import run_tune
        from pictl.jobs.tune_report import finish
        from pictl.planning.presets import preset_target, protocol_of, user_presets_dir

        out = self.runs_root.parent / "tunes" / time.strftime("%Y%m%d-%H%M%S")
        self.state.sweep = None
        self.state.tune = TuneView(str(out), base)

        async def tune() -> None:
            self.state.running = True  # until the first candidate's session takes over
            profiles = self.profiles_dir or user_presets_dir()
            try:
                preset_target("tuned", profiles)  # where the winner goes, asked before the first run (as pictl tune)
                protocol = protocol_of(profile)  # the saved preset measures as the user does, not as the tune
                rows = await run_tune(self.cluster, base, settings, out, on_event=self.bridge,
                                      cache=self.baseline_cache, runs_root=self.runs_root,
                                      on_rows=lambda rows: self.post_message(TuneRows(rows)),
                                      on_session=lambda session, m: self.post_message(
                                          TuneRunStarted(session, m.candidate.label)))
                best, preset = finish(out, rows, base, self.cluster.source, profiles, "tuned", protocol=protocol)
            except (E.PictlError, OSError) as exc:
                self.post_message(RunFinished(self.session.last_summary if self.session else None, Ending.of(exc)))
                return
            self.post_message(TuneRows(rows, best, preset))
            self.post_message(RunFinished(self.session.last_summary if self.session else None, Ending.of(
                failed=None if best else "nothing saved: no candidate was kept, or none beat the serial run "
                                         "(see its table)")))

        self.run_worker(tune(), name="tune", group="run", exclusive=True, exit_on_error=False)

    def follow(self, session: RunSession) -> None:
        """A sweep's or a tune's next run takes the panels (the job's own table stays above them)."""
        self.session = session
        self.state.start_run(session.options, self.clock())
        self.state.run_dir = str(session.ctx.runs_root / session.run_id)

    async def on_tune_run_started(self, msg: TuneRunStarted) -> None:
        self.follow(msg.session)
        if self.state.tune is not None:
            self.state.tune.trying = msg.trying
        await self._reset_stages()
        self.render_all()

    def on_tune_rows(self, msg: TuneRows) -> None:
        tune = self.state.tune
        if tune is None:
            return
        tune.rows, tune.winner, tune.preset = msg.rows, msg.winner or tune.winner, msg.preset or tune.preset
        if msg.preset is not None and msg.winner is not None:
            self.notify(f"{msg.winner.candidate.label}: {msg.winner.speedup_vs_fp32}x the fp32 serial run; saved as "
                        f"{msg.preset} (run it: r, profile tuned)", title="tune done", timeout=15)
        self.render_all()

    def start_prune(self, options: PruneOptions, on: str | None) -> None:
        from pictl.jobs.prune import PruneSession

        self.state.start_prune(options, on or "the controller", self.clock())
        self.state.sweep = self.state.tune = None
        session = PruneSession(options, cluster=self.cluster, on_host=on, root=self.runs_root.parent / "prunes",
                               on_event=self.bridge)
        self.call_later(self._reset_stages)

        async def prune() -> None:
            try:
                summary = await session.run()
            except E.PictlError as exc:
                self.post_message(PruneFinished(session.summary, Ending.of(exc)))
                return
            self.post_message(PruneFinished(summary, Ending.of()))

        self.run_worker(prune(), name="prune", group="run", exclusive=True, exit_on_error=False)

    def start_train(self, options: TrainOptions) -> None:
        from pictl.jobs.training.session import TrainSession

        session = TrainSession(self.cluster, options, on_event=self.bridge, root=self.runs_root.parent / "trains")
        self.state.start_train(options, self.clock())
        self.state.sweep = self.state.tune = None
        self.call_later(self._reset_stages)

        async def train() -> None:
            try:
                summary = await session.run()
            except E.PictlError as exc:
                self.post_message(TrainFinished(session.summary, Ending.of(exc)))
                return
            self.post_message(TrainFinished(summary, Ending.of()))

        self.run_worker(train(), name="train", group="run", exclusive=True, exit_on_error=False)

    def on_train_finished(self, msg: TrainFinished) -> None:
        self.state.finish_train(msg.summary, msg.ending)
        self.render_all()
        if msg.ending.outcome != "done":
            stopped = msg.ending.outcome == "stopped"
            self.notify(msg.ending.error or "", title="training stopped" if stopped else "training failed",
                        severity="warning" if stopped else "error", timeout=10)
        elif msg.summary:
            self.notify(f"{msg.summary.samples_per_s} samples/s; losses agree with single" if
                        msg.summary.agreement else f"{msg.summary.samples_per_s} samples/s",
                        title="training done", timeout=10)

    def on_prune_finished(self, msg: PruneFinished) -> None:
        self.state.finish_prune(msg.summary, msg.ending)
        self.render_all()
        if msg.ending.outcome != "done":
            stopped = msg.ending.outcome == "stopped"
            self.notify(msg.ending.error or "", title="pruning stopped" if stopped else "pruning failed",
                        severity="warning" if stopped else "error", timeout=10)
        elif msg.summary:
            top1 = "-" if msg.summary.top1 is None else f"{msg.summary.top1:.2%}"
            self.notify(f"top-1 {top1}; run it with --model {msg.summary.artifact}",
                        title="pruned model written", timeout=10)

    def _form_then(self, form: Screen, start: Callable[..., None]) -> None:
        """Open `form` when nothing runs; what it returns (a tuple) starts the job."""
        if self.run_active:
            self.notify("a run is in progress: stop it first (s)", severity="warning")
            return

        def chosen(result: tuple | None) -> None:
            if result is not None:
                start(*result)

        self.push_screen(form, chosen)

    def action_prune(self) -> None:
        self._form_then(PruneForm(self.cluster), self.start_prune)

    def action_train(self) -> None:
        self._form_then(TrainForm(), self.start_train)

    def action_tune(self) -> None:
        self._form_then(TuneForm(), self.start_tune)

    def action_sweep(self) -> None:
        self._form_then(SweepForm(self.cluster), self.start_sweep)
