"""`pictl sweep`: every combination of stages, chunk sizes, policies and wire formats, measured against one serial
reference in interleaved rounds; one ranked table, plots.

Every combination is checked against the inventory before anything runs (a value that cannot run is bad input,
nothing started), every host is held for the whole sweep (connected, leased under the sweep's name and the code
pushed once: `pictl.run.hosts.held_hosts`; every run borrows them), and the pipeline runs are planned together
in one process (`planning.plan_ahead`). Then
`sweep_rounds` measures them: each round the reference (a serial run on the inventory's first host, measured
then) and every combination in alternating order, each run handed that round's reference as its baseline. The
table (`sweep_table`) ranks the combinations by their speedup over the reference, round by round (median and
interval), says which are ties, and is rewritten after every round: an interrupted or failing sweep keeps what
it measured. Every run is a run of its own under the runs root (`pictl runs` lists it with its sweep). The plots
are drawn by `sweep_plots`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.events import EventSink
from pictl.inventory import Cluster
from pictl.jobs.sweep_plots import plot
from pictl.jobs.sweep_rounds import REFERENCE, Entry, Measurements, RoundsPlan, SweepRounds
from pictl.jobs.sweep_table import (
    COLUMNS,
    MD_COLUMNS,
    markdown_table,
    reference_line,
    row_of,
    sweep_rows,
    verdict_lines,
    write_table,
    write_tables,
)
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages, sharing_hosts
from pictl.planning.presets import SweepSettings, resolve_options, sweep_axes, sweep_settings
from pictl.run.baselines import BaselineCache
from pictl.run.hosts import HeldHosts, held_hosts
from pictl.run.session import RunSession
from pictl.text import ascii_count
from pictl.validation import got, problem_line

__all__ = ["COLUMNS", "MD_COLUMNS", "RoundsPlan", "SweepPoint", "markdown_table", "options_for", "plan_sweep",
           "plot", "row_of", "run_sweep", "sweep_points", "write_table", "write_tables"]


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
    """A sweep's wire formats, one per value, each as `remote.floor.wire` names it; ConfigError names `name`."""
    from remote.floor.wire import parse_format

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


def configuration_labels(points: list[SweepPoint]) -> list[str]:
    """Each point's name in the table, the verdicts and the progress lines (`2 stages, balanced`; the chunk and a
    wire other than fp32 when they vary); a point given twice gets `#2`."""
    chunks = len({p.chunk for p in points}) > 1
    labels: list[str] = []
    for p in points:
        parts = ["serial"] if p.stages == 1 else [f"{p.stages} stages", p.policy]
        parts += [f"chunk {p.chunk}"] if chunks else []
        parts += [p.wire] if p.wire != "fp32" and p.stages > 1 else []
        label, copies = ", ".join(parts), 1
        while (label if copies == 1 else f"{label} #{copies}") in labels:
            copies += 1
        labels.append(label if copies == 1 else f"{label} #{copies}")
    return labels


def reference_of(cluster: Cluster, base: RunOptions, points: list[SweepPoint]) -> Entry:
    """The sweep's one reference: the serial run on the inventory's first host, at the first point's chunk and
    the sweep's protocol and numerics (a one-host run: `equal`, nothing to choose)."""
    chunk = points[0].chunk if points else base.chunk
    options = options_for(base, SweepPoint(1, chunk, "serial"))
    options = RunOptions.model_validate({**options.model_dump(), "policy": "equal"})
    return Entry(REFERENCE, options, cluster.model_copy(update={"hosts": (cluster.hosts[0],)}))


async def run_sweep(cluster: Cluster, base: RunOptions, points: list[SweepPoint], out: Path, *,
                    on_event: EventSink | None = None, cache: BaselineCache | None = None,
                    on_session: Callable[[RunSession, int, int], object] | None = None,
                    on_rows: Callable[[list[dict[str, Any]]], object] | None = None, wait: bool = False,
                    write_failed: list[E.RecordWriteFailed] | None = None, runs_root: Path | None = None,
                    rounds: RoundsPlan | None = None) -> list[dict[str, Any]]:
    """Measure every point against one reference in interleaved rounds (`sweep_rounds`); the ranked rows.
    `on_session(session, k, n)` is called before each run (the k-th of n planned so far) and `on_rows(rows)`
    after each round (the dashboard follows the sweep through them). The sweep holds every host for all of its
    runs (`pictl.run.hosts.held_hosts`): with `wait`, hosts another run holds are waited for before the first
    run; without, the sweep is refused there (HostBusy), before its directory is made. Runs go under
    `runs_root` (default: the runs root). A sweep file that cannot be written goes into `write_failed` and the
    sweep goes on (the caller prints the rows)."""
    from pictl.records.tracker_writers import check_trackers

    kinds = list(base.track or cluster.track)
    check_trackers(kinds)  # before anything starts
    # Every host held before anything starts, for the whole sweep: connected, leased under the sweep's name (another
    # team's run is refused, or queues with --wait, until the sweep ends) and the code pushed, once; every run
    # borrows them. A host that is down is one error naming it (exit 4, no sweep directory), a busy one exit 8.
    async with held_hosts(cluster, "sweep", out.name, wait=wait, on_event=on_event, model=base.model) as held:
        return await _measured(cluster, base, points, out, held, kinds, on_event=on_event, cache=cache,
                               on_session=on_session, on_rows=on_rows, write_failed=write_failed,
                               runs_root=runs_root, rounds=rounds)


