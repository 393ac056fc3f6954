"""What the phases of one run share, and only that: its identity and options, the one sink every event goes
to, and the caches (baselines, plans, cost profiles, links; and the code tree, read and hashed once).

The phases (`hosts`, `placement`, `split`, `staging`, `serial`, `pipeline`, `compare`, `summarize`) each
take this and the previous phases' results and return their own; the session (`session.py`) orders them.
What the run writes down as it goes (its record, the start-up timeline, the ranks' folded telemetry, the
measured windows, the host samples) is the session's `Logbook` (`logbook.py`), handed to the phases that
write in it. The hosts themselves (connections, leases, processes) are the job's
(`pictl.cluster.jobs.HostJob`), which `open_hosts` returns.
"""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from pictl.cluster.artifacts import Artifact
from pictl.cluster.push import local_tree, manifest_digest
from pictl.events import EventSink
from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from pictl.planning.specs import plans_cache
from pictl.records.cache import JsonCache
from pictl.run.baselines import Baseline, BaselineCache


@dataclass(frozen=True)
class Caches:
    """What a run may reuse from earlier runs, each under one root (the baselines' parent)."""

    baselines: BaselineCache
    plans: JsonCache
    costs: JsonCache
    links: JsonCache

    @property
    def root(self) -> Path:
        return self.baselines.root.parent

    @classmethod
    def beside(cls, baselines: BaselineCache) -> Caches:
        root = baselines.root.parent
        return cls(baselines, plans_cache(root), JsonCache(root / "costs"), JsonCache(root / "links"))


@dataclass(frozen=True)
class Handed:
    """A serial baseline another run of the same comparison measured (its reference: `pictl sweep` measures one
    per round), handed to this run to divide by and to check its outputs against, instead of measuring or
    reusing one of its own. Used only where it stands for this run's serial run: the same model, data,
    protocol, chunk, threads, numerics, packages and code (`serial.baseline_fields`), on whichever host."""

    baseline: Baseline
    host: str
    """Where the reference was measured."""
    fields: dict[str, Any]
    """Its `baseline_fields`: what this run's must equal, the host aside."""
    run_id: str


@dataclass(frozen=True)
class RunContext:
    cluster: Cluster
    options: RunOptions
    run_id: str
    sink: EventSink
    runs_root: Path
    caches: Caches
    artifact: Artifact | None = None
    profile: str | None = None
    """The run preset the options came from (None: none named)."""
    wait_for_hosts: bool = False
    """A host another run holds: wait for it (True) or refuse at once (HostBusy)."""
    reuse_baseline: bool = True
    handed: Handed | None = None
    """The comparison's reference serial run, when this run is one of a comparison's (None: its own)."""
    started: float = field(default_factory=time.time)
    pushed: InitVar[dict[str, bytes] | None] = None
    """The code tree a sweep or tune holding the hosts pushed (None: this run reads and pushes its own)."""
    # Read and hashed once per run: what is pushed and what keys the caches are the same tree.
    tree: dict[str, bytes] = field(init=False)
    code: str = field(init=False)

    def __post_init__(self, pushed: dict[str, bytes] | None) -> None:
        tree = pushed if pushed is not None else local_tree(self.options.model)
        object.__setattr__(self, "tree", tree)  # (frozen: set once, here)
        object.__setattr__(self, "code", manifest_digest(tree))
