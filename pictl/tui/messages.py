"""Messages the dashboard's services post to the app: session events and host samples, made Textual."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.message import Message

from pictl.cluster.monitor import HostSample
from pictl.events import BaselineReady, Placed, SplitChosen
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.summary_models import RunSummary, TraceRecord
from pictl.tui.rows import Ending
from remote.floor.records import Record

if TYPE_CHECKING:
    from pathlib import Path

    from pictl.jobs.tune_verdicts import Measured
    from pictl.run.session import RunSession

Decision = Placed | SplitChosen | BaselineReady


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


class RunFinished(Message):
    """The run ended: its summary (None when it failed before starting) and how it ended."""

    def __init__(self, summary: RunSummary | None, ending: Ending) -> None:
        super().__init__()
        self.summary, self.ending = summary, ending


class TracesGrabbed(Message):
    """Traces from a grab arrived (some ranks may be missing)."""

    def __init__(self, grab: TraceRecord) -> None:
        super().__init__()
        self.grab = grab


class SweepRunStarted(Message):
    """A sweep moved on to its next combination (its session is about to run)."""

    def __init__(self, session: RunSession, index: int, total: int) -> None:
        super().__init__()
        self.session, self.index, self.total = session, index, total


class SweepRows(Message):
    """The sweep's table so far (rewritten after every run)."""

    def __init__(self, rows: list[dict[str, Any]], directory: str) -> None:
        super().__init__()
        self.rows, self.directory = rows, directory


class TuneRunStarted(Message):
    """A tune measures its next candidate (its session is about to run)."""

    def __init__(self, session: RunSession, trying: str) -> None:
        super().__init__()
        self.session, self.trying = session, trying


class TuneRows(Message):
    """Every candidate of the tune so far, after each measurement (and the winner once it ended)."""

    def __init__(self, rows: list[Measured], winner: Measured | None = None, preset: Path | None = None) -> None:
        super().__init__()
        self.rows, self.winner, self.preset = rows, winner, preset


class PruneFinished(Message):
    """A pruning job ended: its summary (None if it never started) and how it ended."""

    def __init__(self, summary: PruneSummary | None, ending: Ending) -> None:
        super().__init__()
        self.summary, self.ending = summary, ending


class TrainFinished(Message):
    """A training job ended: its summary (None if it never started) and how it ended."""

    def __init__(self, summary: TrainSummary | None, ending: Ending) -> None:
        super().__init__()
        self.summary, self.ending = summary, ending
