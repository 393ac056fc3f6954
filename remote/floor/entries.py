"""The programs the controller may start on a host: one table, named once.

The controller starts these by module name (`python -m NAME` over SSH, or handed to the warm process); the
warm server accepts a job only if it names one of `JOBS` (torchrun's agent included) and imports
`PRELOADED` before its first job. A new entry point is added here and nowhere else. Torch-free: the
controller imports it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    module: str
    warm: bool
    """May run inside the warm process (a job that imports torch); otherwise a host helper started by the
    host's own Python (stdlib only, before or beside the venv)."""
    preload: bool = False
    """Imported by the warm process before its first job (the jobs every run starts)."""


PIPELINE = Entry("remote.runtime.pipeline", warm=True, preload=True)
SERIAL = Entry("remote.runtime.serial", warm=True, preload=True)
PLAN = Entry("remote.runtime.plan", warm=True, preload=True)
COSTS = Entry("remote.profiling.costs", warm=True, preload=True)
LINKTEST = Entry("remote.profiling.linktest", warm=True, preload=True)
TRAIN = Entry("remote.training.train", warm=True, preload=True)
PRUNE = Entry("remote.pruning.prune", warm=True)
"""Not preloaded: torch-pruning is left to the jobs that prune."""
GENERATE = Entry("remote.generation.generate", warm=True)
"""Not preloaded: transformers (a 2-3 s import) is left to the jobs that generate."""
TORCHRUN = Entry("torch.distributed.run", warm=True, preload=True)
SUPERVISE = Entry("remote.host.supervise", warm=False)
CLEANUP = Entry("remote.host.cleanup", warm=False)
WARM_CLIENT = Entry("remote.host.warmclient", warm=False)
WARM_ROOT = Entry("remote.host.warmroot", warm=False)

ALL = (PIPELINE, SERIAL, PLAN, COSTS, LINKTEST, TRAIN, PRUNE, GENERATE, TORCHRUN, SUPERVISE, CLEANUP, WARM_CLIENT,
       WARM_ROOT)
JOBS = tuple(e.module for e in ALL if e.warm)
"""What a warm job may be."""
PRELOADED = tuple(e.module for e in ALL if e.preload)
