"""`pictl sweep`: one run per combination of stages, chunk sizes, policies and wire formats; one table, plots.

Every combination is checked against the inventory before anything runs (a value
that cannot run is bad input, nothing started), and the pipeline runs are planned
together in one process (`planning.plan_ahead`). Runs go one after another and
share the serial baseline cache, so each chunk size is measured serially once.
The table is rewritten after every run: an interrupted or failing sweep keeps
what it measured. Each row carries its run's latency per image and the dominant
term of its speedup waterfall; the plots are drawn by `sweep_plots`.
"""

from __future__ import annotations

import csv
import io
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.events import EventSink
from pictl.inventory import Cluster
from pictl.jobs.sweep_plots import plot
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages, sharing_hosts
from pictl.planning.presets import SweepSettings, resolve_options, sweep_axes, sweep_settings
from pictl.records import waterfall_view
from pictl.records.runs import write_bytes_atomic, write_json_atomic
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from pictl.text import ascii_count
from pictl.validation import got, problem_line

COLUMNS = ("stages", "chunk", "policy", "wire", "status", "throughput_ips", "serial_ips", "speedup", "efficiency",
           "latency_p50_ms", "bytes_per_image", "agreement", "bottleneck_rank", "latency_p95_ms", "dominant",
           "bottleneck", "split_points", "outputs_match", "run_id", "flags")
"""table.csv's and sweep.json's columns (latency: the pipeline's per image, in ms; dominant: the largest loss in
the run's speedup waterfall)."""
TABLE_COLUMNS = 12
"""The first columns go into table.md (all of them into table.csv and sweep.json): latency p50 took the
bottleneck rank's place there, so that the table is no wider than it was."""


@dataclass(frozen=True)
class SweepPoint:
    stages: int
    chunk: int
    policy: str
    wire: str = "fp32"
    slots: int | None = None
    """Where the stages do not fit the inventory's slots: the most a host runs (the preset's `[sweep] slots`)."""


def sweep_points(cluster: Cluster, base: RunOptions, axes: SweepSettings,
                 wires: list[str] | None = None) -> list[SweepPoint]:
    """The combinations in run order, each checked as a run (`options_for`) and against the inventory; one serial
    point per chunk (a policy or a wire means nothing there)."""
    points: list[SweepPoint] = []
    for s, c, p, w in itertools.product(axes.stages, axes.chunks, axes.policy, wires or [base.wire]):
        shared = axes.slots if s > cluster.slots else None
        point = SweepPoint(s, c, "serial", "fp32") if s == 1 else SweepPoint(s, c, p, w, shared)
        if point in points:
            continue
        try:
            options_for(base, point)
            place_stages(sharing_hosts(cluster, s, shared), s)
        except E.ConfigError as exc:
            raise E.ConfigError(f"{point_label(SweepPoint(s, c, p))}: {exc}") from None
        points.append(point)
    return points


def point_label(point: SweepPoint) -> str:
    return f"sweep value stages={point.stages} chunk={point.chunk} policy={point.policy} wire={point.wire}"


def parse_wires(name: str, text: str) -> list[str]:
    """`fp32,int8,lowrank:8` -> one format per sweep value (per-cut formats belong to `pictl run --split`)."""
    given = [w for w in text.replace(" ", "").split(",") if w]
    return wire_formats(name, given) if given else ["fp32"]


def wire_formats(name: str, values: Any) -> list[str]:
    """A sweep's wire formats, one per value, each as `remote.wire` names it; ConfigError names `name`."""
    from remote.wire import parse_format

    if not isinstance(values, list) or not values or not all(isinstance(w, str) for w in values):
        raise E.ConfigError(f"{name}: must be a list of one wire format or more, such as ['fp32', 'int8'] "
                            f"(got {got(values)})")
    try:
        return [str(parse_format(w)) for w in values]
    except ValueError as exc:
        raise E.ConfigError(f"{name}: {exc}") from None


