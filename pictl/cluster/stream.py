"""One remote process's output, read to its end: the one consumer runs, prunes and sweeps share.

Every stdout line that is a telemetry record (`remote.floor.protocol`) is kept in the record, handed to the
caller's `on_record` and forwarded as a `RankEvent`; every other line is kept in the log, added to a
short tail (what a failure shows) and forwarded as `HostOutput`. A line that claims to be telemetry but
breaks the protocol goes to the log and to `on_rejected`, never to a reader. What torch prints while the
processes shut down (`torch_noise`) goes to the log only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pictl.cluster.torch_noise import TorchNoise, Verdict
from pictl.cluster.transport import RemoteProcess
from pictl.events import EventSink, HostOutput, RankEvent, Rejected, read_line
from remote.floor.records import Record

TAIL_LINES = 20


class LineKeeper(Protocol):
    """Where a process's lines are kept as they pass (a run record)."""

    def event(self, source: str, line: str) -> None: ...

    def log(self, source: str, line: str) -> None: ...


OnRecord = Callable[[Record], bool]
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
    on_rejected: Callable[[Rejected], None] | None = None
    """Sees every line that claimed to be telemetry but broke the protocol (it is kept in the log)."""
    noise: TorchNoise = field(default_factory=TorchNoise)
    """Which lines are torch's teardown noise (to the log only), read in order: a dump spans many lines."""

    async def consume(self, proc: RemoteProcess) -> int:
        """Read `proc` to its end; its exit status."""
        async for channel, line in proc.lines():
            record = read_line(line) if channel == "stdout" else None
            if isinstance(record, Rejected):
                self.keep.log(self.source, line)
                if self.on_rejected is not None:
                    self.on_rejected(record)
                continue
            if record is not None:
                self.keep.event(self.source, line)
                if self.on_record(record):
                    self.sink(RankEvent(self.source, self.host, record))
            else:
                self.keep.log(self.source, line)
                verdict = self.noise.judge(line)
                if verdict is not Verdict.QUIET:
                    self.tail.append(f"{self.source}: {line}")
                if verdict is Verdict.SHOWN:
                    self.sink(HostOutput(self.source, self.host, channel, line))
        return await proc.wait()
