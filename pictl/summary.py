"""Writing and reading the run summary (`summary.json`, `--json`) against its models (`pictl.summary_models`).

A run's summary is checked against `RunSummary` when it is written (`checked`: the dict written stays the one
the run built, key for key) and when it is read back, so a summary that breaks the contract fails in the run
that made it, not later in a report. Fields a newer pictl adds pass through (`extra="allow"`); a change to what
is there raises `SUMMARY_SCHEMA`. Training and pruning jobs' summaries have theirs in `pictl.job_summaries`.

Read back (`read_summary`), a file is not trusted: whatever it holds (cut short, another shape, nested
thousands deep, a FIFO), the answer is a `RunSummary` or `RecordInvalid`, one line naming the file and
the field.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl.errors import ConfigError
from pictl.summary_models import SUMMARY_SCHEMA, RunSummary
from pictl.text import printable, shown
from pictl.validation import problem


def checked(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` as written, once it is known to keep the contract (pydantic's ValidationError if not)."""
    RunSummary.model_validate(summary)
    return summary


# -- reading a summary back ---------------------------------------------------------------------------

MAX_RECORD_BYTES = 32 * 2**20
"""A summary is tens of kilobytes; a file this big is not one, and is not read into memory to find out."""
MAX_DEPTH = 64
"""A summary nests about 5 levels; deeper is not a record (and 5000 levels overflow the reader's stack)."""
LARGEST_INT = 2**63
"""No count or byte total pictl records is this large; a larger one overflows a float in the readers."""


def terminal_text(text: object, limit: int | None = None) -> str:
    """`text` safe to print (`pictl.text`): control characters replaced, a lone surrogate written out, at most
    `limit` characters."""
    return printable(text) if limit is None else shown(text, limit)


class RecordInvalid(ConfigError):
    """A record file that is not what pictl wrote: cut short, another shape, or made to harm."""

    def __init__(self, path: Path, why: str) -> None:
        self.path, self.why = path, why
        super().__init__(f"{terminal_text(path)}: {why}")


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (a summary pictl wrote), or RecordInvalid naming the file and what is wrong.

    Whatever the file is: not a regular file (a FIFO would block the reader), too big, not UTF-8, cut
    short, nested thousands deep (json raises RecursionError, not ValueError), or holding a number no
    record holds."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise RecordInvalid(path, "not a regular file")
        if info.st_size > MAX_RECORD_BYTES:
            raise RecordInvalid(path, f"{info.st_size} bytes: too big to be a pictl record")
        with path.open("rb") as fh:
            raw = fh.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise RecordInvalid(path, "no such file") from None
    except OSError as exc:
        raise RecordInvalid(path, f"cannot read it ({terminal_text(exc.strerror or exc)})") from None
    except ValueError:  # a NUL in the name
        raise RecordInvalid(path, "not a file name") from None
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordInvalid(path, "too big to be a pictl record")
    try:
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise RecordInvalid(path, f"nested more than {MAX_DEPTH} levels deep: not a pictl record") from None
    except json.JSONDecodeError as exc:
        raise RecordInvalid(path, f"not a complete JSON record ({exc}); it may have been cut short") from None
    except ValueError as exc:  # not UTF-8; an integer of more than 4300 digits
        raise RecordInvalid(path, f"not a JSON record ({terminal_text(exc, 160)})") from None
    if not isinstance(data, dict):
        raise RecordInvalid(path, "not a JSON object")
    problem = _shape_problem(data)
    if problem:
        raise RecordInvalid(path, problem)
    return data


def _shape_problem(data: Any) -> str | None:
    """What makes `data` no record pictl wrote, whatever its fields: nesting or numbers out of reach."""
    todo: list[tuple[Any, int, tuple[str, ...]]] = [(data, 0, ())]
    while todo:
        value, depth, where = todo.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep (at '{_where(where)}'): not a pictl record"
        if isinstance(value, dict):
            todo.extend((v, depth + 1, (*where, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((v, depth + 1, (*where, str(i))) for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= LARGEST_INT:
            return f"'{_where(where)}' is wrong: a number too large for any figure pictl records"
    return None


def _where(loc: tuple[Any, ...]) -> str:
    return terminal_text(".".join(str(p) for p in loc), 120) or "the file"


def validation_problem(exc: ValidationError) -> str:
    """The first thing pydantic found wrong, as one line naming the field (and how many more there are)."""
    problems = exc.errors()
    first = problems[0]
    what = "is missing" if first["type"] == "missing" else f"is wrong: {terminal_text(problem(first), 200)}"
    more = f"; {len(problems) - 1} more problem(s)" if len(problems) > 1 else ""
    return f"'{_where(first['loc'])}' {what}{more}"


def parse_summary(path: Path, data: dict[str, Any]) -> RunSummary:
    """`data` (read from `path`) as a checked run summary, or RecordInvalid naming the file and the field."""
    try:
        summary = RunSummary.model_validate(data)
    except ValidationError as exc:
        raise RecordInvalid(path, f"not a run summary ({validation_problem(exc)})") from None
    if summary.schema_version > SUMMARY_SCHEMA:
        raise RecordInvalid(path, f"written by a newer pictl (schema {summary.schema_version}; this one reads "
                                  f"{SUMMARY_SCHEMA} and older)")
    return summary


def read_summary(path: Path) -> RunSummary:
    """A run's summary.json, checked against `RunSummary` (RecordInvalid naming the file and field if not)."""
    return parse_summary(path, read_json_object(path))


def age_text(seconds: float) -> str:
    """A duration as people say it: 40 s, 21 min, 3.5 h, 2.0 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def baseline_text(summary: RunSummary) -> str:
    """A run summary's serial baseline in a few words: ` (reused, 21 min old)`, ` (measured now)`."""
    if summary.serial_reused:
        return f" (reused, {age_text(summary.baseline.age_s if summary.baseline else 0.0)} old)"
    return " (measured now)" if summary.baseline else ""
