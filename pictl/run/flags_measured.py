"""The flags read from what the run's own processes measured (the waterfall, their CPU wait, the records a host
sent that broke the protocol), apart from the host-sampling flags in `flags.py`."""

from __future__ import annotations

from dataclasses import dataclass

from pictl.run.waterfall import RESIDUAL_LIMIT
from pictl.summary_models import RunSummary

INTERFERENCE_LIMIT = 0.05
"""Other work on the bottleneck's CPU is flagged when it costs more than this share of N speedup points."""
SERIAL_WAIT_LIMIT = 0.10
"""... and on the serial run's when its threads waited for a CPU more than this share of its time."""


@dataclass(frozen=True)
class Flag:
    code: str
    message: str
    invalidates: bool = False
    """The flag makes the result itself untrue, not only worth a look: a speedup no exact pipeline can reach, a
    serial baseline slowed by something else (the speedup reads high) or reused although its host changed. Such a
    result ends SUSPECT (`pictl.verdict`); the other flags only warn: they say why a figure is lower than it
    could be, or what to look at, and the figures stand."""

    def to_json(self) -> dict[str, str | bool]:
        return {"code": self.code, "message": self.message, "invalidates": self.invalidates}


def own_wait(s: RunSummary, window: str) -> tuple[bool, Flag | None]:
    """The run's own processes' CPU wait (schedstat, per process: only other work on their CPUs counts, a
    machine shared by several hosts does not), when the run measured it: (measured, the flag if it is large)."""
    if window == "during_pipeline":
        w = s.waterfall
        term = next((t for t in w.terms if t.term == "interference"), None) if w else None
        if w is None or term is None:
            return False, None
        lost, n = -term.points, w.stages or s.stages * s.replicas
        if lost <= INTERFERENCE_LIMIT * n:
            return True, None
        waited, compute = w.per_image_ms.get("bottleneck_wait_for_cpu"), w.per_image_ms.get("bottleneck_compute")
        if waited is None or not compute:
            return True, None
        host = next((st.host for st in s.per_stage if st.rank == w.bottleneck_rank), None)
        return True, Flag("host_overloaded", f"{host}: during the pipeline, the bottleneck (rank "
                                             f"{w.bottleneck_rank}) waited {waited:.1f} ms per image for a CPU "
                                             f"other work held ({waited / compute:.0%} of its compute), costing "
                                             f"{lost:.2f} of {n} speedup points")
    timing = s.serial_timing
    delay, compute_s = (timing.run_delay_per_image_s, timing.compute_per_image_s) if timing else (None, None)
    if delay is None or not compute_s:
        return False, None
    if delay / compute_s <= SERIAL_WAIT_LIMIT:
        return True, None
    host = s.baseline.host if s.baseline else None
    return True, Flag("host_overloaded", f"{host}: during the serial baseline, its threads waited "
                                         f"{delay * 1000:.1f} ms per image for a CPU other work held "
                                         f"({delay / compute_s:.0%} of its time): the baseline is slow, and the "
                                         "speedup reads high", invalidates=s.stages * s.replicas > 1)


def residual(s: RunSummary) -> list[Flag]:
    w = s.waterfall
    term = next((t for t in w.terms if t.term == "residual"), None) if w else None
    if w is None or term is None:
        return []
    n = w.stages or s.stages * s.replicas
    if abs(term.points) <= RESIDUAL_LIMIT * n:
        return []
    return [Flag("waterfall_residual", f"the speedup waterfall leaves {term.points:+.2f} of {n} "
                                       "speedup points unexplained: the passes varied, or something the model "
                                       "does not see cost time")]


def rejected(s: RunSummary) -> list[Flag]:
    """Records a host sent that broke the protocol were left out: the figures stand on the others."""
    rejected = s.telemetry_rejected
    if rejected is None or not rejected.count:
        return []
    first = rejected.first[0].reason if rejected.first else None
    return [Flag("telemetry_rejected", f"{rejected.count} telemetry record(s) broke the protocol and were left "
                 f"out ({', '.join(f'{n} from {h}' for h, n in rejected.hosts.items())}); the first: {first}")]
