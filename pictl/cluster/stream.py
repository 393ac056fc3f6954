"""One remote process's output, read to its end: the one consumer runs, prunes and sweeps share.

Every stdout line that is a telemetry record (`remote.protocol`) is kept in the record, handed to the
caller's `on_record` and forwarded as a `RankEvent`; every other line is kept in the log, added to a
short tail (what a failure shows) and forwarded as `HostOutput`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pictl.cluster.transport import RemoteProcess
from pictl.events import EventSink, HostOutput, RankEvent, parse_event

TAIL_LINES = 20


class LineKeeper(Protocol):
    """Where a process's lines are kept as they pass (a run record)."""

    def event(self, source: str, line: str) -> None: ...

    def log(self, source: str, line: str) -> None: ...


OnRecord = Callable[[dict[str, Any]], bool]
"""Sees a telemetry record first; returns whether it is forwarded to the sink."""


@dataclass
class ProcessStream:
    source: str
    """Whose lines these are in the record (`events/<source>.jsonl`) and in the sink's events."""
    host: str
    keep: LineKeeper
    sink: EventSink
    on_record: OnRecord = lambda _record: True
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    async def consume(self, proc: RemoteProcess) -> int:
        """Read `proc` to its end; its exit status."""
        async for channel, line in proc.lines():
            record = parse_event(line) if channel == "stdout" else None
            if record is not None:
                self.keep.event(self.source, line)
                if self.on_record(record):
                    self.sink(RankEvent(self.source, self.host, record))
            else:
                self.tail.append(f"{self.source}: {line}")
                self.keep.log(self.source, line)
                self.sink(HostOutput(self.source, self.host, channel, line))
        return await proc.wait()
