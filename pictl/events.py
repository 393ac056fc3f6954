"""The events a run, a prune or a sweep reports, and how a remote process's lines become them.

Every reader (headless, the dashboard, sweeps, tests) takes these types: a session announces what it
decided (`Placed`: which host runs which stages with how many threads) and nobody recomputes it.
Telemetry records keep `remote.protocol`'s names: one definition, imported by both sides.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pictl.text import shown
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


@dataclass(frozen=True)
class Rejected:
    """A line that claims to be a telemetry record but breaks the protocol (a field of the wrong kind, JSON
    nested too deep): never handed to a reader; counted and named instead."""

    event: str
    reason: str


MAX_RECORD_CHARS = 1 << 20
"""A telemetry line is a few hundred bytes; anything near a megabyte is not one of ours."""


def read_line(line: str) -> dict[str, Any] | Rejected | None:
    """A host's stdout line as a checked telemetry record, a Rejected one, or None for ordinary log output."""
    if not line.startswith("{"):
        return None
    if len(line) > MAX_RECORD_CHARS:
        return Rejected("?", f"a line of {len(line)} characters")
    try:
        record = json.loads(line)
    except RecursionError:
        return Rejected("?", "JSON nested too deeply")
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get(P.KEY_EVENT) not in P.EVENTS:
        return None
    event = str(record[P.KEY_EVENT])
    if record.get(P.KEY_SCHEMA) != P.SCHEMA_VERSION:
        return Rejected(event, f"schema {shown(record.get(P.KEY_SCHEMA), 20)} (this pictl reads "
                               f"{P.SCHEMA_VERSION})")
    for fields in (P.COMMON_FIELDS, P.FIELDS[event]):
        for name, kind in fields.items():
            why = _wrong(record.get(name), kind)
            if why:
                return Rejected(event, f"'{name}' {why}")
    return record


def parse_event(line: str) -> dict[str, Any] | None:
    """A checked telemetry record, or None (ordinary log output, or a record that breaks the protocol)."""
    record = read_line(line)
    return record if isinstance(record, dict) else None


def _wrong(value: Any, kind: str) -> str | None:
    """Why `value` is not of `kind` (see `remote.protocol.FIELDS`), or None when it is."""
    if kind.endswith("?"):
        if value is None:
            return None
        kind = kind[:-1]
    elif value is None:
        return "is missing"
    ok = {
        "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "num": _number,
        "real": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "list": lambda v: isinstance(v, list),
        "dict": lambda v: isinstance(v, dict),
        "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "nums": lambda v: isinstance(v, list) and all(_number(x) for x in v),
    }[kind](value)
    return None if ok else f"is not a {_KIND_NAMES[kind]}: {shown(json.dumps(value)[:60], 60)}"


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_KIND_NAMES = {"count": "count", "int": "whole number", "num": "finite number >= 0", "real": "number", "str": "string",
               "bool": "true/false", "list": "list", "dict": "table", "strs": "list of strings",
               "nums": "list of numbers"}
