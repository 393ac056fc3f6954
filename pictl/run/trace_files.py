"""Chrome traces as files (no torch, no hosts): one rank's trace read within a cap and checked, every rank's
merged onto the controller's clock (one process per rank, flow arrows kept), and a rank's traced window
broken down into compute, send, receive-wait and idle."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pictl import errors as E
from pictl.summary_models import RankShare, StageFigures, TraceRecord
from remote.floor import protocol as P

TRACE_LIMIT = 256 << 20
"""The most of a trace file read from a host, compressed, and the most it may hold once decompressed: a few
steps of a DeiT-S rank are a few MB; a host cannot make the controller allocate without bound."""


def load_trace(path: Path) -> dict[str, Any]:
    """The trace in `path` as its rank wrote it, checked (`ChromeTrace.of`): only its usable events kept."""
    data, trace = _read(path)
    return {**data, "traceEvents": [ev.raw for ev in trace.events]}


def read_trace(path: Path) -> ChromeTrace:
    """The trace in `path`, read once into the form the merge and the breakdown take (ConfigError, naming the
    file, if it is not a readable Chrome trace)."""
    return _read(path)[1]


def _read(path: Path) -> tuple[dict[str, Any], ChromeTrace]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read(TRACE_LIMIT + 1)
        if len(raw) > TRACE_LIMIT:
            raise E.ConfigError(f"{path}: more than {TRACE_LIMIT >> 20} MB once decompressed: not read")
        data = json.loads(raw)
    except (OSError, EOFError, ValueError, RecursionError) as exc:  # gzip's BadGzipFile is an OSError
        raise E.ConfigError(f"{path}: not a readable chrome trace ({type(exc).__name__})") from None
    return data, ChromeTrace.of(data, str(path))


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_FLOW_PHASES = {"s", "t", "f"}


class Slice(NamedTuple):
    """A complete event ("X"): a range of time on one thread, in microseconds."""

    name: str
    tid: int | float | str | None
    start: float
    end: float


class TraceEvent(NamedTuple):
    """One event of a rank's trace, read once (`of`): the fields the merge and the breakdown use, beside the
    event as the rank wrote it (`raw`: the merged timeline carries each of its keys on)."""

    raw: dict[str, Any]
    ph: str | None
    """The event's phase ("X" complete, "M" metadata, "s"/"t"/"f" flow, ...); None where it is not text."""
    name: str
    """The event's name as text ("" where it has none)."""
    ts: float | None
    dur: float | None
    tid: int | float | str | None
    """The thread (None where it is not a number or text)."""
    flow_id: str | None
    """A flow event's id, as text (None for any other event, or a flow event without one)."""

    @classmethod
    def of(cls, raw: object) -> TraceEvent | None:
        """The event, or None where it is not an object or one of its times is not a finite number: the file
        came from a host, and only events whose times are numbers reach the merge and the breakdown."""
        if not isinstance(raw, dict):
            return None
        ts, dur = raw.get("ts"), raw.get("dur")
        if not ((ts is None and "ts" not in raw) or _finite(ts)) or not ((dur is None and "dur" not in raw)
                                                                           or _finite(dur)):
            return None
        ph, tid = raw.get("ph"), raw.get("tid")
        ph = ph if isinstance(ph, str) else None
        return cls(raw, ph, str(raw.get("name", "")), ts, dur, tid if isinstance(tid, (int, float, str)) else None,
                   str(raw["id"]) if ph in _FLOW_PHASES and "id" in raw else None)

    def complete(self) -> Slice | None:
        """The event as a range of time on its thread, where it is a complete one with both times."""
        if self.ph != "X" or self.ts is None or self.dur is None:
            return None
        return Slice(self.name, self.tid, self.ts, self.ts + self.dur)

    def placed(self, rank: int, base_us: float, t0: float) -> dict[str, Any]:
        """The event on the merged timeline: in the rank's process, its time on the controller's clock (`base_us`
        the rank's base there, `t0` the timeline's zero), a flow's id made the rank's own (ids are per trace)."""
        return {**self.raw, "pid": rank,
                **({} if self.ts is None else {"ts": round(base_us + self.ts - t0, 3)}),
                **({} if self.flow_id is None else {"id": f"{rank}:{self.flow_id}"})}


