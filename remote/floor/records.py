"""The telemetry records: one frozen dataclass per event of `remote.floor.protocol.EVENTS`, shared by both sides.

A host builds one and hands it to `remote.floor.emit.Emitter`; the controller's parser (`pictl.events.read_line`)
checks a line against the same class and returns an instance, so a field is named and typed once, here.
Each field's kind is declared on its annotation (`Count`, `Num`, ...); an optional field is `X | None`.
Kinds: "count" (an int >= 0), "num" (a finite number >= 0), "real" (any number, NaN too: a diverging loss is
shown as it is), "int", "str", "bool", "list", "dict", "strs" (a list of str), "nums" (a list of num),
"counts" (a list of count). Fields a host sends that the class does not name are not kept.

Torch-free and stdlib-only on purpose: the controller imports this module.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any, ClassVar

from remote.floor import protocol as P

Count = Annotated[int, "count"]
Int = Annotated[int, "int"]
Num = Annotated[float, "num"]
Real = Annotated[float, "real"]
Str = Annotated[str, "str"]
Bool = Annotated[bool, "bool"]
List = Annotated[list[Any], "list"]
Table = Annotated[dict[str, Any], "dict"]
Strs = Annotated[list[str], "strs"]
Nums = Annotated[list[float], "nums"]
Counts = Annotated[list[int], "counts"]


@dataclass(frozen=True)
class FieldKind:
    """One field a record's class declares: its wire key, its kind, and whether it may be missing or null."""

    name: str
    kind: str
    optional: bool


@dataclass(frozen=True, kw_only=True)
class Record:
    """What every telemetry line carries. The emitter fills these four from the process it runs in."""

    EVENT: ClassVar[str] = ""
    t: Num = 0.0
    rank: Count = 0
    role: Str | None = None
    host: Str | None = None


@dataclass(frozen=True, kw_only=True)
class Counters:
    """A stage's counters over a pass (`progress`) or over the timed passes (`run_end`)."""

    microbatches: Count
    compute_s: Num
    wait_s: Num
    send_s: Num
    bytes_sent: Count
    raw_bytes: Count | None = None
    compress_s: Num | None = None
    decompress_s: Num | None = None
    peak_Bps: Num | None = None
    recv_post_s: Num | None = None
    recv_wait_s: Num | None = None
    first_wait_s: Num | None = None
    send_post_s: Num | None = None
    drain_s: Num | None = None
    run_delay_s: Num | None = None
    pass_s: Num | None = None


COUNTER_NAMES = tuple(f.name for f in fields(Counters))
"""A rank's totals over the timed passes (`run_end`): where its time went, and what it sent."""


_NAMES: dict[type, frozenset[str]] = {}
_KINDS: dict[type, tuple[FieldKind, ...]] = {}


def _names(cls: type[Record]) -> frozenset[str]:
    if cls not in _NAMES:
        _NAMES[cls] = frozenset(f.name for f in fields(cls))
    return _NAMES[cls]


def field_kinds(cls: type[Record]) -> tuple[FieldKind, ...]:
    """What `cls` declares on its fields' annotations, common ones first: what the parser checks."""
    if cls not in _KINDS:
        _KINDS[cls] = _field_kinds(cls)
    return _KINDS[cls]


def _field_kinds(cls: type[Record]) -> tuple[FieldKind, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in fields(cls):
        hint, optional = hints[f.name], False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            args = typing.get_args(hint)
            optional = type(None) in args
            hint = next(a for a in args if a is not type(None))
        out.append(FieldKind(f.name, typing.get_args(hint)[1], optional))
    common = {f.name for f in fields(Record)}
    return tuple(sorted(out, key=lambda k: k.name not in common))


def to_wire(record: Record) -> dict[str, Any]:
    """The JSON object a record travels as: schema, event, then its fields (a None one is left out)."""
    body = {f.name: getattr(record, f.name) for f in fields(record)}
    return {P.KEY_SCHEMA: P.SCHEMA_VERSION, P.KEY_EVENT: record.EVENT,
            **{k: v for k, v in body.items() if v is not None}}


def encode(record: Record) -> str:
    """A record as its telemetry line (without the newline)."""
    return json.dumps(to_wire(record), separators=(",", ":"))


def as_dict(record: Record) -> dict[str, Any]:
    """A record's fields as a plain dict with its event name (for summaries and JSON output)."""
    return {P.KEY_EVENT: record.EVENT, **asdict(record)}
