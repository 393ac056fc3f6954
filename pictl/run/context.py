"""What the phases of one run share: its options and identity, the caches, the one sink every event goes
to, the record (once it exists; lines that come before it wait here) and the start-up timeline each phase
marks.

The phases (`hosts`, `placement`, `split`, `staging`, `serial`, `pipeline`, `compare`, `summarize`) each
take this and the previous phases' results and return their own; the session (`session.py`) orders them.
What the run measures as it goes (the ranks' folded telemetry, the measured windows, the host samples) is
the session's `Reached`, handed to the phases that fill it.
The hosts themselves (connections, leases, processes) are the job's (`pictl.cluster.jobs.HostJob`), which
`open_hosts` returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pictl.cluster.artifacts import Artifact
from pictl.cluster.push import local_tree, manifest_digest
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from pictl.records.cache import JsonCache
from pictl.records.runs import RunRecord
from pictl.run.baselines import BaselineCache
from pictl.run.timeline import StartupTimeline


@dataclass
class RunContext:
    cluster: Cluster
    options: RunOptions
    run_id: str
    sink: EventSink
    runs_root: Path
    baselines: BaselineCache
    artifact: Artifact | None = None
    profile: str | None = None
    wait_for_hosts: bool = False
    """A host another run holds: wait for it (True) or refuse at once (HostBusy)."""
    reuse_baseline: bool = True
    started: float = field(default_factory=time.time)
    timeline: StartupTimeline = field(default_factory=StartupTimeline)
    record: RunRecord | None = None
    _early: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Read and hashed once per run: what is pushed and what keys the caches are the same tree.
        self.tree: dict[str, bytes] = local_tree()
        self.code: str = manifest_digest(self.tree)

    # -- events and the record ----------------------------------------------------------------------

    def phase(self, name: str, message: str) -> None:
        self.sink(Phase(name, message))

    def event(self, source: str, line: str) -> None:
        """Keep a telemetry line (before the record exists, until it does: the plan may come first)."""
        self._keep("event", source, line)

    def log(self, source: str, line: str) -> None:
        self._keep("log", source, line)

    def _keep(self, kind: str, source: str, line: str) -> None:
        if self.record is None:
            self._early.append((kind, source, line))
        elif kind == "event":
            self.record.event(source, line)
        else:
            self.record.log(source, line)

    def open_record(self, config: dict[str, Any]) -> RunRecord:
        """The spec passed its plan: from here on the run exists, and ends with a summary."""
        self.record = RunRecord(self.runs_root, self.run_id)
        self.record.write_config(config)
        early, self._early = self._early, []
        for kind, source, line in early:
            self._keep(kind, source, line)
        return self.record

    # -- caches ---------------------------------------------------------------------------------------

    @property
    def cache_root(self) -> Path:
        return self.baselines.root.parent

    def cache(self, kind: str) -> JsonCache:
        """`plans`, `costs` or `links`, beside the baselines."""
        return JsonCache(self.cache_root / kind)
