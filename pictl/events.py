"""The events a run, a prune or a sweep reports, and how a remote process's lines become them.

Every reader (headless, the dashboard, sweeps, tests) takes these types: a session announces what it
decided (`Placed`: which host runs which stages with how many threads) and nobody recomputes it.
Telemetry records keep `remote.protocol`'s names: one definition, imported by both sides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from remote import protocol as P


@dataclass(frozen=True)
class Phase:
    """The session moved to a new step (`name`), and says what it does or found (`message`)."""

    name: str
    message: str
    serial_ips: float | None = None
    """The serial baseline's img/s, when this step found it (a reused baseline sends no passes of its own)."""


@dataclass(frozen=True)
class HostOutput:
    """A line of ordinary output (not telemetry) from a host's process."""

    source: str
    host: str
    stream: str
    line: str


@dataclass(frozen=True)
class RankEvent:
    """A telemetry record (`remote.protocol`) from a rank, the serial run or a job."""

    source: str
    host: str
    record: dict[str, Any]


@dataclass(frozen=True)
class StagePlacement:
    """One host's part of a run: its stages (ranks, consecutive) and the torch threads each gets."""

    host: str
    ranks: tuple[int, ...]
    threads: int


@dataclass(frozen=True)
class Placed:
    """Where the run's stages go, decided once (fastest hosts, slots, thread division)."""

    stages: tuple[StagePlacement, ...]
    serial_host: str
    serial_threads: int

    def host_of(self, rank: int) -> str:
        return next(s.host for s in self.stages if rank in s.ranks)


SessionEvent = Phase | HostOutput | RankEvent | Placed
EventSink = Callable[[SessionEvent], None]


def command_outcome(result: Any, kind: str) -> tuple[dict[str, Any] | None, str]:
    """From a finished one-shot remote command (a CommandResult): its `kind` event if it succeeded,
    else None and why it failed (its own error event, or the last line it wrote on stderr)."""
    events = [e for e in map(parse_event, result.stdout.splitlines()) if e]
    wanted = next((e for e in events if e[P.KEY_EVENT] == kind), None)
    if result.returncode == 0 and wanted is not None:
        return wanted, ""
    error = next((e["message"] for e in events if e[P.KEY_EVENT] == P.ERROR), None)
    return None, error or (result.stderr.strip().splitlines() or ["no output"])[-1]


def parse_event(line: str) -> dict[str, Any] | None:
    """A telemetry record, or None for ordinary log output."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get(P.KEY_EVENT) not in P.EVENTS:
        return None
    if record.get(P.KEY_SCHEMA) != P.SCHEMA_VERSION:
        return None
    return record
