"""Turns a session's typed events into dashboard messages: the one place core meets Textual."""

from __future__ import annotations

from collections.abc import Callable

from textual.message import Message

from pictl.events import (
    SERIAL_FP32,
    BaselineReady,
    HostDropped,
    HostOutput,
    Phase,
    Placed,
    RankEvent,
    SessionEvent,
    SplitChosen,
)
from pictl.tui.messages import Decided, LogLine, PhaseChanged, RankRecord
from remote.floor.job_records import PruneAccuracy, PruneDone
from remote.floor.records import Record
from remote.floor.run_records import Error, Progress, Recut, StageMoved, StageReady, Throughput, Trace


def _as_log(rec: Record) -> str | None:
    """The telemetry records worth a line in the log (progress ticks are not)."""
    match rec:
        case Error():
            return f"error: {rec.message}"
        case StageMoved():
            return None
        case Recut() if rec.moved:
            return f"re-cut after pass {rec.after_pass + 1}: {rec.reason}; now {', '.join(rec.next_split)}"
        case StageReady():
            mods = rec.modules or ["-"]
            return f"ready: {mods[0]} .. {mods[-1]}, {rec.params:,} parameters, loaded in {rec.load_s} s"
        case Throughput():
            return f"pass {rec.repeat + 1}: {rec.ips} img/s" + (" (traced)" if rec.traced else "")
        case PruneAccuracy():
            return f"top-1 {rec.phase}{'' if rec.epoch is None else ' ' + str(rec.epoch)}: {rec.top1:.2%}"
        case PruneDone():
            return f"artifact written: {rec.artifact}"
        case Trace():
            return f"trace {rec.id}: {rec.file or rec.message}"
    return None


class SessionBridge:
    """An `on_event` for RunSession that posts each event as a message.

    Progress ticks (200/s per host is normal) are not posted at all: the newest per
    rank waits in `latest`, and the app takes them when it draws (`take_progress`, a
    few times a second). A stale tick is replaced before it costs anything: no
    message, no fold, no render per tick.
    """

    def __init__(self, post: Callable[[Message], object]) -> None:
        self.post = post
        self.latest: dict[tuple[str, int], tuple[str, Progress]] = {}
        """The newest progress of each (source, rank), with its host: a message is made only when drawn."""

    def take_progress(self) -> list[RankRecord]:
        ticks, self.latest = self.latest, {}
        return [RankRecord(source, host, rec) for (source, _rank), (host, rec) in ticks.items()]

    def __call__(self, event: SessionEvent) -> None:
        if isinstance(event, Phase):
            self.post(PhaseChanged(event.name, event.message))
        elif isinstance(event, RankEvent):
            rec = event.record
            if isinstance(rec, Progress) and event.source not in ("serial", SERIAL_FP32):
                self.latest[(event.source, rec.rank)] = (event.host, rec)
                return
            self.post(RankRecord(event.source, event.host, event.record))
            if (text := _as_log(rec)) is not None:
                who = event.source if event.source in ("serial", SERIAL_FP32, "prune") else f"rank{rec.rank}"
                self.post(LogLine(who, event.host, "stderr" if isinstance(rec, Error) else "stdout", text))
        elif isinstance(event, Placed | SplitChosen | BaselineReady | HostDropped):
            self.post(Decided(event))
        elif isinstance(event, HostOutput):
            self.post(LogLine(event.source, event.host, event.stream, event.line))
