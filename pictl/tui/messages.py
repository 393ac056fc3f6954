"""Messages the dashboard's services post to the app: session events and host samples, made Textual."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

from pictl.cluster.monitor import HostSample
from pictl.events import BaselineReady, HostDropped, Placed, SplitChosen
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.summary_models import RunSummary, TraceRecord
from pictl.tui.rows import Ending
from pictl.tui.state import JobKind, JobStep
from remote.floor.records import Record

if TYPE_CHECKING:
    from pathlib import Path

    from pictl.jobs.tune_verdicts import Measured
    from pictl.run.session import RunSession

Decision = Placed | SplitChosen | BaselineReady | HostDropped
JobSummary = RunSummary | PruneSummary | TrainSummary
"""What a job's end carries, by kind: a run's (a sweep's, a tune's last run's), a pruning's or a training's."""


class PhaseChanged(Message):
    """The run moved to a new step."""

    def __init__(self, name: str, text: str) -> None:
        super().__init__()
        self.name, self.text = name, text


class Decided(Message):
    """The session decided something once and announced it: where the stages went (`Placed`), where the
    model is cut (`SplitChosen`), the serial run the speedup divides by (`BaselineReady`)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__()
        self.decision = decision


class RankRecord(Message):
    """A telemetry record from a rank (or the serial run) that is not a progress tick."""

    def __init__(self, source: str, host: str, record: Record) -> None:
        super().__init__()
        self.source, self.host, self.record = source, host, record


class LogLine(Message):
    """A line of ordinary output from a host or rank."""

    def __init__(self, source: str, host: str, stream: str, line: str) -> None:
        super().__init__()
        self.source, self.host, self.stream, self.line = source, host, stream, line


class HostHealth(Message):
    """A host sample: the newest replaces a stale one for the same host."""

    def __init__(self, sample: HostSample) -> None:
        super().__init__()
        self.sample = sample

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, HostHealth) and message.sample.host == self.sample.host


class TracesGrabbed(Message):
    """Traces from a grab arrived (some ranks may be missing)."""

    def __init__(self, grab: TraceRecord) -> None:
        super().__init__()
        self.grab = grab


class SweepRows(Message):
    """The sweep's table so far (rewritten after every run)."""

    def __init__(self, rows: list[dict[str, Any]], directory: str) -> None:
        super().__init__()
        self.rows, self.directory = rows, directory


class TuneRows(Message):
    """Every candidate of the tune so far, after each measurement (and the winner once it ended)."""

    def __init__(self, rows: list[Measured], winner: Measured | None = None, preset: Path | None = None) -> None:
        super().__init__()
        self.rows, self.winner, self.preset = rows, winner, preset


class JobStarted(Message):
    """A job takes the panel: at its start (`session` None; a run's is already followed), or a sweep's or a
    tune's next run (`session`, and where the job is: `step`)."""

    def __init__(self, kind: JobKind, session: RunSession | None = None, step: JobStep | None = None) -> None:
        super().__init__()
        self.kind, self.session, self.step = kind, session, step


class JobFinished(Message):
    """A job ended: its kind, its summary (the run's for a run, a sweep or a tune: that of its last run; None
    when it failed before it had one) and how it ended."""

    def __init__(self, kind: JobKind, summary: JobSummary | None, ending: Ending) -> None:
        super().__init__()
        self.kind, self.summary, self.ending = kind, summary, ending


def RunFinished(summary: RunSummary | None, ending: Ending) -> JobFinished:
    """A single run's end (the name the snapshot and verdict tests post it by)."""
    return JobFinished("run", summary, ending)
