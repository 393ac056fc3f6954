"""Chrome traces as files (no torch, no hosts): one rank's trace read within a cap and checked, every rank's
merged onto the controller's clock (one process per rank, flow arrows kept), and a rank's traced window
broken down into compute, send, receive-wait and idle."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

from pictl import errors as E
from remote import protocol as P

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