@dataclass(frozen=True, slots=True)
class ChromeTrace:
    """One rank's Chrome trace, read once: its base time on its host's clock and its usable events."""

    base_ns: int
    """baseTimeNanoseconds: an event's absolute time on its host is this plus its `ts` (in us)."""
    events: tuple[TraceEvent, ...]

    @classmethod
    def of(cls, data: object, where: str = "trace") -> ChromeTrace:
        """`data` (a trace's JSON) read; ConfigError, naming `where`, if it is not a Chrome trace. An event that
        is not an object, or whose times are not finite numbers, is left out (`TraceEvent.of`)."""
        events = data.get("traceEvents") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(events, list):
            raise E.ConfigError(f"{where}: not a chrome trace (no traceEvents list)")
        base = data.get("baseTimeNanoseconds", 0)
        if not isinstance(base, int) or isinstance(base, bool):
            raise E.ConfigError(f"{where}: baseTimeNanoseconds is not a whole number")
        return cls(base, tuple(ev for ev in map(TraceEvent.of, events) if ev is not None))


# -- merging ------------------------------------------------------------------------------------

_OS_PROCESS = ("process_name", "process_sort_index", "process_labels")
"""The metadata events naming a rank's OS process: the merge writes its own."""


def merge(traces: Mapping[int, tuple[str, ChromeTrace | dict[str, Any]]], offsets_ns: dict[str, int]) -> dict[str, Any]:
    """One trace for all ranks: each rank's events rebased onto our clock, one process per rank.

    `traces` maps rank -> (host, trace). An event's absolute time on its host is
    baseTimeNanoseconds + ts; subtracting the host's clock offset puts it on the
    controller's clock, and the earliest event of all becomes time 0.
    """
    shifted: list[tuple[int, str, ChromeTrace, float]] = []
    for rank, (host, data) in sorted(traces.items()):
        trace = ChromeTrace.of(data) if isinstance(data, dict) else data
        shifted.append((rank, host, trace, (trace.base_ns - offsets_ns.get(host, 0)) / 1000.0))
    t0 = min((base + ev.ts for _, _, trace, base in shifted for ev in trace.events if ev.ts is not None),
             default=0.0)
    events: list[dict[str, Any]] = []
    for rank, host, trace, base_us in shifted:
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"{host}/rank {rank}"}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        events += [ev.placed(rank, base_us, t0) for ev in trace.events
                   if not (ev.ph == "M" and ev.name in _OS_PROCESS)]  # ours replace them: OS pids collide across hosts
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"pictl": {"ranks": {str(r): h for r, h, _, _ in shifted},
                                    "clock_offset_ns": offsets_ns, "time_zero_us": t0}}}


# -- what each rank did in its window ------------------------------------------------------------

_SEND = ("c10d::send",)
"""The rank's own thread posting a send. `gloo:send` is not counted: it lasts until the peer has received the
data (the send is asynchronous, and the wire's time runs in gloo's threads while this rank computes on); counted,
it read rank 0 as 32 % sending where its counters said 2.7 ms of send against 149 ms of compute."""
_RECV = ("gloo:recv", "c10d::recv_")
AGREE_POINTS = 10.0
"""A trace's compute, wait and send shares of a microbatch agree with the run's counters when none differs by
more than this many percentage points."""


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


