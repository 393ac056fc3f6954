"""Where the time from `pictl run` to the first image goes.

Every mark is taken on the controller's clock when the event arrives, so the
parts add up to the total exactly. The one split the controller cannot see, the
rendezvous inside the interval from "every worker started" to "every stage
ready", comes from the workers: the last rank to arrive measures the handshake
alone (the others also wait for it), and the rest of that interval is model load.

It also keeps which phases' processes were served by the hosts' warm processes (forked: no torch import) and
how many interpreters imported torch: each process started cold, and each warm process the run had to start.
"""

from __future__ import annotations

import time
from typing import Any

from pictl.inventory import Host
from remote.floor.records import Record
from remote.floor.run_records import FirstOutput, RunStart, StageMoved, StageReady

# (part, the mark that ends it); each part starts where the previous one ended.
PARTS = (("connect", "connected"), ("push", "pushed"), ("prepare", "prepared"), ("plan", "planned"),
         ("baseline", "baselined"), ("launch", "workers_started"), ("rendezvous_and_load", "stages_ready"),
         ("first_image", "first_image"))


class StartupTimeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.started_at = time.time()
        self.marks: dict[str, float] = {}
        self._rendezvous: list[float] = []
        self.served_warm: dict[str, bool] = {}
        """Per phase that started processes (profile, plan, baseline, launch): were they all forked warm?"""
        self.cold_imports = 0
        self.warm_started: int | None = None
        """Warm processes started during the run (each imported torch once); None: not asked."""
        self._phase: str | None = None

    def launched(self, phase: str, processes: dict[Host, int]) -> None:
        """`processes[host]` interpreters of `phase` started on each host, warm or cold as the host is."""
        warm = all(h.warm for h in processes)
        self.served_warm[phase] = self.served_warm.get(phase, True) and warm
        self.cold_imports += sum(n for h, n in processes.items() if not h.warm)
        self._phase = phase

    def ran_cold(self, host: str) -> None:
        """A job of the latest phase on `host` ran cold although the host is warm (its warm process could not
        serve it: the client said so on its stderr): that phase was not served warm, and torch was imported."""
        if self._phase is not None:
            self.served_warm[self._phase] = False
        self.cold_imports += 1

    def imports(self) -> dict[str, Any]:
        """How the run's processes started: per phase warm or not, and how many interpreters imported torch."""
        return {"served_warm": dict(self.served_warm), "cold_processes": self.cold_imports,
                "warm_processes_started": self.warm_started,
                "torch_imports": self.cold_imports + (self.warm_started or 0)}

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    def observe(self, record: Record) -> None:
        """A pipeline rank's record: the last start and the last ready count, the first output counts."""
        if isinstance(record, RunStart) and "stages_ready" not in self.marks:
            self.mark("workers_started")
        elif isinstance(record, StageReady) and not isinstance(record, StageMoved):
            self.mark("stages_ready")
            if record.rendezvous_s is not None:
                self._rendezvous.append(float(record.rendezvous_s))
        elif isinstance(record, FirstOutput) and "first_image" not in self.marks:
            self.mark("first_image")

    def summary(self) -> dict[str, Any] | None:
        """Seconds per part and in total, or None when the run never produced an image."""
        if "first_image" not in self.marks:
            return None
        out: dict[str, float] = {}
        previous = self.start
        for part, mark in PARTS:
            at = self.marks.get(mark, previous)  # a skipped step (cached baseline) takes no time
            out[f"{part}_s"] = round(at - previous, 3)
            previous = at
        both = out.pop("rendezvous_and_load_s")
        rendezvous = min(min(self._rendezvous, default=0.0), both)
        out = {**{k: v for k, v in out.items() if k != "first_image_s"}, "rendezvous_s": round(rendezvous, 3),
               "model_load_s": round(both - rendezvous, 3), "first_image_s": out["first_image_s"]}
        out["total_s"] = round(self.marks["first_image"] - self.start, 3)
        return {**out, **self.imports()}
