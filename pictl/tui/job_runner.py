"""The one contract every dashboard job keeps (a run, a sweep, a tune, a pruning, a training): a `DashboardJob`
says what the job is and does, `JobRunner.start_job` owns its worker, turns how it ended into an `Ending` and
posts `JobStarted`/`JobFinished`, and one handler each shows them, by kind, from the table `SHOWN`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from textual.app import App

from pictl import errors as E
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from pictl.tui.messages import JobFinished, JobStarted, JobSummary
from pictl.tui.rows import Ending
from pictl.tui.state import DashboardState, JobKind
from pictl.tui.widgets.run_panel import result_line
from pictl.tui.widgets.stage_list import StageList


@dataclass(frozen=True)
class Done:
    """What a job's work returns when it was not stopped and raised nothing: its summary, and the line that
    says what failed inside it (a sweep's failed runs; a tune that saved nothing), if anything did."""

    summary: JobSummary | None
    failed: str | None = None


@dataclass(frozen=True)
class DashboardJob:
    """A job as the dashboard runs it: the same four things for every kind."""

    kind: JobKind
    begin: Callable[[], None]
    """What the state does as it starts (at once, so that a second start is refused before its worker runs)."""
    work: Callable[[], Awaitable[Done]]
    """The job itself, run in the `run` worker group (stop cancels it); it raises what `errors` names."""
    partial: Callable[[], JobSummary | None]
    """The summary the job had when it raised (None: it had none)."""
    errors: tuple[type[Exception], ...] = (E.PictlError,)
    """What ends it as stopped or failed (`Ending.of`); anything else is a bug that the worker's notice shows."""


@dataclass(frozen=True)
class Shown:
    """How a kind of job's end is shown: folded into the state, then a notice."""

    noun: str
    """What a stopped or failed one is called in the notice's title ("run failed", "pruning stopped")."""
    fold: Callable[[DashboardState, JobSummary | None, Ending], None]
    done: Callable[[JobSummary | None], tuple[str, str] | None]
    """The notice (text, title) when it ended well, if its summary says something."""
    timeout: float | None = 10
    """How long that notice stays (None: Textual's default)."""
    ring: bool = False
    """Ring the terminal when a long one ends well."""


def _fold_run(state: DashboardState, summary: JobSummary | None, ending: Ending) -> None:
    state.finish(summary if isinstance(summary, RunSummary) else None, ending)


def _run_done(summary: JobSummary | None) -> tuple[str, str] | None:
    return (result_line(summary), "run finished") if isinstance(summary, RunSummary) else None


def _fold_prune(state: DashboardState, summary: JobSummary | None, ending: Ending) -> None:
    state.finish_prune(summary if isinstance(summary, PruneSummary) else None, ending)


def _prune_done(summary: JobSummary | None) -> tuple[str, str] | None:
    if not isinstance(summary, PruneSummary):
        return None
    top1 = "-" if summary.top1 is None else f"{summary.top1:.2%}"
    return f"top-1 {top1}; run it with --model {summary.artifact}", "pruned model written"


def _fold_train(state: DashboardState, summary: JobSummary | None, ending: Ending) -> None:
    state.finish_train(summary if isinstance(summary, TrainSummary) else None, ending)


def _train_done(summary: JobSummary | None) -> tuple[str, str] | None:
    if not isinstance(summary, TrainSummary):
        return None
    rate = f"{summary.samples_per_s} samples/s"
    return (f"{rate}; losses agree with single" if summary.agreement else rate), "training done"


_RUN = Shown("run", _fold_run, _run_done, timeout=None, ring=True)
SHOWN: dict[JobKind, Shown] = {
    "run": _RUN, "sweep": _RUN, "tune": _RUN,  # (a sweep's and a tune's end shows their last run's, as a run's)
    "prune": Shown("pruning", _fold_prune, _prune_done),
    "train": Shown("training", _fold_train, _train_done),
}


class JobRunner(App):
    """Starts any `DashboardJob` and shows its start and its end. PictlApp builds on this."""

    state: DashboardState
    session: RunSession | None
    clock: Callable[[], float]

    def render_all(self) -> None:
        raise NotImplementedError

    def fold_progress(self, now: float) -> None:
        raise NotImplementedError

    def bell_if_long(self) -> None:
        raise NotImplementedError

    @property
    def run_active(self) -> bool:
        return self.state.running

    def start_job(self, job: DashboardJob) -> None:
        """The one way a job starts: refused while one runs; else its state at once, then its work in the `run`
        worker, whose end (a summary, or the exception it raised, as an `Ending`) is posted as `JobFinished`."""
        if self.run_active:
            self.notify("a run is already in progress", severity="warning")
            return
        job.begin()
        self.post_message(JobStarted(job.kind))

        async def work() -> None:
            try:
                done = await job.work()
            except job.errors as exc:
                self.post_message(JobFinished(job.kind, job.partial(), Ending.of(exc)))
                return
            self.post_message(JobFinished(job.kind, done.summary, Ending.of(failed=done.failed)))

        self.run_worker(work(), name=job.kind, group="run", exclusive=True, exit_on_error=False)

    def last_run_summary(self) -> RunSummary | None:
        """The summary of the run on the panel (a sweep's or a tune's latest), if it has one: what a run's, a
        sweep's or a tune's end carries."""
        return self.session.summary if self.session else None

    def follow(self, session: RunSession) -> None:
        """A sweep's or a tune's next run takes the panels (the job's own table stays above them)."""
        self.session = session
        self.state.start_run(session.options, self.clock())
        self.state.run_dir = str(session.ctx.runs_root / session.run_id)

    async def on_job_started(self, msg: JobStarted) -> None:
        if msg.session is not None:
            self.follow(msg.session)
        if msg.step is not None:
            self.state.on_job_step(msg.step)
        await self.query_one(StageList).reset(self.state)
        self.render_all()

    def on_job_finished(self, msg: JobFinished) -> None:
        shown = SHOWN[msg.kind]
        self.fold_progress(self.clock())  # (a run's last progress comes before its end)
        shown.fold(self.state, msg.summary, msg.ending)
        self.render_all()
        if msg.ending.outcome != "done":
            stopped = msg.ending.outcome == "stopped"
            self.notify(msg.ending.error or "", title=f"{shown.noun} {'stopped' if stopped else 'failed'}",
                        severity="warning" if stopped else "error", timeout=10)
        elif (notice := shown.done(msg.summary)) is not None:
            text, title = notice
            self.notify(text, title=title, timeout=shown.timeout)
            if shown.ring:
                self.bell_if_long()