def parse_ints(name: str, text: str, least: int = 1) -> list[int]:
    """`1,2,4` -> [1, 2, 4], each at least `least`; `name` is how the caller calls the field in the error."""
    found = [ascii_count(v) for v in text.replace(" ", "").split(",") if v]
    values = [v for v in found if v is not None]
    if len(values) != len(found):
        raise E.ConfigError(f"{name}: {text!r} is not a comma-separated list of whole numbers")
    if not values or min(values) < least:
        raise E.ConfigError(f"{name}: '{text}' needs {'positive ' if least == 1 else ''}integers"
                            + (f" of at least {least}" if least != 1 else ""))
    return values


def plan_sweep(cluster: Cluster, profile: str | None, overrides: dict[str, Any], *, stages: str | None,
               chunks: str | None, policies: str | None, names: tuple[str, str, str] = ("--stages", "--chunks",
                                                                                          "--policy"),
               wires: str | None = None) -> tuple[RunOptions, list[SweepPoint]]:
    """The base options and every combination, from the CLI's or the dashboard's text fields (empty: the
    profile's [sweep] table); a value that cannot run is refused here, before anything starts."""
    base = resolve_options(profile, overrides)
    preset = sweep_settings(profile)  # given values win over the preset's [sweep] table
    chosen: list[str] = [p for p in (policies or "").replace(" ", "").split(",") if p] or list(preset.policy)
    axes = sweep_axes(parse_ints(names[0], stages) if stages else preset.stages,
                      parse_ints(names[1], chunks) if chunks else preset.chunks, chosen,
                      name_of=dict(zip(("stages", "chunks", "policy"), names, strict=True)).__getitem__,
                      slots=preset.slots)
    return base, sweep_points(cluster, base, axes, parse_wires("--wire", wires) if wires else None)


def options_for(base: RunOptions, point: SweepPoint) -> RunOptions:
    values = {**base.model_dump(), "stages": point.stages, "chunk": point.chunk, "split": [], "wire": point.wire}
    values["policy"] = base.policy if point.policy == "serial" else point.policy
    try:
        return RunOptions.model_validate(values)
    except ValidationError as exc:  # (its first line, "1 validation error for RunOptions", names nothing)
        raise E.ConfigError(problem_line(exc, RunOptions)) from None


def row_of(point: SweepPoint, summary: RunSummary | None, error: str | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"stages": point.stages, "chunk": point.chunk, "policy": point.policy, "wire": point.wire}
    if summary is None:
        return {**row, "status": "failed", "error": error}
    s = summary
    busy = [(st.compute_s or 0) + (st.send_s or 0) for st in s.per_stage]
    slowest = max(range(len(busy)), key=busy.__getitem__) if busy else None
    latency, gap = waterfall_view.latency_of(s), waterfall_view.waterfall_of(s)
    pipeline = latency.pipeline if latency else None  # a serial point's latency is its own
    return {**row, "status": s.status, "throughput_ips": s.throughput_ips, "serial_ips": s.serial_ips,
            "speedup": s.speedup, "efficiency": s.efficiency, "bottleneck_rank": slowest,
            "bottleneck": (s.per_stage[slowest].modules or ["-"])[0] if slowest is not None else None,
            "split_points": s.split_points, "outputs_match": s.outputs_match,
            # What crossed the wire per image (all links, one timed pass), and a lossy wire's agreement.
            "bytes_per_image": round(sum(st.bytes_sent or 0 for st in s.per_stage) / (s.images * (s.repeats or 1)))
            if s.images else None,
            "agreement": s.agreement, "latency_p50_ms": pipeline.p50_ms if pipeline else None,
            "latency_p95_ms": pipeline.p95_ms if pipeline else None, "dominant": gap.dominant if gap else None,
            "run_id": s.run_id, "flags": [f.code for f in s.flags], **({"error": error} if error else {})}


