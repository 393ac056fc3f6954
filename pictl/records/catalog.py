"""Runs as data: every run directory under the runs root, found by id, filtered, compared and exported.

What `pictl runs`, `pictl report`, `pictl traces` and the dashboard's history share: one way to turn a
run reference (an id, a unique id prefix, or a directory) into its directory, one way to read a run's
record (its summary checked against `RunSummary`, whatever the file holds), and which runs there are
(`load_runs`). The rows people sort, filter, compare and export are `catalog_rows`.

A record is not trusted: it may be cut short, edited by hand, copied from elsewhere or made to harm.
One that does not keep the contract is left out of a listing and named (`Skipped`), never a reason to
fail the listing of its siblings; shown alone, it is refused with one line naming the file and the field.
Its strings reach a terminal only through `pictl.text` (no control characters, no Rich markup).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl.errors import ConfigError
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE, path_exists, path_is_dir
from pictl.summary import (
    RecordInvalid,
    read_json_object,
    read_summary,
    terminal_text,
    validation_problem,
)
from pictl.summary_models import RunSummary, TraceRecord

__all__ = ["CELL_LIMIT", "NO_SUMMARY", "FoundRun", "PendingRun", "Skipped", "as_written", "load_runs", "read_run",
           "resolve_run", "terminal_text"]

NO_SUMMARY = "no summary (running or lost)"
"""The status of a run directory with a config but no summary yet (a live run, or one whose controller died)."""

CELL_LIMIT = 300
"""Characters of one record string shown on a terminal (a hostile value may be megabytes long)."""


@dataclass(frozen=True)
class Skipped:
    """A run directory (or a trace grab in one) a listing left out, and why: the CLI says so on stderr."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"skipped {terminal_text(self.path)}: {self.reason}"



def _is_run_dir(path: Path) -> bool:
    return path_exists(path / SUMMARY_FILE) or path_exists(path / CONFIG_FILE) or path_exists(path / "sweep.json")


@dataclass(frozen=True)
class PendingRun:
    """A run directory with a config but no summary yet: a live run, or one whose controller died."""

    run_id: str
    run_dir: str
    status: str = NO_SUMMARY

    def record(self) -> dict[str, Any]:
        return {"status": self.status, "run_id": self.run_id, "run_dir": self.run_dir}


FoundRun = RunSummary | PendingRun
"""A run directory as readers see it."""


def read_run(path: Path, skipped: list[Skipped] | None = None, *, traces: bool = True) -> FoundRun:
    """The run in directory `path` as readers show it: its checked summary, with `run_dir` the directory it was
    found in (a run directory copied elsewhere names its old place) and, with `traces`, the grabs `pictl
    traces` left beside it (a bad grab is left out and added to `skipped`). A run with a config but no summary
    yet is a `PendingRun`; a summary that does not keep the contract raises RecordInvalid."""
    where = str(path.absolute())
    if not path_exists(path / SUMMARY_FILE):
        return PendingRun(path.name, where)
    summary = read_summary(path / SUMMARY_FILE)
    summary.run_dir = where
    if traces:
        summary.traces = [*summary.traces, *_grabs(path, {g.directory for g in summary.traces}, skipped)]
    return summary


def as_written(found: FoundRun) -> dict[str, Any]:
    """A run as its record holds it (`pictl runs show --json`): the keys it wrote, none this pictl adds."""
    if isinstance(found, PendingRun):
        return found.record()
    return found.written()


def _grabs(path: Path, known: set[str | None], skipped: list[Skipped] | None) -> list[TraceRecord]:
    """Trace grabs another process made (`pictl traces`): on disk beside the run, not in its summary."""
    found = []
    try:
        files = sorted(path.glob("traces*/summary.json"))
    except OSError:
        return []
    for grab_file in files:
        try:
            grab = TraceRecord.model_validate(read_json_object(grab_file))
        except (RecordInvalid, ValidationError) as exc:
            why = exc.why if isinstance(exc, RecordInvalid) else validation_problem(exc)
            if skipped is not None:
                skipped.append(Skipped(grab_file, f"trace grab left out: {why}"))
            continue
        if grab.directory not in known:
            found.append(grab)
            known.add(grab.directory)
    return found


def _run_dirs(root: Path) -> list[Path]:
    """The directories under `root` that hold a run (a config or a summary), newest id first."""
    try:
        entries = list(os.scandir(root))
    except (OSError, ValueError):
        return []
    dirs = [Path(e.path) for e in entries if path_is_dir(Path(e.path))]
    return sorted((p for p in dirs if path_exists(p / CONFIG_FILE) or path_exists(p / SUMMARY_FILE)), reverse=True)


def load_runs(root: Path, limit: int | None = None, skipped: list[Skipped] | None = None, *,
              traces: bool = True) -> list[FoundRun]:
    """The runs under `root` (`read_run`), newest first; one whose record does not keep the contract is
    left out and added to `skipped`, so that its siblings are still listed."""
    runs: list[FoundRun] = []
    for path in _run_dirs(root)[:limit]:
        try:
            runs.append(read_run(path, skipped, traces=traces))
        except RecordInvalid as exc:
            if skipped is not None:
                name = exc.path.name if exc.path.parent == path else terminal_text(exc.path)
                skipped.append(Skipped(path, f"{name}: {exc.why}"))
    return runs


def resolve_run(root: Path, ref: str) -> Path:
    """The run directory `ref` names: a directory (with a config or summary), an id under `root`, or a prefix
    of exactly one id there (`20261123-1810`)."""
    if not ref.strip() or "\x00" in ref:
        raise ConfigError(f"run {terminal_text(repr(ref), 80)}: names no run (give an id, a unique id prefix "
                          f"or a directory; see `pictl runs`)")
    try:
        given = Path(ref).expanduser()
    except RuntimeError:  # ~user that does not exist
        given = Path(ref)
    if path_is_dir(given) and _is_run_dir(given):
        return given
    shown_ref = terminal_text(ref, 120)
    if "/" not in ref and ref not in (".", ".."):
        exact = root / ref
        if path_is_dir(exact) and _is_run_dir(exact):
            return exact
        try:
            names = sorted(e.name for e in os.scandir(root) if e.name.startswith(ref))
        except (OSError, ValueError):
            names = []
        matches = [root / n for n in names if path_is_dir(root / n) and _is_run_dir(root / n)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            listed = ", ".join(terminal_text(p.name, 60) for p in matches[:4])
            raise ConfigError(f"run '{shown_ref}': {len(matches)} runs start so in {terminal_text(root)} "
                              f"({listed}{', ...' if len(matches) > 4 else ''})")
    raise ConfigError(f"run '{shown_ref}': no such run (not a run directory, nor an id in {terminal_text(root)}; "
                      f"see `pictl runs`)")
