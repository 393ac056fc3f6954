"""Runs as rows: one row per run with the figures people sort and filter by (`pictl runs`, the dashboard's
history), the further columns of a side-by-side comparison (`pictl runs compare`), and the CSV and strict
JSON they are exported as. Every string in a row is free of control characters (`pictl.text`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pictl.errors import ConfigError
from pictl.figure_text import cell_text, declared, figures
from pictl.records import waterfall_view as wv
from pictl.records.catalog import CELL_LIMIT, FoundRun, PendingRun, Skipped, load_runs, read_run
from pictl.records.run_verdicts import verdict_of
from pictl.summary import terminal_text
from pictl.summary_figures import Open
from pictl.summary_models import RunSummary
from pictl.verdict import shown_status


class RunRow(Open):
    """A run as a row: what `runs`, `compare` and the CSV show, in their order (read back by field: `view`)."""

    run_id: str | None = None
    started: str | None = None
    status: str | None = None
    model: str | None = None
    stages: int | None = None
    policy: str | None = None
    chunk: int | None = None
    images: int | None = None
    split: str | None = None
    throughput_ips: float | None = None
    serial_ips: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    latency_p50_ms: float | None = None
    """The pipeline's, per image (as the p95)."""
    latency_p95_ms: float | None = None
    dominant: str | None = None
    """The waterfall's largest loss."""
    outputs_match: bool | None = None
    wire: str | None = None
    agreement: float | None = None
    accuracy: float | None = None
    baseline: str | None = None
    flags: str | None = None
    part_of: str | None = None
    """The sweep the run was measured in, its round, `ref` for the sweep's reference."""
    run_dir: str | None = None


COLUMNS = tuple(RunRow.model_fields)
"""What a row holds, in the order `runs`, `compare` and the CSV show it (`RunRow`)."""
_DOMINANT = COLUMNS.index("dominant")
COMPARE_COLUMNS = (*COLUMNS[:_DOMINANT], *wv.LATENCY_KEYS[2:], "dominant", *wv.TERM_KEYS, *COLUMNS[_DOMINANT + 1:],
                   *wv.ENERGY_KEYS)
"""`runs compare`'s lines: a row's, with the rest of the latency (p99, the serial run's) beside its p50 and
p95, each waterfall term's points after the dominant term, and the joules per image last."""
SORT_KEYS = ("started", "speedup", "throughput_ips", "stages", "status")

TABLE_FIGURES = {name: fig for name, fig in declared(RunSummary) if fig.unit != "%"}
"""The run's declared figures a row holds under their own names, written by their declarations (`2.01x`). The
shares of images (accuracy, agreement) a table shows as recorded (`0.8125`), as it always has."""


def cell(key: str, value: Any) -> str:
    """A row's value as every table of rows shows it (`pictl runs`, `runs compare`, the dashboard's history): a
    figure as its summary model declares it (a speedup `2.01x` in each), anything else as plain text (never Rich
    markup, no control characters, not megabytes long)."""
    shown = cell_text(key, value, TABLE_FIGURES.get(key))
    return shown if shown is not None else terminal_text(value, CELL_LIMIT)


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
    latency, w = wv.compare_figures(s), wv.waterfall_of(s)
    values = {
        # The run's declared figures as the summary holds them, each under its own name: every view rounds them
        # once, the same way (`cell`); rounded here as well, 2.0049 -> 2.005 -> "2.00" where the result line said
        # "2.01".
        **{name: value for name, _, value in figures(s)},
        "run_id": s.run_id,
        "started": _started(s.started_at),
        "status": shown_status(s),  # `suspect`: finished, but a flag makes the result untrue
        "model": s.model,
        "stages": s.stages,
        "policy": s.policy,
        "chunk": s.chunk,
        "images": s.images,
        "split": ",".join(s.split_points) or None,
        **{key: latency[key] for key in wv.LATENCY_KEYS[:2]},  # the pipeline's p50 and p95
        "dominant": w.dominant if w else None,
        "outputs_match": s.outputs_match,
        # A lossy wire's runs pass by top-1 agreement, never by identity: the row says which wire it was.
        "wire": f"{s.wire.format}{' (lossy wire)' if s.wire.lossy else ''}" if s.wire else None,
        "baseline": ("reused" if s.baseline.reused else "measured") if s.baseline else None,
        "flags": ",".join(dict.fromkeys(f.code for f in s.flags)) or None,
        "part_of": _part_of(s),
        "run_dir": s.run_dir,
    }
    return {k: _plain(values[k]) for k in COLUMNS}  # (in the columns' order, a figure among them)


def _part_of(s: RunSummary) -> str | None:
    """`sweep 20261126-213000 r2 ref`: the comparison a run was one of, its round, and whether it was the reference."""
    p = s.part_of
    if p is None:
        return None
    return " ".join([p.kind, p.name, *([f"r{p.round}"] if p.round is not None else []),
                     *(["ref"] if p.role == "reference" else [])])


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
        row = RunRow.view(r)
        return ((self.stages is None or row.stages == self.stages)
                and (self.policy is None or row.policy == self.policy)
                and (self.status is None or str(row.status).startswith(self.status))
                and (self.since is None or (row.started or "") >= _normal(self.since)))


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
    rows, first = [], None
    for path in paths:
        found = read_run(path, traces=False)
        if isinstance(found, PendingRun):
            raise ConfigError(f"run '{terminal_text(path.name, 120)}': no summary yet (still running, or cut short)")
        extra = wv.compare_figures(found)
        # Each run after the first, against the first: a verdict where they were measured in one sweep.
        versus = {"verdict": verdict_of(first, found) if first is not None else None}
        rows.append({**row(found), **{k: extra[k] for k in wv.COMPARE_KEYS}, **versus})
        first = first or found
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
