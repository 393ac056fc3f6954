"""Profiler traces from every rank: request a window, download, merge into one timeline, summarise.

    <run dir>/traces/               the first grab of a run (traces-2/, traces-3/ ... for later ones)
        <host>-rank<r>.json.gz      each rank's chrome trace as the rank wrote it
        timeline.json               all ranks on one time axis: one process per rank, `host/rank r`
        summary.json                per rank: compute, send, receive-wait and idle percentages

The hosts do the profiling (`remote.runtime.tracing`); this module only moves files and
reads JSON, so the controller stays free of torch.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.clock import measure_clock
from pictl.cluster.transport import Transport
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE, read_record, run_is_live, write_json_atomic
from pictl.summary_models import TraceRecord
from remote import protocol as P

TIMELINE_FILE = "timeline.json"


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


def new_trace_id() -> str:
    return f"{time.strftime('%H%M%S')}-{secrets.token_hex(2)}"


def grab_directory(run_path: Path) -> Path:
    """`traces/` for a run's first grab, then `traces-2/`, `traces-3/`...: a later grab never overwrites."""
    target, n = run_path / P.TRACES_DIR, 1
    while target.exists():
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
            tmp = directory / f".{final.name}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, final)
            grab.files[rt.rank] = final
            return

    await asyncio.gather(*(fetch(rt) for rt in ranks))
    return grab


TRACE_LIMIT = 256 << 20
"""The most of a trace file read from a host, compressed, and the most it may hold once decompressed: a few
steps of a DeiT-S rank are a few MB; a host cannot make the controller allocate without bound."""


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read(TRACE_LIMIT + 1)
        if len(raw) > TRACE_LIMIT:
            raise E.ConfigError(f"{path}: more than {TRACE_LIMIT >> 20} MB once decompressed: not read")
        data = json.loads(raw)
    except (OSError, EOFError, ValueError, RecursionError) as exc:  # gzip's BadGzipFile is an OSError
        raise E.ConfigError(f"{path}: not a readable chrome trace ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise E.ConfigError(f"{path}: not a chrome trace (no traceEvents list)")
    base = data.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool):
        raise E.ConfigError(f"{path}: baseTimeNanoseconds is not a whole number")
    # The file came from a host: only events whose times are numbers reach the merge and the breakdown.
    events = [ev for ev in data["traceEvents"] if isinstance(ev, dict)
              and all(_finite(ev[k]) for k in ("ts", "dur") if k in ev)]
    return {**data, "traceEvents": events}


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# -- merging ------------------------------------------------------------------------------------

_FLOW_PHASES = {"s", "t", "f"}


def merge(traces: dict[int, tuple[str, dict[str, Any]]], offsets_ns: dict[str, int]) -> dict[str, Any]:
    """One trace for all ranks: each rank's events rebased onto our clock, one process per rank.

    `traces` maps rank -> (host, trace). An event's absolute time on its host is
    baseTimeNanoseconds + ts; subtracting the host's clock offset puts it on the
    controller's clock, and the earliest event of all becomes time 0.
    """
    shifted: list[tuple[int, str, dict[str, Any], float]] = []
    for rank, (host, data) in sorted(traces.items()):
        base_us = (int(data.get("baseTimeNanoseconds", 0)) - offsets_ns.get(host, 0)) / 1000.0
        shifted.append((rank, host, data, base_us))
    t0 = min((base + ev["ts"] for _, _, d, base in shifted for ev in d["traceEvents"] if "ts" in ev), default=0.0)
    events: list[dict[str, Any]] = []
    for rank, host, data, base_us in shifted:
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"{host}/rank {rank}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        for ev in data["traceEvents"]:
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index", "process_labels"):
                continue  # ours replace them: OS pids collide across hosts
            out = dict(ev)
            out["pid"] = rank
            if "ts" in out:
                out["ts"] = round(base_us + out["ts"] - t0, 3)
            if out.get("ph") in _FLOW_PHASES and "id" in out:
                out["id"] = f"{rank}:{out['id']}"  # flow ids are per trace
            events.append(out)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"pictl": {"ranks": {str(r): h for r, h, _, _ in shifted},
                                    "clock_offset_ns": offsets_ns, "time_zero_us": t0}}}


