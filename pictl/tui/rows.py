"""What the dashboard's state is made of, row by row (no Textual here): a host's row in the hosts table, a
rank's view on the stage panels, and how a job ended."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pictl import errors as E

SPARK_POINTS = 60


Outcome = Literal["done", "stopped", "failed"]


@dataclass(frozen=True)
class Ending:
    """How a job ended, decided where it ended (from the exception's type, never its text): its outcome, and
    the line to show when it did not end well."""

    outcome: Outcome
    error: str | None = None

    @classmethod
    def of(cls, exc: BaseException | None = None, *, failed: str | None = None) -> Ending:
        """A job that raised `exc` (an interrupt is a stop), or one that finished (`failed`: but with failures)."""
        if exc is None:
            return cls("failed", failed) if failed else cls("done")
        return cls("stopped" if isinstance(exc, E.Interrupted) else "failed", str(exc))


@dataclass
class HostRow:
    name: str
    up: bool | None = None  # None: not sampled yet
    activity: str = "idle"
    ranks: list[int] = field(default_factory=list)
    cpu_pct: float | None = None
    busy_cores: float | None = None
    """Cores something keeps busy (of `cpus`) and the run queue: the load that `interference` advice names."""
    cpus: int | None = None
    runnable: int | None = None
    cpu_wait: float | None = None
    mem_used_mb: int | None = None
    mem_total_mb: int | None = None
    temp_c: float | None = None
    throttled: str | None = None
    power_w: float | None = None
    """The host's power now (a Pi 5's PMIC, x86 RAPL), None where it has no meter pictl reads."""
    last_event: float | None = None
    error: str | None = None


@dataclass
class StageView:
    rank: int
    host: str
    label: str = ""
    """What the panel calls the rank: "stage 2", or with replicas "replica 1 stage 0"."""
    modules: list[str] = field(default_factory=list)
    ips: deque[float] = field(default_factory=lambda: deque(maxlen=SPARK_POINTS))
    phase: str = "waiting"
    repeat: int = 0
    microbatches: int = 0
    microbatches_total: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    send_s: float = 0.0
    bytes_per_s: float = 0.0
    error: str | None = None
    wire_ratio: float | None = None
    """Bytes on the wire over their fp32 size (`--wire`), from the stage's progress."""
    pass_ips: float | None = None
    """img/s over the pass so far: what the stage sustains, comparable with the pipeline's figure (the
    sparkline's last point is one interval's rate, and drops to 0 when the pass ends)."""
    _last: tuple[float, int, int] | None = None  # (time, microbatches, bytes) of the previous progress event
    _pass_start: tuple[float, int] | None = None  # (time, microbatches) at the pass's first progress event
