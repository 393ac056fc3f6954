"""Runs as data: every run directory under the runs root, found by id, filtered, compared and exported.

What `pictl runs`, `pictl report`, `pictl traces` and the dashboard's history share: one way to turn a
run reference (an id, a unique id prefix, or a directory) into its directory, one way to read a run's
record (its summary checked against `RunSummary`, whatever the file holds), one row per run with the
figures people sort and filter by, and one set of columns for side-by-side comparison and CSV.

A record is not trusted: it may be cut short, edited by hand, copied from elsewhere or made to harm.
One that does not keep the contract is left out of a listing and named (`Skipped`), never a reason to
fail the listing of its siblings; shown alone, it is refused with one line naming the file and the field.
Its strings reach a terminal only through `pictl.text` (no control characters, no Rich markup).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl.errors import ConfigError
from pictl.records import waterfall_view as wv
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE, path_exists, path_is_dir
from pictl.summary import (
    RecordInvalid,
    read_json_object,
    read_summary,
    terminal_text,
    validation_problem,
)
from pictl.summary_models import RunSummary, TraceRecord

__all__ = ["CELL_LIMIT", "COLUMNS", "COMPARE_COLUMNS", "NO_SUMMARY", "SORT_KEYS", "FoundRun", "PendingRun",
           "RunFilter", "Skipped", "as_written", "compare_rows", "json_text", "load_runs", "read_run", "resolve_run",
           "row", "table_rows", "terminal_text", "to_csv"]

COLUMNS = ("run_id", "started", "status", "model", "stages", "policy", "chunk", "images", "split", "throughput_ips",
           "serial_ips", "speedup", "efficiency", "latency_p50_ms", "latency_p95_ms", "dominant", "outputs_match",
           "wire", "agreement", "accuracy", "baseline", "flags", "run_dir")
"""What a row holds, in the order `runs`, `compare` and the CSV show it (latency: the pipeline's, per image;
dominant: the waterfall's largest loss)."""
_DOMINANT = COLUMNS.index("dominant")
COMPARE_COLUMNS = (*COLUMNS[:_DOMINANT], *wv.LATENCY_KEYS[2:], "dominant", *wv.TERM_KEYS, *COLUMNS[_DOMINANT + 1:])
"""`runs compare`'s lines: a row's, with the rest of the latency (p99, the serial run's) beside its p50 and
p95, and each waterfall term's points after the dominant term."""
SORT_KEYS = ("started", "speedup", "throughput_ips", "stages", "status")
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


# -- rows --------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A row's value: strings without control characters (the dashboard and the CSV show them as they are)."""
    return terminal_text(value) if isinstance(value, str) else value


def _started(value: Any) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    except (OverflowError, OSError, ValueError):
        return None


def row(found: FoundRun) -> dict[str, Any]:
    """One run's comparable figures (None where the run did not get that far), from `read_run`'s record."""
    if isinstance(found, PendingRun):
        return {**dict.fromkeys(COLUMNS), **found.record()}
    s = found
    figures, w = wv.compare_figures(s), wv.waterfall_of(s)
    values = {
        "run_id": s.run_id,
        "started": _started(s.started_at),
        "status": s.status,
        "model": s.model,
        "stages": s.stages,
        "policy": s.policy,
        "chunk": s.chunk,
        "images": s.images,
        "split": ",".join(s.split_points) or None,
        "throughput_ips": _rounded(s.throughput_ips),
        "serial_ips": _rounded(s.serial_ips),
        "speedup": _rounded(s.speedup, 3),
        "efficiency": _rounded(s.efficiency, 3),
        "latency_p50_ms": _rounded(figures["latency_p50_ms"], 1),
        "latency_p95_ms": _rounded(figures["latency_p95_ms"], 1),
        "dominant": w.dominant if w else None,
        "outputs_match": s.outputs_match,
        # A lossy wire's runs pass by top-1 agreement, never by identity: the row says which wire it was.
        "wire": f"{s.wire.format}{' (lossy wire)' if s.wire.lossy else ''}" if s.wire else None,
        "agreement": s.agreement,
        "accuracy": s.accuracy,
        "baseline": ("reused" if s.baseline.reused else "measured") if s.baseline else None,
        "flags": ",".join(dict.fromkeys(f.code for f in s.flags)) or None,
        "run_dir": s.run_dir,
    }
    return {k: _plain(v) for k, v in values.items()}


def _rounded(value: Any, digits: int = 2) -> Any:
    return round(value, digits) if isinstance(value, float) and math.isfinite(value) else value


@dataclass(frozen=True)
class RunFilter:
    """`pictl runs`' filters; None matches anything."""

    since: str | None = None
    """A date (2026-11-23) or date and time; runs started at or after it."""
    stages: int | None = None
    policy: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None:
            _since_epoch(self.since)  # refused here, before anything is listed

    def matches(self, r: dict[str, Any]) -> bool:
        return ((self.stages is None or r["stages"] == self.stages)
                and (self.policy is None or r["policy"] == self.policy)
                and (self.status is None or str(r["status"]).startswith(self.status))
                and (self.since is None or (r["started"] or "") >= _normal(self.since)))


def _normal(since: str) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_since_epoch(since)))


def _since_epoch(since: str) -> float:
    for pattern in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(since, pattern))
        except (ValueError, OverflowError):
            continue
    raise ConfigError(f"--since: {terminal_text(repr(since), 80)} is not a date (2026-11-23) or a date and time "
                      "(2026-11-23 18:05)")


def _sort_key(value: Any) -> Any:
    return (1, value) if isinstance(value, float) and math.isnan(value) else (0, value)


def table_rows(root: Path, where: RunFilter, sort: str = "started", reverse: bool = True,
               skipped: list[Skipped] | None = None) -> list[dict[str, Any]]:
    if sort not in SORT_KEYS:
        raise ConfigError(f"--sort: {terminal_text(repr(sort), 80)} is not one of {', '.join(SORT_KEYS)}")
    rows = [r for r in map(row, load_runs(root, skipped=skipped, traces=False)) if where.matches(r)]
    # None sorts last whichever way: a failed run has no speedup, and it is not the best one.
    present = sorted((r for r in rows if r[sort] is not None), key=lambda r: _sort_key(r[sort]), reverse=reverse)
    return present + [r for r in rows if r[sort] is None]


def compare_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The named runs' rows with `COMPARE_COLUMNS`' further figures, in the order given (`pictl runs compare A
    B`); RecordInvalid for a bad record."""
    rows = []
    for path in paths:
        found = read_run(path, traces=False)
        if isinstance(found, PendingRun):
            raise ConfigError(f"run '{terminal_text(path.name, 120)}': no summary yet (still running, or cut short)")
        extra = wv.compare_figures(found)
        rows.append({**row(found), **{k: extra[k] for k in wv.COMPARE_KEYS}})
    return rows


def to_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else _plain(r[k]) for k in COLUMNS})
    return out.getvalue()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def json_text(data: Any) -> str:
    """`data` as strict JSON on one line: control characters escaped (json does), NaN and infinities as null
    (a record may hold them; JSON has no such numbers, and strict parsers refuse them)."""
    return json.dumps(_finite(data), allow_nan=False)
