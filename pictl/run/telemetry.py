"""Keep the latest picture of every stage, folded from its ranks' events."""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass, field
from typing import Any

from pictl.events import Rejected
from remote import protocol as P

TOTALS = ("microbatches", "compute_s", "wait_s", "send_s", "bytes_sent", "raw_bytes", "compress_s", "decompress_s",
          "peak_Bps", "recv_post_s", "recv_wait_s", "first_wait_s", "send_post_s", "drain_s", "run_delay_s", "pass_s")
"""A rank's totals over the timed passes (`run_end`): where its time went, and what it sent."""


@dataclass
class StageState:
    """What is known about one rank, updated as its events arrive."""

    rank: int
    host: str
    pieces: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    params: int = 0
    load_s: float | None = None
    import_rss_mb: float | None = None
    ready_rss_mb: float | None = None
    peak_rss_mb: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    totals: dict[str, Any] = field(default_factory=dict)
    ended: bool = False
    error: dict[str, Any] | None = None
    last_event_t: float = 0.0


class RunTelemetry:
    """Folds a run's events (all ranks and the serial run) into figures."""

    def __init__(self) -> None:
        self.stages: dict[int, StageState] = {}
        self.throughputs: list[float] = []
        self.traced_throughputs: list[float] = []  # passes a profiler window touched: slower, kept apart
        self.traces: list[dict[str, Any]] = []
        self.accuracy: dict[str, Any] | None = None
        self.outputs: dict[str, Any] | None = None
        self.refine_rounds: list[dict[str, Any]] = []  # `balanced` correcting its split during the run
        self.refined: dict[str, Any] | None = None
        self.rejected: list[tuple[str, str]] = []  # (host, why): records that broke the protocol, never applied
        self.mb_times: dict[tuple[str, str, int], dict[int, list[float]]] = {}
        """(side, phase, repeat) -> first index -> the pass's microbatch times from there (`mb_times`)."""

    def reject(self, host: str, why: Rejected) -> None:
        self.rejected.append((host, f"{why.event}: {why.reason}"))

    def rejected_summary(self) -> dict[str, Any] | None:
        """How many records each host sent that broke the protocol, and the first few reasons."""
        if not self.rejected:
            return None
        hosts: dict[str, int] = {}
        for host, _ in self.rejected:
            hosts[host] = hosts.get(host, 0) + 1
        return {"count": len(self.rejected), "hosts": hosts,
                "first": [{"host": h, "reason": r} for h, r in self.rejected[:5]]}

    def missing_figures(self, stages: int, repeats: int) -> str | None:
        """Why a pipeline that ended cannot give its figures (a rank without its totals, passes without a
        throughput), or None when every rank and pass reported."""
        silent = [r for r in range(stages) if not (self.stages.get(r) and self.stages[r].ended)]
        if silent:
            return f"rank(s) {', '.join(map(str, silent))} ended without their figures"
        passes = len(self.throughputs) + len(self.traced_throughputs)
        if passes < repeats:
            return f"{passes} of {repeats} timed pass(es) reported a throughput"
        return None

    def stage(self, rank: int, host: str) -> StageState:
        if rank not in self.stages:
            self.stages[rank] = StageState(rank, host)
        return self.stages[rank]

    def apply(self, host: str, ev: dict[str, Any]) -> None:
        st = self.stage(int(ev.get(P.KEY_RANK, 0)), host)
        st.last_event_t = ev.get(P.KEY_TIME, 0.0)
        kind = ev[P.KEY_EVENT]
        if kind == P.RUN_START:
            st.import_rss_mb = ev.get("import_rss_mb")
        elif kind == P.STAGE_READY:
            st.modules, st.pieces = ev.get("modules", []), ev.get("pieces", [])
            st.params, st.load_s, st.ready_rss_mb = ev.get("params", 0), ev.get("load_s"), ev.get("rss_mb")
        elif kind == P.STAGE_MOVED:
            st.modules, st.pieces, st.params = ev.get("modules", []), ev.get("pieces", []), ev.get("params", 0)
        elif kind == P.PROGRESS:
            st.progress = ev
        elif kind == P.THROUGHPUT:
            (self.traced_throughputs if ev.get("traced") else self.throughputs).append(float(ev["ips"]))
        elif kind == P.TRACE:
            self.traces.append({**ev, "host": host})
        elif kind == P.REFINE:
            self.refine_rounds.append(ev)
        elif kind == P.REFINED:
            self.refined = ev
        elif kind == P.ACCURACY:
            self.accuracy = ev
        elif kind == P.OUTPUTS:
            self.outputs = ev
        elif kind == P.RUN_END:
            st.ended, st.peak_rss_mb = True, ev.get("peak_rss_mb")
            st.totals = {k: ev.get(k) for k in TOTALS}
        elif kind == P.MB_TIMES:
            base = ev["base"]
            self.mb_times.setdefault((ev["side"], ev["phase"], ev["repeat"]), {})[ev["first"]] = [
                base + t for t in ev["times"]]
        elif kind == P.ERROR:
            st.error = ev

    def pass_times(self, side: str, phase: str = "timed") -> dict[int, list[float]]:
        """Each pass's microbatch times of one side (`enter`, `leave`, `serial`), in order; a pass whose lines
        did not all arrive (a gap) is left out."""
        out = {}
        for (s, ph, repeat), parts in self.mb_times.items():
            if s != side or ph != phase:
                continue
            times: list[float] = []
            for first in sorted(parts):
                if first != len(times):
                    break
                times += parts[first]
            else:
                out[repeat] = times
        return out

    @property
    def _counted(self) -> list[float]:
        # Traced passes count only when every timed pass was traced: better a slower figure than none.
        return self.throughputs or self.traced_throughputs

    @property
    def mean_ips(self) -> float | None:
        return statistics.fmean(self._counted) if self._counted else None

    @property
    def ips_spread(self) -> list[float] | None:
        return [min(self._counted), max(self._counted)] if self._counted else None

    def first_error(self) -> StageState | None:
        failed = [s for s in self.stages.values() if s.error]
        return min(failed, key=lambda s: (s.error or {}).get(P.KEY_TIME, 0)) if failed else None

    @property
    def top1(self) -> float | None:
        return self.accuracy.get("top1") if self.accuracy and self.accuracy.get("applicable") else None


def agreement(a: bytes, b: bytes, classes: int) -> tuple[float, float] | None:
    """Over two float32 logit files of `classes` columns: the share of rows with the same argmax, and the mean
    |a - b|; None when their sizes differ or are not whole rows."""
    if len(a) != len(b) or not a or len(a) % (4 * classes):
        return None
    xa, xb = array("f"), array("f")
    xa.frombytes(a)
    xb.frombytes(b)
    rows = len(xa) // classes
    same = 0
    for r in range(rows):
        ra, rb = xa[r * classes:(r + 1) * classes], xb[r * classes:(r + 1) * classes]
        same += ra.index(max(ra)) == rb.index(max(rb))
    return same / rows, sum(abs(x - y) for x, y in zip(xa, xb, strict=True)) / len(xa)


def max_abs_diff(a: bytes, b: bytes) -> float | None:
    """Largest |a - b| over two float32 logit files, or None when their sizes differ."""
    if len(a) != len(b) or len(a) % 4:
        return None
    xa, xb = array("f"), array("f")
    xa.frombytes(a)
    xb.frombytes(b)
    return max((abs(x - y) for x, y in zip(xa, xb, strict=True)), default=0.0)
