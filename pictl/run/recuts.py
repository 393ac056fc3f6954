"""The re-cuts of a run, for its summary: each decision of the watch over the timed passes (`remote.floor.recut`),
with the throughput of the passes before and after it, so that a re-cut is judged by what it measured."""

from __future__ import annotations

from typing import Any

from pictl.run.telemetry import RunTelemetry
from pictl.run.waterfall import Settled
from remote.floor.records import COUNTER_NAMES


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def recut_summary(tel: RunTelemetry) -> list[dict[str, Any]]:
    """One entry per decision: when (after which timed pass), why, the split before and after, what was
    measured, expected and predicted, and the mean img/s of the timed passes on each side of it (from the
    previous moved cut to the next one)."""
    passes = tel.throughputs
    moved_at = [r.after_pass for r in tel.recuts if r.moved]
    out = []
    for r in tel.recuts:
        before_start = max([a + 1 for a in moved_at if a < r.after_pass], default=0)
        after_end = min([a + 1 for a in moved_at if a > r.after_pass], default=len(passes))
        out.append({"after_pass": r.after_pass, "reason": r.reason, "moved": r.moved,
                    "split_points": list(r.split_points), "next_split": list(r.next_split),
                    "measured_ms": list(r.measured_ms), "expected_ms": list(r.expected_ms),
                    "predicted_ms": list(r.predicted_ms), "next_predicted_ms": list(r.next_predicted_ms),
                    "factors": list(r.factors),
                    "ips_before": _mean(passes[before_start:r.after_pass + 1]),
                    "ips_after": _mean(passes[r.after_pass + 1:after_end]) if r.moved else None,
                    "measured_after_ms": _compute_ms(tel, r.after_pass + 2) if r.moved else None})
    return out


def _compute_ms(tel: RunTelemetry, timed_pass: int) -> list[float] | None:
    """Each stage's compute per microbatch in one timed pass (the first warm one after a re-cut)."""
    ranks = sorted({rank for rank, _ in tel.pass_counters})
    found = [tel.pass_counters.get((rank, timed_pass)) for rank in ranks]
    if not found or any(c is None or not c.microbatches for c in found):
        return None
    return [round(c.compute_s / c.microbatches * 1000, 3) for c in found if c is not None]


def settled(tel: RunTelemetry, stages: int, repeats: int, serial_ips: float | None, *, since: int = 0,
            ranks_before: int | None = None) -> Settled | None:
    """The passes the run's last split ran, for the waterfall: after its last re-cut and that re-cut's cold first
    pass, and from `since` (the first pass of the segment that went on after a host was lost, whose ranks were
    `ranks_before`); each rank's counters summed over them. None when the run neither re-cut nor lost a host, or
    those figures are not all here."""
    moved = [r.after_pass for r in tel.recuts if r.moved and r.after_pass >= since]
    if not (moved or since) or not serial_ips:
        return None
    first = max(since, moved[-1] + 2) if moved else since
    passes = range(first, repeats)
    ips = tel.throughputs[first:repeats]
    if not passes or len(ips) != len(passes) or any((r, p) not in tel.pass_counters
                                                    for r in range(stages) for p in passes):
        return None
    per_rank = []
    for r in range(stages):
        totals: dict[str, Any] = {}
        for p in passes:
            for name in COUNTER_NAMES:
                value = getattr(tel.pass_counters[(r, p)], name)
                if value is not None:
                    totals[name] = totals.get(name, 0) + value
        per_rank.append(totals)
    return Settled(per_rank, len(passes), sum(ips) / len(ips) / serial_ips, first,
                   ranks_before=ranks_before if since else None)
