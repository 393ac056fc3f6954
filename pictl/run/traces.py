"""Profiler traces from every rank: request a window, download, merge into one timeline, summarise.

    <run dir>/traces/               the first grab of a run (traces-2/, traces-3/ ... for later ones)
        <host>-rank<r>.json.gz      each rank's chrome trace as the rank wrote it
        timeline.json               all ranks on one time axis: one process per rank, `host/rank r`
        summary.json                per rank: compute, send, receive-wait and idle percentages

The hosts do the profiling (`remote.runtime.tracing`); this module asks for a window and moves the files,
and `trace_files` reads, merges and breaks them down, so the controller stays free of torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.cluster.clock import measure_clock
from pictl.cluster.transport import Transport
from pictl.records.run_config import RunConfigRecord
from pictl.records.run_placement import PLACEMENT
from pictl.records.runs import (
    CONFIG_FILE,
    SUMMARY_FILE,
    read_record,
    run_is_live,
    write_bytes_atomic,
    write_json_atomic,
)
from pictl.run.trace_files import TRACE_LIMIT, ChromeTrace, merge, rank_breakdown, read_trace
from pictl.summary_figures import Open
from pictl.summary_models import TraceRecord
from pictl.validation import problem_line
from remote.floor import protocol as P

TIMELINE_FILE = "timeline.json"
PERFETTO = "https://ui.perfetto.dev"
"""Where a trace is looked at: Perfetto's UI opens a Chrome trace file in the browser (nothing is uploaded)."""


@dataclass(frozen=True)
class RankTrace:
    """Where one rank's trace is on its host."""

    host: str
    rank: int
    transport: Transport
    run_dir: str  # the run's directory on that host


@dataclass
class TraceGrab:
    """What one grab produced; `missing` names the ranks that delivered nothing, with why."""

    trace_id: str
    directory: Path
    files: dict[int, Path] = field(default_factory=dict)
    missing: dict[int, str] = field(default_factory=dict)
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    timeline: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.trace_id, "directory": str(self.directory),
                "files": {str(r): str(p) for r, p in sorted(self.files.items())},
                "missing": {str(r): why for r, why in sorted(self.missing.items())},
                "per_rank": {str(r): s for r, s in sorted(self.per_rank.items())},
                "timeline": str(self.timeline) if self.timeline else None}

    def record(self) -> TraceRecord:
        """The grab as the summary records it."""
        return TraceRecord.model_validate(self.to_json())


class GrabClock(Open):
    """A host's clock as a grab's summary.json (`clocks`) keeps it: the offset measured (host clock - ours) and its
    uncertainty, or why it could not be measured, and the offset the merge applied (0: none significant)."""

    error: str | None = None
    measured_ns: int | None = None
    uncertainty_ns: int | None = None
    applied_ns: int | None = None


def perfetto_hint(timeline: Path | str) -> str:
    """Where a grab's merged timeline is and how to open it: what is said once its traces are written."""
    return f"open {timeline} at {PERFETTO} (\"Open trace file\"): every rank on one time axis"


def new_trace_id() -> str:
    return f"{time.strftime('%H%M%S')}-{secrets.token_hex(2)}"


def grab_directory(run_path: Path) -> Path:
    """`traces/` for a run's first grab, then `traces-2/`, `traces-3/`...: a later grab never overwrites."""
    target, n = run_path / P.TRACES_DIR, 1
    while os.path.lexists(target):  # a link by that name is passed over too: never written through
        n += 1
        target = run_path / f"{P.TRACES_DIR}-{n}"
    return target


async def request_window(first: RankTrace, trace_id: str, steps: int) -> None:
    """Ask rank 0 (through a file it polls between steps) to profile `steps` steps on every rank."""
    body = json.dumps({"id": trace_id, "steps": steps, "requested_at": time.time()}).encode()
    # put_bytes writes to a temporary name and renames: rank 0 never reads half a request.
    await first.transport.put_bytes(body, f"{first.run_dir}/{P.TRACE_REQUEST_FILE}")


async def download(ranks: list[RankTrace], trace_id: str, directory: Path, *, timeout_s: float,
                   gave_up: Callable[[int], str | None] = lambda _r: None, poll_s: float = 0.5) -> TraceGrab:
    """Wait for every rank's file (until `timeout_s`, or until `gave_up(rank)` says why it never will)."""
    grab = TraceGrab(trace_id, directory)
    directory.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s

    async def fetch(rt: RankTrace) -> None:
        remote = f"{rt.run_dir}/{P.TRACES_DIR}/{trace_id}/{P.trace_file(rt.rank)}"
        while True:
            try:
                data = await rt.transport.get_bytes(remote, limit=TRACE_LIMIT)
            except E.TooLarge as exc:
                grab.missing[rt.rank] = str(exc)
                return
            except E.TransportError:
                if (why := gave_up(rt.rank)) is not None:
                    grab.missing[rt.rank] = why
                    return
                if time.monotonic() > deadline:
                    grab.missing[rt.rank] = f"no trace from {rt.host} within {timeout_s:.0f} s"
                    return
                await asyncio.sleep(poll_s)
                continue
            final = directory / f"{rt.host}-rank{rt.rank}.json.gz"
            write_bytes_atomic(final, data)  # (a fresh temporary name: never written through a link)
            grab.files[rt.rank] = final
            return

    await asyncio.gather(*(fetch(rt) for rt in ranks))
    return grab