async def _measured(cluster: Cluster, base: RunOptions, points: list[SweepPoint], out: Path, held: HeldHosts,
                    kinds: Sequence[str], *, on_event: EventSink | None, cache: BaselineCache | None,
                    on_session: Callable[[RunSession, int, int], object] | None,
                    on_rows: Callable[[list[dict[str, Any]]], object] | None,
                    write_failed: list[E.RecordWriteFailed] | None, runs_root: Path | None,
                    rounds: RoundsPlan | None) -> list[dict[str, Any]]:
    """The sweep on the hosts it holds: planned, measured in rounds, its table, plots and trackers."""
    from pictl.events import Phase
    from pictl.planning.specs import plan_ahead
    from pictl.records.runs import default_runs_root
    from pictl.records.tracker_writers import track_record
    from pictl.records.trackers import sweep_series

    # One planning process for the pipeline runs (not a torch import each), and one that cannot work
    # is refused before the first run starts. A serial point plans inside its own baseline run.
    widest = max(points, key=lambda p: p.stages, default=None)  # (only the first host plans: it is any point's)
    planned = await plan_ahead(sharing_hosts(cluster, widest.stages, widest.slots) if widest else cluster,
                               [(point_label(p), options_for(base, p)) for p in points if p.stages > 1],
                               cache_root=cache.root.parent if cache else None)
    if planned and on_event:
        on_event(Phase("plan", f"{planned} sweep run(s) planned in one process"))
    plan = rounds or RoundsPlan()
    labels = configuration_labels(points)
    reference = reference_of(cluster, base, points)
    aliases = {label: REFERENCE for label, p in zip(labels, points, strict=True)
               if p.stages == 1 and p.chunk == reference.options.chunk}
    entries = []
    for label, point in zip(labels, points, strict=True):
        hosts = sharing_hosts(cluster, point.stages, point.slots)
        if hosts is not cluster and on_event:
            on_event(Phase("sweep", f"{point.stages} stages on {len(cluster.hosts)} hosts: up to {point.slots} a host "
                                    f"([sweep] slots; the inventory has {cluster.slots} slot(s))"))
        entries.append(Entry(label, options_for(base, point), hosts, point.slots))
    out.mkdir(parents=True)
    meta: dict[str, Any] = {"started_at": time.time(), "cluster": cluster.source, "options": base.model_dump(),
                            "points": [p.__dict__ for p in points], "labels": labels,
                            "runs_root": str((runs_root or default_runs_root()).absolute()),
                            "plan": plan.__dict__}
    rows: list[dict[str, Any]] = []

    def table(measured: Measurements, **extra: Any) -> None:
        ranking = engine.ranking()
        runs = {label: measured.reference if aliases.get(label) == REFERENCE else measured.runs.get(label, [])
                for label in labels}
        # (the reference's host: the inventory's first, then the first each lost host left)
        host = ", then ".join(dict.fromkeys([reference.cluster.hosts[0].name,
                                             *(loss.reference_host for loss in measured.losses)]))
        line = reference_line(host, reference.options, ranking.reference)
        retired = {label: why for loss in measured.losses for label, why in loss.retired.items()}
        rows[:] = sweep_rows(points, labels, runs, ranking, line, retired)
        meta.update({"reference": {"host": host, "line": line, "chunk": reference.options.chunk,
                                   "ips": ranking.reference.to_json() if ranking.reference else None,
                                   "run_ids": [r.run_id for r in measured.reference]},
                     "verdicts": verdict_lines(ranking), **measured.to_json(), **extra})
        _kept(lambda: write_table(out, rows, meta), write_failed)
        if on_rows:
            on_rows(list(rows))

    engine = SweepRounds(reference, entries, plan, sweep_dir=out, runs_root=runs_root or default_runs_root(),
                         on_event=on_event, cache=cache, aliases=aliases, on_session=on_session,
                         on_round=table, write_failed=write_failed, hosts=held, cluster=cluster)
    if on_event:
        serial = reference_line(reference.cluster.hosts[0].name, reference.options, None).split(":")[0]
        on_event(Phase("sweep", f"{len(engine.measured_entries)} configuration(s) against one reference, "
                                f"{serial}, in "
                                f"{plan.rounds} interleaved round(s) (up to {plan.max_rounds} while too close to "
                                f"call)"))
    try:
        await engine.run()
    except E.Interrupted:
        table(engine.measured, interrupted=True)
        raise
    except (E.TransportError, E.HostBusy, E.NotReady, E.HostLost):  # a host lost for good: it ends here
        table(engine.measured)
        raise
    table(engine.measured)
    _kept(lambda: plot(out, rows), write_failed)
    await track_record(kinds, out, lambda: sweep_series(out.name, rows, base.model_dump()),
                       lambda message: on_event(Phase("track", message)) if on_event else None)
    return rows
