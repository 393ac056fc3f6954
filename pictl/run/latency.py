"""Latency per image: each microbatch's time from entering stage 0 to leaving the last stage, on the
controller's clock (each host's measured offset taken out), beside the serial run's time per microbatch.

Every image of a microbatch enters and leaves with it, so a microbatch's latency is each of its images'.
"""

from __future__ import annotations

import statistics
from typing import Any

PERCENTILES = (50, 95, 99)


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (1-99) by linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary_ms(seconds: list[float]) -> dict[str, Any] | None:
    """p50, p95, p99 and the mean of `seconds`, in ms; None when there is nothing to summarise."""
    if not seconds:
        return None
    return {**{f"p{q}_ms": round(percentile(seconds, q) * 1000, 3) for q in PERCENTILES},
            "mean_ms": round(sum(seconds) / len(seconds) * 1000, 3), "microbatches": len(seconds)}


def pipeline_latencies(enter: dict[int, list[float]], leave: dict[int, list[float]],
                       enter_offset_s: float = 0.0, leave_offset_s: float = 0.0) -> list[float]:
    """Every microbatch's latency over the passes both sides reported whole: leaving the last stage minus
    entering the first, each host's clock brought to the controller's (offset = host clock - ours)."""
    out: list[float] = []
    for repeat in sorted(set(enter) & set(leave)):
        ins, outs = enter[repeat], leave[repeat]
        if len(ins) != len(outs):
            continue  # a pass one side did not report whole: no pairing is safe
        out += [(b - leave_offset_s) - (a - enter_offset_s) for a, b in zip(ins, outs, strict=True)]
    return out


def serial_latencies(durations: dict[int, list[float]]) -> list[float]:
    return [d for repeat in sorted(durations) for d in durations[repeat]]
