"""Keep the latest picture of every stage, folded from its ranks' records (matched on their types)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from pictl.events import Rejected
from remote.floor.records import COUNTER_NAMES, Record
from remote.floor.run_records import (
    Accuracy,
    Error,
    MbTimes,
    Outputs,
    Progress,
    Recut,
    Refine,
    Refined,
    RunEnd,
    RunStart,
    StageMoved,
    StageReady,
    Throughput,
    Trace,
)

TOTALS = COUNTER_NAMES
"""A rank's totals over the timed passes (`run_end`): where its time went, and what it sent."""


@dataclass
class StageState:
    """What is known about one rank, updated as its records arrive."""

    rank: int
    host: str
    pieces: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    params: int = 0
    load_s: float | None = None
    import_rss_mb: float | None = None
    ready_rss_mb: float | None = None
    peak_rss_mb: float | None = None
    engine: str | None = None
    """The quantised engine the rank's stage ran on (None: fp32)."""
    progress: Progress | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    """The `run_end` counters by name (`TOTALS`): the figures every reader tables."""
    ended: bool = False
    error: Error | None = None
    last_event_t: float = 0.0


class RunTelemetry:
    """Folds a run's events (all ranks and the serial run) into figures."""

    def __init__(self) -> None:
        self.stages: dict[int, StageState] = {}
        self.earlier_stages: list[dict[int, StageState]] = []
        """The ranks of launches that lost a host, oldest first (`new_launch`)."""
        self.throughputs: list[float] = []
        self.traced_throughputs: list[float] = []  # passes a profiler window touched: slower, kept apart
        self.replica_seconds: list[list[float]] = []  # with replicas: each timed pass's every replica's time
        self.traces: list[Trace] = []
        self.accuracy: Accuracy | None = None
        self.outputs: Outputs | None = None
        self.refine_rounds: list[Refine] = []  # `balanced` correcting its split during the run
        self.refined: Refined | None = None  # the split the timed passes run now (refinement's, or a re-cut's)
        self.refinement: Refined | None = None  # refinement's own: which round's split the timed passes began on
        self.recuts: list[Recut] = []  # the watch over the timed passes: each correction, and where the cut moved
        self.pass_counters: dict[tuple[int, int], Progress] = {}
        """(rank, timed pass) -> the rank's counters over that pass (its last `progress` of it)."""
        self.rejected: list[tuple[str, str]] = []  # (host, why): records that broke the protocol, never applied
        self.mb_times: dict[tuple[str, str, int], dict[int, list[float]]] = {}
        """(side, phase, repeat) -> first index -> the pass's microbatch times from there (`mb_times`)."""

    def new_launch(self, first_pass: int) -> None:
        """The run goes on in a new launch from timed pass `first_pass` (a host was lost): the ranks are the new
        launch's (the old ones' states are kept in `earlier_stages`), and what the old launch said of the passes it
        did not finish is dropped; the passes it finished stay, with their throughputs."""
        self.earlier_stages.append(self.stages)
        self.stages = {}
        self.pass_counters = {k: v for k, v in self.pass_counters.items() if k[1] < first_pass}
        self.mb_times = {k: v for k, v in self.mb_times.items() if k[1] != "timed" or k[2] < first_pass}
        del self.throughputs[first_pass:]
        self.traced_throughputs.clear()

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

    def apply(self, host: str, ev: Record) -> None:
        st = self.stage(ev.rank, host)
        st.last_event_t = ev.t
        match ev:
            case RunStart():
                st.import_rss_mb = ev.import_rss_mb
            case StageMoved():  # (before StageReady: it is one)
                st.modules, st.pieces, st.params = ev.modules, ev.pieces or [], ev.params
            case StageReady():
                st.modules, st.pieces = ev.modules, ev.pieces or []
                st.params, st.load_s, st.ready_rss_mb, st.engine = ev.params, ev.load_s, ev.rss_mb, ev.engine
            case Progress():
                st.progress = ev
                if ev.phase == "timed":
                    self.pass_counters[(ev.rank, ev.repeat)] = ev
            case Throughput():
                (self.traced_throughputs if ev.traced else self.throughputs).append(float(ev.ips))
                if ev.replica_seconds and not ev.traced:
                    self.replica_seconds.append([float(t) for t in ev.replica_seconds])
            case Trace():
                self.traces.append(replace(ev, host=host))  # the inventory's name, not the host's own
            case Refine():
                self.refine_rounds.append(ev)
            case Refined():
                self.refined = ev
                if ev.chosen_round is not None:
                    self.refinement = ev
            case Recut():
                self.recuts.append(ev)
            case Accuracy():
                self.accuracy = ev
            case Outputs():
                self.outputs = ev
            case RunEnd():
                st.ended, st.peak_rss_mb = True, ev.peak_rss_mb
                st.totals = {k: getattr(ev, k) for k in TOTALS}
            case MbTimes():
                self.mb_times.setdefault((ev.side, ev.phase, ev.repeat), {})[ev.first] = [
                    ev.base + t for t in ev.times]
            case Error():
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
        return min(failed, key=lambda s: s.error.t if s.error else 0.0) if failed else None

    @property
    def top1(self) -> float | None:
        return self.accuracy.top1 if self.accuracy and self.accuracy.applicable else None