# -- what each rank did in its window ------------------------------------------------------------

_SEND = ("gloo:send", "c10d::send")
_RECV = ("gloo:recv", "c10d::recv_")


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def _minus(spans: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s, e in spans:
        pieces = [(s, e)]
        for cs, ce in cut:
            pieces = [p for ps, pe in pieces for p in ((ps, min(pe, cs)), (max(ps, ce), pe)) if p[1] > p[0]]
        out += pieces
    return out


def rank_breakdown(data: dict[str, Any]) -> dict[str, Any]:
    """Compute, send, receive-wait and idle shares of one rank's traced window, in percent.

    Each microbatch runs inside the schedule's `Forward i` range: post the receive,
    wait for it, compute (`pictl:compute <step>`, recorded by the stage), post the
    send. So compute is the stage's forward; send is the time in send calls;
    receive-wait is the rest of the Forward ranges plus receive calls; idle is what
    lies outside them (the barrier between passes, waiting for sends to drain).
    """
    complete = [ev for ev in data["traceEvents"] if ev.get("ph") == "X" and "ts" in ev and "dur" in ev
                and not str(ev.get("name", "")).startswith("PyTorch Profiler")]
    if not complete:
        return {"window_ms": 0.0, "compute_pct": 0.0, "send_pct": 0.0, "recv_wait_pct": 0.0, "idle_pct": 100.0,
                "microbatches": 0}
    start = min(ev["ts"] for ev in complete)
    end = max(ev["ts"] + ev["dur"] for ev in complete)
    window = max(end - start, 1e-9)

    def spans(*prefixes: str) -> list[tuple[float, float]]:
        return _union([(ev["ts"], ev["ts"] + ev["dur"]) for ev in complete
                       if str(ev.get("name", "")).startswith(prefixes)])

    compute = spans(P.TRACE_COMPUTE_RANGE)
    send = _minus(spans(*_SEND), compute)
    recv = _minus(_minus(_union(spans("Forward ") + spans(*_RECV)), compute), send)
    shares = {k: round(100.0 * _length(v) / window, 1) for k, v in
              (("compute_pct", compute), ("send_pct", send), ("recv_wait_pct", recv))}
    shares["idle_pct"] = round(max(0.0, 100.0 - sum(shares.values())), 1)
    return {"window_ms": round(window / 1000.0, 3), **shares,
            "microbatches": sum(1 for ev in complete if str(ev.get("name", "")).startswith(P.TRACE_COMPUTE_RANGE))}


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
    clocks: dict[str, Any] = {}
    for host, res in zip(hosts, await offsets_task, strict=True):
        clocks[host] = ({"error": str(res)} if isinstance(res, BaseException)
                        else {"measured_ns": res.offset_ns, "uncertainty_ns": res.uncertainty_ns})
        # An offset within its own uncertainty is consistent with none: shifting by it would only add noise.
        offsets[host] = res.offset_ns if not isinstance(res, BaseException) and res.significant else 0
        clocks[host]["applied_ns"] = offsets[host]
    loaded: dict[int, tuple[str, dict[str, Any]]] = {}
    for r, p in list(grab.files.items()):
        try:
            loaded[r] = (next(rt.host for rt in ordered if rt.rank == r), load_trace(p))
        except E.ConfigError as exc:  # one rank's file is not a trace: the others still merge
            grab.missing[r] = str(exc)
            del grab.files[r]
    if loaded:
        grab.timeline = grab.directory / TIMELINE_FILE
        write_json_atomic(grab.timeline, merge(loaded, offsets))
        grab.per_rank = {r: rank_breakdown(d) for r, (_, d) in loaded.items()}
    write_json_atomic(grab.directory / SUMMARY_FILE, grab.to_json() | {"clocks": clocks})
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
    config = read_record(path)
    try:
        run_id = json.loads(config["spec"])["run_id"]
        cluster = load_cluster(config["cluster"])
        hosts = {h.name: h for h in cluster.hosts}
        placement = [(hosts[p["host"]], [int(r) for r in p["ranks"]]) for p in config["placement"]]
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
