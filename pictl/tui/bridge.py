"""Turns a session's typed events into dashboard messages: the one place core meets Textual."""

from __future__ import annotations

from collections.abc import Callable

from textual.message import Message

from pictl.session import HostOutput, Phase, RankEvent, SessionEvent
from pictl.tui.messages import LogLine, PhaseChanged, RankRecord, StageProgress
from remote import protocol as P


def _as_log(rec: dict) -> str | None:
    """The telemetry records worth a line in the log (progress ticks are not)."""
    kind = rec.get(P.KEY_EVENT)
    if kind == P.ERROR:
        return f"error: {rec.get('message')}"
    if kind == P.STAGE_READY:
        mods = rec.get("modules") or ["-"]
        return f"ready: {mods[0]} .. {mods[-1]}, {rec.get('params', 0):,} parameters, loaded in {rec.get('load_s')} s"
    if kind == P.THROUGHPUT:
        return f"pass {rec.get('repeat', 0) + 1}: {rec.get('ips')} img/s" + (" (traced)" if rec.get("traced") else "")
    if kind == P.TRACE:
        return f"trace {rec.get('id')}: {rec.get('file') or rec.get('message')}"
    return None


def session_sink(post: Callable[[Message], object]) -> Callable[[SessionEvent], None]:
    """An `on_event` for RunSession that posts each event as a message."""

    def sink(event: SessionEvent) -> None:
        if isinstance(event, Phase):
            post(PhaseChanged(event.name, event.message))
        elif isinstance(event, RankEvent):
            kind = event.record.get(P.KEY_EVENT)
            cls = StageProgress if kind == P.PROGRESS and event.source != "serial" else RankRecord
            post(cls(event.source, event.host, event.record))
            if (text := _as_log(event.record)) is not None:
                who = "serial" if event.source == "serial" else f"rank{event.record.get(P.KEY_RANK, 0)}"
                post(LogLine(who, event.host, "stderr" if kind == P.ERROR else "stdout", text))
        elif isinstance(event, HostOutput):
            post(LogLine(event.source, event.host, event.stream, event.line))

    return sink
