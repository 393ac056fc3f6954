"""What one run writes down as it goes, apart from what its phases return: its record (pending until the
plan opens it), the start-up timeline each phase marks, the ranks' telemetry folded as it arrives, the
measured windows on the controller's clock, the host samples, the trace grabs and the pipeline's segments.

All of it outlives a failure: a phase that fails part-way has still written its lines, its window and its
marks, and the failed run's summary is made from them. The session owns the logbook and hands each phase
the part it writes in; no phase returns through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pictl.cluster.monitor import HostSample
from pictl.records.runs import PendingRecord
from pictl.run.segments import HostLoss, Segments
from pictl.run.telemetry import RunTelemetry
from pictl.run.timeline import StartupTimeline


@dataclass
class Logbook:
    record: PendingRecord
    timeline: StartupTimeline = field(default_factory=StartupTimeline)
    telemetry: RunTelemetry = field(default_factory=RunTelemetry)
    """The pipeline's ranks, folded as they report (the serial run's own figures are its baseline's; its
    rejected lines are counted here too)."""
    windows: dict[str, list[float]] = field(default_factory=dict)
    """"baseline" / "pipeline" -> [start, end] on the controller's clock, filled as each is measured."""
    samples: list[HostSample] = field(default_factory=list)
    """The run's hosts, sampled while it runs (the session's monitor): their records and flags."""
    traces: list[dict[str, Any]] = field(default_factory=list)
    """Every trace grab of the run, as its summary lists them."""
    segments: Segments = field(default_factory=Segments)
    """The pipeline's segments: each split on its hosts over a window of timed passes (`run/segments.py`)."""
    losses: list[HostLoss] = field(default_factory=list)
    """The hosts the run lost and went on without (`run/continuation.py`'s `HostLoss`), in order."""