def write_table(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    write_json_atomic(out / "sweep.json", {**meta, "rows": rows})
    write_tables(out, [{**r, "split_points": " ".join(r.get("split_points") or []),
                        "flags": " ".join(r.get("flags") or [])} for r in rows], COLUMNS, COLUMNS[:TABLE_COLUMNS])


def write_tables(out: Path, rows: list[dict[str, Any]], columns: tuple[str, ...], shown: tuple[str, ...]) -> None:
    """A sweep's rows as table.csv (every column) and table.md (the `shown` ones), each written whole."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_bytes_atomic(out / "table.csv", text.getvalue().encode())
    write_bytes_atomic(out / "table.md", markdown_table(rows, shown).encode())


def markdown_table(rows: list[dict[str, Any]], shown: tuple[str, ...] = COLUMNS[:TABLE_COLUMNS]) -> str:
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in shown) + " |")
    return "\n".join(lines) + "\n"


def _kept(write: Callable[[], object], failed: list[E.RecordWriteFailed] | None) -> None:
    """Write a sweep file; a full disk never loses the sweep's rows: the failure is kept for the end (exit 9)
    when the caller collects them, else raised at once."""
    try:
        write()
    except OSError as exc:
        error = E.RecordWriteFailed(f"the sweep's results were measured, but writing its files failed "
                                    f"({exc.strerror or exc})")
        if failed is None:
            raise error from None
        if not failed:
            failed.append(error)


async def run_sweep(cluster: Cluster, base: RunOptions, points: list[SweepPoint], out: Path, *,
                    on_event: EventSink | None = None, cache: BaselineCache | None = None,
                    on_session: Callable[[RunSession], object] | None = None,
                    on_rows: Callable[[list[dict[str, Any]]], object] | None = None, wait: bool = False,
                    write_failed: list[E.RecordWriteFailed] | None = None) -> list[dict[str, Any]]:
    """Run every point in turn. `on_session(session)` is called before each run and `on_rows(rows)` after
    each (the dashboard follows the sweep through them). Each run leases its hosts: with `wait`, a run
    whose hosts another run holds waits for them; without, the sweep stops there (HostBusy). A sweep file
    that cannot be written goes into `write_failed` and the sweep goes on (the caller prints the rows)."""
    from pictl.events import Phase
    from pictl.planning.specs import plan_ahead
    from pictl.records.tracker_writers import check_trackers, track_record
    from pictl.records.trackers import sweep_series
    from pictl.run.session import RunSession

    # One planning process for the pipeline runs (not a torch import each), and one that cannot work
    # is refused before the first run starts. A serial point plans inside its own baseline run.
    kinds = list(base.track or cluster.track)
    check_trackers(kinds)  # before anything starts
    widest = max(points, key=lambda p: p.stages, default=None)  # (only the first host plans: it is any point's)
    planned = await plan_ahead(sharing_hosts(cluster, widest.stages, widest.slots) if widest else cluster,
                               [(point_label(p), options_for(base, p)) for p in points if p.stages > 1],
                               cache_root=cache.root.parent if cache else None)
    if planned and on_event:
        on_event(Phase("plan", f"{planned} sweep run(s) planned in one process"))
    out.mkdir(parents=True)
    meta = {"started_at": time.time(), "cluster": cluster.source, "options": base.model_dump(),
            "points": [p.__dict__ for p in points]}
    rows: list[dict[str, Any]] = []
    for point in points:
        hosts = sharing_hosts(cluster, point.stages, point.slots)
        if hosts is not cluster and on_event:
            on_event(Phase("sweep", f"{point.stages} stages on {len(cluster.hosts)} hosts: up to {point.slots} a host "
                                    f"([sweep] slots; the inventory has {cluster.slots} slot(s))"))
        session = RunSession(hosts, options_for(base, point), on_event=on_event, runs_root=out / "runs",
                             baseline_cache=cache, wait=wait)
        if on_session:
            on_session(session)
        try:
            rows.append(row_of(point, await session.run()))
        except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
            # One failed configuration does not lose the others; the row says why.
            rows.append(row_of(point, session.last_summary, error=str(exc)))
        except E.Interrupted:
            rows.append(row_of(point, session.last_summary, error="interrupted"))
            _kept(lambda: write_table(out, rows, {**meta, "interrupted": True}), write_failed)
            raise
        if session.write_error is not None and write_failed is not None and not write_failed:
            write_failed.append(session.write_error)
        _kept(lambda: write_table(out, rows, meta), write_failed)
        if on_rows:
            on_rows(list(rows))
    _kept(lambda: plot(out, rows), write_failed)
    await track_record(kinds, out, lambda: sweep_series(out.name, rows, base.model_dump()),
                       lambda message: on_event(Phase("track", message)) if on_event else None)
    return rows