async def grab_traces(ranks: list[RankTrace], run_path: Path, *, steps: int, timeout_s: float = 120.0,
                      gave_up: Callable[[str, int], str | None] = lambda _id, _r: None,
                      trace_id: str | None = None, request: bool = True) -> TraceGrab:
    """Request a window (unless the run already planned one), download every rank's trace, merge.

    A rank that delivers nothing within `timeout_s` is listed in `missing`; the
    other ranks' traces are kept and merged all the same.
    """
    if not ranks:
        raise E.ConfigError("no pipeline ranks to trace")
    trace_id = trace_id or new_trace_id()
    ordered = sorted(ranks, key=lambda r: r.rank)
    if request:
        await request_window(ordered[0], trace_id, steps)
    hosts = {rt.host: rt.transport for rt in ordered}
    offsets_task = asyncio.gather(*(measure_clock(t) for t in hosts.values()), return_exceptions=True)
    grab = await download(ordered, trace_id, grab_directory(run_path), timeout_s=timeout_s,
                          gave_up=lambda r: gave_up(trace_id, r))
    offsets: dict[str, int] = {}
    clocks: dict[str, GrabClock] = {}
    for host, res in zip(hosts, await offsets_task, strict=True):
        clock = (GrabClock(error=str(res)) if isinstance(res, BaseException)
                 else GrabClock(measured_ns=res.offset_ns, uncertainty_ns=res.uncertainty_ns))
        # An offset within its own uncertainty is consistent with none: shifting by it would only add noise.
        offsets[host] = clock.applied_ns = (res.offset_ns if not isinstance(res, BaseException) and res.significant
                                            else 0)
        clocks[host] = clock
    loaded: dict[int, tuple[str, ChromeTrace]] = {}
    for r, p in list(grab.files.items()):
        try:
            loaded[r] = (next(rt.host for rt in ordered if rt.rank == r), read_trace(p))
        except E.ConfigError as exc:  # one rank's file is not a trace: the others still merge
            grab.missing[r] = str(exc)
            del grab.files[r]
    if loaded:
        grab.timeline = grab.directory / TIMELINE_FILE
        write_json_atomic(grab.timeline, merge(loaded, offsets))
        grab.per_rank = {r: rank_breakdown(d) for r, (_, d) in loaded.items()}
    write_json_atomic(grab.directory / SUMMARY_FILE,
                      grab.to_json() | {"clocks": {h: c.written() for h, c in clocks.items()}})
    return grab


def live_run(runs_root: Path, run: str | None) -> Path:
    """The run to trace: the one named, else the newest run that is still open (its controller holds its live
    lock; a record from before the lock counts as open while it has no summary)."""
    if run:
        path = Path(run) if Path(run).is_dir() else runs_root / run
        if not (path / CONFIG_FILE).exists():
            raise E.ConfigError(f"run '{run}': no such run directory (looked in {runs_root})")
        if not _open(path):
            raise E.ConfigError(f"run '{path.name}' has finished: traces come from a live run "
                                "(or `pictl run --trace-steps K`)")
        return path
    live = [p for p in sorted(runs_root.glob("*/"), reverse=True) if (p / CONFIG_FILE).exists() and _open(p)]
    if not live:
        raise E.ConfigError(f"no run is in progress in {runs_root}")
    return live[0]


def _open(path: Path) -> bool:
    live = run_is_live(path)
    return live if live is not None else not (path / SUMMARY_FILE).exists()


async def grab_from_outside(run_path: Path, steps: int, timeout_s: float) -> TraceGrab:
    """`pictl traces`: grab from a run another pictl process drives, through the hosts alone."""
    from pictl.cluster.jobs import HostJob, to_the_end
    from pictl.inventory import load_cluster

    path = run_path / CONFIG_FILE
    config = RunConfigRecord.view(read_record(path))
    try:
        # (the hosts' spec is `RunSpec.to_json`'s string; only its run id is read, whatever else it holds)
        run_id = json.loads(config.spec)["run_id"]
        cluster = load_cluster(config.cluster)
        hosts = {h.name: h for h in cluster.hosts}
        placement = [(hosts[p.host], p.ranks) for p in PLACEMENT.validate_python(config.placement)]
    except ValidationError as exc:
        raise E.ConfigError(f"{path}: not a run record this pictl can use (placement: {problem_line(exc)})") from None
    except (KeyError, TypeError, ValueError) as exc:  # a hand-edited or foreign record; the inventory changed
        raise E.ConfigError(f"{path}: not a run record this pictl can use ({type(exc).__name__}: {exc})") from None
    if sum(len(r) for _, r in placement) < 2:
        raise E.ConfigError(f"run '{run_path.name}' is a serial run: traces are for pipeline runs")
    # A job on the run's hosts without a lease of its own (the run holds them): it only asks and fetches.
    job = HostJob([h for h, _ in placement], f"traces-{run_id}")
    try:
        await job.connect()  # every host, or one error naming each failure
        ranks = [RankTrace(h.name, r, job.transport(h), h.run_dir(run_id)) for h, rs in placement for r in rs]

        def gave_up(_trace_id: str, rank: int) -> str | None:
            ended = not _open(run_path)
            return f"rank {rank}: the run ended before its trace arrived" if ended else None

        return await grab_traces(ranks, run_path, steps=steps, timeout_s=timeout_s, gave_up=gave_up)
    finally:
        await to_the_end(job.close())
