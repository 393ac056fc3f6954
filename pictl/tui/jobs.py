"""The dashboard's jobs beside a single run, each a `DashboardJob`: sweeps (many runs, one table), tunes
(candidates' runs, a ranked table, a preset), pruning and training (one job each, with its own panel), and the
forms that start them. PictlApp builds on this; the run itself stays in `app`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

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
from pictl.tui.job_runner import DashboardJob, Done, JobRunner
from pictl.tui.messages import JobStarted, SweepRows, TuneRows
from pictl.tui.sweep_state import SweepStep, SweepView
from pictl.tui.tune_state import TuneStep, TuneView
from pictl.tui.widgets.prune_form import PruneForm
from pictl.tui.widgets.sweep_form import SweepForm
from pictl.tui.widgets.train_form import TrainForm
from pictl.tui.widgets.tune_form import TuneForm


class JobsApp(JobRunner):
    """Describes sweeps, tunes, pruning and training as `DashboardJob`s, as PictlApp describes a run."""

    cluster: Cluster
    bridge: SessionBridge
    runs_root: Path
    baseline_cache: BaselineCache | None
    _dirty: set[str]
    """What the next frame redraws (PictlApp renders it)."""

    def on_sweep_rows(self, msg: SweepRows) -> None:
        if self.state.sweep is not None:
            self.state.sweep.rows, self.state.sweep.directory = msg.rows, msg.directory
        self._dirty.add("summary")

    sweep_rounds: RoundsPlan | None = None
    """How many rounds a sweep measures (None: `pictl sweep`'s defaults)."""

    def sweep_job(self, base: RunOptions, points: list, profile: str | None = None) -> DashboardJob:
        """A sweep: every point's run followed on the panel, the table so far above it."""
        from pictl.jobs.sweep import run_sweep

        out = self.runs_root.parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S")

        def on_session(session: RunSession, index: int, planned: int) -> None:  # (rounds: n grows as they are added)
            self.post_message(JobStarted("sweep", session, SweepStep(index, planned)))

        async def sweep() -> Done:
            rows = await run_sweep(self.cluster, base, points, out, on_event=self.bridge, on_session=on_session,
                                   cache=self.baseline_cache, runs_root=self.runs_root, rounds=self.sweep_rounds,
                                   on_rows=lambda rows: self.post_message(SweepRows(rows, str(out))))
            self.post_message(SweepRows(rows, str(out)))
            failed = [r for r in rows if r["status"] != "ok"]
            return Done(self.last_run_summary(),
                        f"{len(failed)} of {len(rows)} sweep run(s) failed" if failed else None)

        return DashboardJob("sweep", lambda: self.state.show_job(SweepView(str(out), len(points))), sweep,
                            self.last_run_summary)

    profiles_dir: Path | None = None
    """Where a tune's winner is saved as a preset (None: the user's presets directory, as `pictl tune` saves it)."""

    def tune_job(self, base: RunOptions, settings: TuneSettings, profile: str | None = None) -> DashboardJob:
        """A tune: each candidate's run followed on the panel, the ranked table above it; the winner saved as
        the `tuned` preset, which the run form then offers."""
        from pictl.jobs.tune import run_tune
        from pictl.jobs.tune_report import finish
        from pictl.planning.presets import preset_target, protocol_of, user_presets_dir

        out = self.runs_root.parent / "tunes" / time.strftime("%Y%m%d-%H%M%S")

        async def tune() -> Done:
            profiles = self.profiles_dir or user_presets_dir()
            preset_target("tuned", profiles)  # where the winner goes, asked before the first run (as pictl tune)
            protocol = protocol_of(profile)  # the saved preset measures as the user does, not as the tune
            rows = await run_tune(self.cluster, base, settings, out, on_event=self.bridge,
                                  cache=self.baseline_cache, runs_root=self.runs_root,
                                  on_rows=lambda rows: self.post_message(TuneRows(rows)),
                                  on_session=lambda session, m: self.post_message(
                                      JobStarted("tune", session, TuneStep(m.candidate.label))))
            best, preset = finish(out, rows, base, self.cluster.source, profiles, "tuned", protocol=protocol)
            self.post_message(TuneRows(rows, best, preset))
            return Done(self.last_run_summary(), None if best else "nothing saved: no candidate was kept, or none beat "
                                                                "the serial run (see its table)")

        return DashboardJob("tune", lambda: self.state.show_job(TuneView(str(out), base)), tune,
                            self.last_run_summary, errors=(E.PictlError, OSError))

    def on_tune_rows(self, msg: TuneRows) -> None:
        tune = self.state.tune
        if tune is None:
            return
        tune.rows, tune.winner, tune.preset = msg.rows, msg.winner or tune.winner, msg.preset or tune.preset
        if msg.preset is not None and msg.winner is not None:
            self.notify(f"{msg.winner.candidate.label}: {msg.winner.speedup_vs_fp32}x the fp32 serial run; saved as "
                        f"{msg.preset} (run it: r, profile tuned)", title="tune done", timeout=15)
        self.render_all()

    def prune_job(self, options: PruneOptions, on: str | None) -> DashboardJob:
        """A pruning job on host `on` (None: the controller), its own panel in place of the stages'."""
        from pictl.jobs.prune import PruneSession

        session = PruneSession(options, cluster=self.cluster, on_host=on, root=self.runs_root.parent / "prunes",
                               on_event=self.bridge)

        async def prune() -> Done:
            return Done(await session.run())

        return DashboardJob("prune", lambda: self.state.start_prune(options, on or "the controller", self.clock()),
                            prune, lambda: session.summary)

    def train_job(self, options: TrainOptions) -> DashboardJob:
        """A training job across the hosts, its own panel in place of the stages'."""
        from pictl.jobs.training.session import TrainSession

        session = TrainSession(self.cluster, options, on_event=self.bridge, root=self.runs_root.parent / "trains")

        async def train() -> Done:
            return Done(await session.run())

        return DashboardJob("train", lambda: self.state.start_train(options, self.clock()), train,
                            lambda: session.summary)

    def _form_then(self, form: Screen, job: Callable[..., DashboardJob]) -> None:
        """Open `form` when nothing runs; what it returns (a tuple) makes the job that starts."""
        if self.run_active:
            self.notify("a run is in progress: stop it first (s)", severity="warning")
            return

        def chosen(result: tuple | None) -> None:
            if result is not None:
                self.start_job(job(*result))

        self.push_screen(form, chosen)

    def action_prune(self) -> None:
        self._form_then(PruneForm(self.cluster), self.prune_job)

    def action_train(self) -> None:
        self._form_then(TrainForm(), self.train_job)

    def action_tune(self) -> None:
        self._form_then(TuneForm(), self.tune_job)

    def action_sweep(self) -> None:
        self._form_then(SweepForm(self.cluster), self.sweep_job)
