"""The flags read from what the run's own processes measured (the waterfall, their CPU wait, the records a host
sent that broke the protocol), apart from the host-sampling flags in `flags.py`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pictl.run.waterfall import RESIDUAL_LIMIT

INTERFERENCE_LIMIT = 0.05
"""Other work on the bottleneck's CPU is flagged when it costs more than this share of N speedup points."""
SERIAL_WAIT_LIMIT = 0.10
"""... and on the serial run's when its threads waited for a CPU more than this share of its time."""


@dataclass(frozen=True)
class Flag:
    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def own_wait(s: dict[str, Any], window: str) -> tuple[bool, Flag | None]:
    """The run's own processes' CPU wait (schedstat, per process: only other work on their CPUs counts, a
    machine shared by several hosts does not), when the run measured it: (measured, the flag if it is large)."""
    if window == "during_pipeline":
        w: dict[str, Any] = s.get("waterfall") or {}
        term = next((t for t in w.get("terms", []) if t["term"] == "interference"), None)
        if term is None:
            return False, None
        lost, n = -term["points"], w["stages"]
        if lost <= INTERFERENCE_LIMIT * n:
            return True, None
        ms = w["per_image_ms"]
        host = next((st.get("host") for st in s.get("per_stage") or [] if st.get("rank") == w["bottleneck_rank"]),
                    None)
        waited, share = ms["bottleneck_wait_for_cpu"], ms["bottleneck_wait_for_cpu"] / ms["bottleneck_compute"]
        return True, Flag("host_overloaded", f"{host}: during the pipeline, the bottleneck (rank "
                                             f"{w['bottleneck_rank']}) waited {waited:.1f} ms per image for a CPU "
                                             f"other work held ({share:.0%} of its compute), costing {lost:.2f} of "
                                             f"{n} speedup points")
    timing = s.get("serial_timing") or {}
    delay, compute = timing.get("run_delay_per_image_s"), timing.get("compute_per_image_s")
    if delay is None or not compute:
        return False, None
    if delay / compute <= SERIAL_WAIT_LIMIT:
        return True, None
    host = (s.get("baseline") or {}).get("host")
    return True, Flag("host_overloaded", f"{host}: during the serial baseline, its threads waited "
                                         f"{delay * 1000:.1f} ms per image for a CPU other work held "
                                         f"({delay / compute:.0%} of its time): the baseline is slow, and the "
                                         "speedup reads high")


def residual(s: dict[str, Any]) -> list[Flag]:
    w: dict[str, Any] = s.get("waterfall") or {}
    term = next((t for t in w.get("terms", []) if t["term"] == "residual"), None)
    if term is None or abs(term["points"]) <= RESIDUAL_LIMIT * w["stages"]:
        return []
    return [Flag("waterfall_residual", f"the speedup waterfall leaves {term['points']:+.2f} of {w['stages']} "
                                       "speedup points unexplained: the passes varied, or something the model "
                                       "does not see cost time")]


def rejected(s: dict[str, Any]) -> list[Flag]:
    """Records a host sent that broke the protocol were left out: the figures stand on the others."""
    rejected = s.get("telemetry_rejected")
    if not isinstance(rejected, dict) or not rejected.get("count"):
        return []
    hosts = rejected.get("hosts") or {}
    first = (rejected.get("first") or [{}])[0]
    return [Flag("telemetry_rejected", f"{rejected['count']} telemetry record(s) broke the protocol and were left "
                 f"out ({', '.join(f'{n} from {h}' for h, n in hosts.items())}); the first: {first.get('reason')}")]
