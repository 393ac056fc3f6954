"""The events a run, a prune or a sweep reports, and how a remote process's lines become them.

Every reader (headless, the dashboard, sweeps, tests) takes these types: a session announces what it
decided (`Placed`: which host runs which stages with how many threads) and nobody recomputes it.
Telemetry records are `remote.floor.records`' dataclasses (one per event, shared with the hosts): `read_line`
checks a line against its event's class, field by field, and returns an instance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pictl.text import shown
from remote.floor import job_records, run_records
from remote.floor import protocol as P
from remote.floor.records import Record, field_kinds

R = TypeVar("R", bound=Record)

RECORD_TYPES: dict[str, type[Record]] = {
    cls.EVENT: cls for module in (run_records, job_records) for cls in vars(module).values()
    if isinstance(cls, type) and issubclass(cls, Record) and cls is not Record}
"""Each event's class; every name in `remote.floor.protocol.EVENTS` has one."""
assert set(RECORD_TYPES) == set(P.EVENTS), set(P.EVENTS) ^ set(RECORD_TYPES)


@dataclass(frozen=True)
class Phase:
    """The session moved to a new step (`name`), and says what it does or found (`message`)."""

    name: str
    message: str


SERIAL_FP32 = "serial-fp32"
"""The source of a run's fp32 serial reference (`--numerics`): its figures are never the run's serial ones."""


@dataclass(frozen=True)
class HostOutput:
    """A line of ordinary output (not telemetry) from a host's process."""

    source: str
    host: str
    stream: str
    line: str


@dataclass(frozen=True)
class RankEvent:
    """A telemetry record (`remote.floor.protocol`) from a rank, the serial run or a job."""

    source: str
    host: str
    record: Record


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


@dataclass(frozen=True)
class SplitChosen:
    """Where the run cuts the model, decided once (`equal`'s even cut is the plan's; `balanced`'s from the cost
    model, with each stage's predicted ms per microbatch)."""

    points: tuple[str, ...]
    policy: str
    predicted_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class BaselineReady:
    """The serial run the speedup divides by, measured now or reused from the cache (`age_s` old)."""

    host: str
    ips: float
    reused: bool
    age_s: float = 0.0


@dataclass(frozen=True)
class HostDropped:
    """A host the run lost mid-run and goes on without (`pictl.run.continuation`): the next `Placed` is where the
    stages went instead."""

    host: str
    message: str


SessionEvent = Phase | HostOutput | RankEvent | Placed | SplitChosen | BaselineReady | HostDropped
EventSink = Callable[[SessionEvent], None]


def command_outcome(result: Any, kind: type[R]) -> tuple[R | None, str]:
    """From a finished one-shot remote command (a CommandResult): its record of type `kind` if it succeeded,
    else None and why it failed (its own error record, or the last line it wrote on stderr)."""
    records = [r for r in map(parse_event, result.stdout.splitlines()) if r]
    wanted = next((r for r in records if isinstance(r, kind)), None)
    if result.returncode == 0 and wanted is not None:
        return wanted, ""
    error = next((r.message for r in records if isinstance(r, run_records.Error)), None)
    return None, error or (result.stderr.strip().splitlines() or ["no output"])[-1]


@dataclass(frozen=True)
class Rejected:
    """A line that claims to be a telemetry record but breaks the protocol (a field of the wrong kind, JSON
    nested too deep): never handed to a reader; counted and named instead."""

    event: str
    reason: str


MAX_RECORD_CHARS = 1 << 20
"""A telemetry line is a few hundred bytes; anything near a megabyte is not one of ours."""


def read_line(line: str) -> Record | Rejected | None:
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
    cls = RECORD_TYPES[event]
    given: dict[str, Any] = {}
    for name, check, optional, kind in _CHECKS[event]:
        value = record.get(name)
        if value is None:
            if not optional:
                return Rejected(event, f"'{name}' is missing")
            continue
        if not check(value):
            return Rejected(event, f"'{name}' is not a {_KIND_NAMES[kind]}: {shown(json.dumps(value)[:60], 60)}")
        given[name] = value
    return cls(**given)


def parse_event(line: str) -> Record | None:
    """A checked telemetry record, or None (ordinary log output, or a record that breaks the protocol)."""
    record = read_line(line)
    return record if isinstance(record, Record) else None


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_KIND_NAMES = {"count": "count", "int": "whole number", "num": "finite number >= 0", "real": "number", "str": "string",
               "bool": "true/false", "list": "list", "dict": "table", "strs": "list of strings",
               "nums": "list of numbers", "counts": "list of counts"}


_KIND_CHECKS: dict[str, Callable[[Any], bool]] = {
    "count": _count,
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "num": _number,
    "real": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
    "strs": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "nums": lambda v: isinstance(v, list) and all(_number(x) for x in v),
    "counts": lambda v: isinstance(v, list) and all(_count(x) for x in v),
}
"""What each field kind of `remote.floor.records` accepts."""
_CHECKS: dict[str, tuple[tuple[str, Callable[[Any], bool], bool, str], ...]] = {
    event: tuple((f.name, _KIND_CHECKS[f.kind], f.optional, f.kind) for f in field_kinds(cls))
    for event, cls in RECORD_TYPES.items()}
"""Per event, each field its class declares with its check, made once: 800 progress lines a second are
checked here (4 hosts streaming), and the check is on the dashboard's budget."""
