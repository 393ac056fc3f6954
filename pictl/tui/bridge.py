"""Turns a session's typed events into dashboard messages: the one place core meets Textual."""

from __future__ import annotations

from collections.abc import Callable

from textual.message import Message

from pictl.events import HostOutput, Phase, Placed, RankEvent, SessionEvent
from pictl.tui.messages import LogLine, PhaseChanged, ProgressReady, RankRecord, StagesPlaced
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
    if kind == P.PRUNE_ACCURACY:
        return f"top-1 {rec.get('phase')}{'' if rec.get('epoch') is None else ' ' + str(rec['epoch'])}: " \
               f"{rec.get('top1', 0):.2%}"
    if kind == P.PRUNE_DONE:
        return f"artifact written: {rec.get('artifact')}"
    if kind == P.TRACE:
        return f"trace {rec.get('id')}: {rec.get('file') or rec.get('message')}"
    return None


class SessionBridge:
    """An `on_event` for RunSession that posts each event as a message.

    Progress ticks (200/s per host is normal) are not posted one by one: the newest
    per rank waits in `latest`, and one ProgressReady message at a time tells the
    app to take them. A stale tick is replaced before it costs a message.
    """

    def __init__(self, post: Callable[[Message], object]) -> None:
        self.post = post
        self.latest: dict[tuple[str, int], RankRecord] = {}
        self._announced = False

    def take_progress(self) -> list[RankRecord]:
        ticks, self.latest, self._announced = list(self.latest.values()), {}, False
        return ticks

    def __call__(self, event: SessionEvent) -> None:
        if isinstance(event, Phase):
            self.post(PhaseChanged(event.name, event.message, event.serial_ips))
        elif isinstance(event, RankEvent):
            kind = event.record.get(P.KEY_EVENT)
            if kind == P.PROGRESS and event.source != "serial":
                self.latest[(event.source, event.record.get(P.KEY_RANK, 0))] = RankRecord(
                    event.source, event.host, event.record)
                if not self._announced:
                    self._announced = True
                    self.post(ProgressReady())
                return
            self.post(RankRecord(event.source, event.host, event.record))
            if (text := _as_log(event.record)) is not None:
                who = event.source if event.source in ("serial", "prune") else f"rank{event.record.get(P.KEY_RANK, 0)}"
                self.post(LogLine(who, event.host, "stderr" if kind == P.ERROR else "stdout", text))
        elif isinstance(event, Placed):
            self.post(StagesPlaced(event))
        elif isinstance(event, HostOutput):
            self.post(LogLine(event.source, event.host, event.stream, event.line))