def _within(spans: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    return [(max(s, start), min(e, end)) for s, e in spans if min(e, end) > max(s, start)]


def rank_breakdown(data: ChromeTrace | dict[str, Any]) -> dict[str, Any]:
    """Compute, send, receive-wait and idle shares of one rank's traced window, in percent, and per microbatch
    in ms (the units of the run's stage table).

    Each microbatch runs inside the schedule's `Forward i` range: post the receive, wait for it, compute
    (`pictl:compute <step>`, recorded by the stage), post the send. Only the thread that computes is read (the
    rank's own time; gloo's threads carry the wire). Compute is the stage's forward; send is the time in send
    calls; receive-wait is the rest of the Forward ranges plus receive calls; idle is what lies between them.
    The window runs from the profiler's start to the end of the last traced microbatch (its compute and its
    sends posted): the next step's Forward range, where the profiler's stop waits for the window's sends to land
    (`remote.runtime.tracing`), is a wait of the tracing's own making, reported apart as `drain_ms` (in an
    untraced pass the next microbatches' compute overlaps those sends; counted, it read rank 0 as waiting 6 %
    for input where its counters said 0).
    """
    trace = ChromeTrace.of(data) if isinstance(data, dict) else data
    complete = [sl for ev in trace.events
                if (sl := ev.complete()) is not None and not sl.name.startswith("PyTorch Profiler")]
    computing = [sl for sl in complete if sl.name.startswith(P.TRACE_COMPUTE_RANGE)]
    if not computing:
        return {"window_ms": 0.0, "compute_pct": 0.0, "send_pct": 0.0, "recv_wait_pct": 0.0, "idle_pct": 100.0,
                "microbatches": 0}
    main = {sl.tid for sl in computing}
    mine = [sl for sl in complete if sl.tid in main]

    def spans(*prefixes: str) -> list[tuple[float, float]]:
        return _union([(sl.start, sl.end) for sl in mine if sl.name.startswith(prefixes)])

    # From the profiler's start (the first traced step posting its receive) to where the step after the last
    # traced one begins: the profiler stops inside that step's Forward range, after waiting for the window's sends.
    start, last = min(sl.start for sl in mine), max(sl.end for sl in mine)
    done = max(sl.end for sl in computing)
    end = min((s for s, _ in spans("Forward ") if s >= done), default=None)
    if end is None:  # the window ended with its pass: its last microbatch's sends posted, then the drain
        end = max([done, *(e for s, e in spans(*_SEND) if s >= done)])
    window = max(end - start, 1e-9)
    compute = _within(spans(P.TRACE_COMPUTE_RANGE), start, end)
    send = _minus(_within(spans(*_SEND), start, end), compute)
    recv = _minus(_minus(_within(_union(spans("Forward ") + spans(*_RECV)), start, end), compute), send)
    shares = {k: round(100.0 * _length(v) / window, 1) for k, v in
              (("compute_pct", compute), ("send_pct", send), ("recv_wait_pct", recv))}
    idle = round(max(0.0, 100.0 - sum(shares.values())), 1)
    microbatches = len(computing)
    per = {f"{k}_ms": round(_length(v) / 1000.0 / microbatches, 3) for k, v in
           (("compute", compute), ("send", send), ("recv_wait", recv))}
    return {"window_ms": round(window / 1000.0, 3), **shares, "idle_pct": idle, "microbatches": microbatches, **per,
            "drain_ms": round(max(0.0, last - end) / 1000.0, 3)}


def against_counters(share: dict[str, Any], measured_ms: float | None, wait_ms: float | None,
                     send_ms: float | None) -> dict[str, Any]:
    """A rank's traced microbatch (compute, waiting for input, blocked on sends) beside the run's own counters
    for it (the stage table's compute, wait and send ms): each as a share of the three, the largest difference
    in percentage points, whether they agree within AGREE_POINTS and, where they do not, why. Empty when either
    side lacks a figure (a grab taken before the run's counters, a trace of an older pictl)."""
    traced_share = RankShare.view(share)  # (as rank_breakdown wrote it: never coerced)
    raw = [traced_share.compute_ms, traced_share.recv_wait_ms, traced_share.send_ms, measured_ms, wait_ms, send_ms]
    if not all(_finite(v) for v in raw):
        return {}
    traced, counted = [float(v) for v in raw[:3]], [float(v) for v in raw[3:]]  # type: ignore[arg-type]
    t_total, c_total = sum(traced), sum(counted)
    if t_total <= 0 or c_total <= 0:
        return {}
    t_pct = [100.0 * v / t_total for v in traced]
    c_pct = [100.0 * v / c_total for v in counted]
    differs = max(abs(a - b) for a, b in zip(t_pct, c_pct, strict=True))
    out: dict[str, Any] = {"counters_ms": [round(v, 3) for v in counted], "differs_points": round(differs, 1),
                           "agrees": differs <= AGREE_POINTS}
    if differs > AGREE_POINTS:
        out["why"] = _why(share, traced, counted, t_pct, c_pct)
    return out


def _why(share: dict[str, Any], traced: list[float], counted: list[float], t_pct: list[float],
         c_pct: list[float]) -> str:
    """Why a trace's shares differ from the counters', from the figures that say so."""
    if counted[0] > 0 and traced[0] > 1.1 * counted[0]:
        return (f"the profiler slowed the traced compute to {traced[0]:.1f} ms per microbatch against the counters' "
                f"{counted[0]:.1f} ms ({traced[0] / counted[0] - 1:.0%} more)")
    worst = max(range(3), key=lambda i: abs(t_pct[i] - c_pct[i]))
    what = ("compute", "waiting for input", "sending")[worst]
    return (f"a different window: the trace holds {RankShare.view(share).microbatches} microbatch(es) of one pass, the "
            f"counters every timed pass with its fill and the drain at its end ({what}: {t_pct[worst]:.0f} % "
            f"traced, {c_pct[worst]:.0f} % counted)")


def with_counters(grab: dict[str, Any], per_stage: list[dict[str, Any]]) -> dict[str, Any]:
    """A grab (its `to_json`) with each rank's trace set beside the run's counters for that rank."""
    stages = {str(st.rank): st for st in map(StageFigures.view, per_stage)}  # (the summary's rows, as built)
    shares: dict[str, Any] = TraceRecord.view(grab).per_rank or {}  # (each still the dict rank_breakdown made)
    per_rank = {}
    for rank, share in shares.items():
        st = stages.get(str(rank))
        found = against_counters(share, st.measured_ms, st.wait_ms, st.send_ms) if st else {}
        per_rank[rank] = {**share, **found}
    return {**grab, "per_rank": per_rank}
