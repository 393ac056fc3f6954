"""Profile the same window of pipeline steps on every rank, while the run goes on.

A step is one microbatch of one pass, numbered across passes (`pass * n_mb + i`),
so every rank means the same microbatch by the same number. Windows are aligned
by step, not by wall clock: each rank profiles steps [start, start + steps) as
they pass through it.

Two ways to ask:
- planned (`run --trace-steps K`): one extra untimed pass after the timed ones,
  with the window in its middle; every rank computes the same window from the spec.
- on request (the dashboard's `t`, `pictl traces`): the controller writes
  `trace-request.json` into host 0's run directory. Rank 0 polls it between steps
  (a stat), chooses start = its next step, and publishes the window in the
  rendezvous store before computing that step. A later rank cannot reach that
  step before rank 0 has sent it its input, so it always sees the window in time.

Each rank exports a chrome trace to `traces/<id>/rank<r>.json.gz` (a temporary
name, then renamed) after the pass in which its window ended, outside the timed
span of any pass, and emits a `trace` event. Passes the window touched are
reported as traced, so their throughput can be kept out of the figures.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.run_records import Trace

STORE_KEY = "pictl/trace"
STORE_COUNT = "pictl/traces"
# Rank 0 starts a requested window LEAD steps ahead and the other ranks look at the store
# every LEAD steps: a rank posting step x has seen rank 0 pass step x - 1, so it cannot miss
# a window published at step s and starting at s + LEAD. Looking every step would cost a
# store round trip per microbatch; every LEAD steps it is a quarter of that.
LEAD = 4


@dataclass
class Window:
    trace_id: str
    start: int
    steps: int

    @property
    def end(self) -> int:
        return self.start + self.steps


def rendezvous_store() -> dist.Store | None:
    """A client of the store torchrun's agent serves at MASTER_ADDR:MASTER_PORT (None outside torchrun)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    return dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=30))


class Tracer:
    """Decides, starts, stops and exports this rank's profiling window."""

    def __init__(self, rank: int, emitter: Emitter, run_dir: Path, store: dist.Store | None,
                 planned: Window | None = None) -> None:
        self.rank = rank
        self.emitter = emitter
        self.run_dir = run_dir
        self.store = store
        self.planned = planned
        self.window: Window | None = None
        self._prof: profile | None = None
        self._done: profile | None = None  # stopped, not yet exported
        self._first_step = 0
        self._served: set[str] = set()
        self._seen_requests = 0
        self._pass_traced = False
        self._held: list[dist.Work] = []

    @property
    def active(self) -> bool:
        return self._prof is not None

    def will_trace(self, step: int) -> bool:
        """Whether `step` falls in a window known now (the planned one, or one requested and not yet served): a
        receive for it is not posted ahead, so the window records the step's whole exchange."""
        return any(w is not None and w.trace_id not in self._served and w.start <= step < w.end
                   for w in (self.window, self.planned))

    def _idle(self) -> bool:
        return self._prof is None and self._done is None and (self.window is None
                                                              or self.window.trace_id in self._served)

    def _poll_request(self, step: int) -> Window | None:
        if self.rank == 0:
            request = self.run_dir / P.TRACE_REQUEST_FILE
            if not request.exists():
                return None
            try:
                wanted = json.loads(request.read_text())
                window = Window(str(wanted["id"]), step + LEAD, max(1, int(wanted["steps"])))
            except (OSError, ValueError, KeyError, TypeError):
                window = None  # malformed: the controller writes requests atomically, so this is not a race
            request.unlink(missing_ok=True)
            if window is not None and self.store is not None:
                self.store.set(STORE_KEY, json.dumps(window.__dict__))
                self.store.add(STORE_COUNT, 1)  # a round trip: the window is in the store before step + 1
            return window
        if self.store is None or step % LEAD:
            return None
        count = self.store.add(STORE_COUNT, 0)
        if count == self._seen_requests:
            return None
        self._seen_requests = count
        return Window(**json.loads(self.store.get(STORE_KEY)))

    # -- hooks called by the stage ---------------------------------------------------------------

    def before_step(self, step: int) -> None:
        """Called when the stage posts the receive for `step` (before its wait and compute)."""
        if self._idle():
            planned = self.planned
            if planned is not None and planned.trace_id not in self._served and step >= planned.start:
                self.window = planned
            elif (fresh := self._poll_request(step)) is not None:
                self.window = fresh
        w = self.window
        if w is None or w.trace_id in self._served:
            return
        if self._prof is None and self._done is None and w.start <= step < w.end:
            self._prof = profile(activities=[ProfilerActivity.CPU])
            self._prof.start()
            self._first_step = step
        elif self._prof is not None and step >= w.end:
            self._stop()
        if self._prof is not None:
            self._pass_traced = True

    def hold(self, works: list[dist.Work]) -> None:
        """Sends posted while profiling: waited before the profiler stops (see `_stop`)."""
        self._held += works

    def wait_held(self) -> None:
        held, self._held = self._held, []
        for work in held:
            work.wait()

    def _stop(self) -> None:
        assert self._prof is not None
        # Stopping the profiler while a send it saw start is still in flight makes the
        # export crash (SIGSEGV or bad_alloc in kineto, torch 2.14, seen on the first stage).
        self.wait_held()
        self._prof.stop()
        self._done, self._prof = self._prof, None

    def end_of_pass(self, next_step: int, final: bool = False) -> bool:
        """After a pass, outside its timed span: export a finished window. True if the pass was traced."""
        traced = self._pass_traced
        self.wait_held()  # the schedule waits for its own sends at the end of a pass; these are ours
        if self._prof is not None and (final or next_step >= self.window.end):
            self._stop()
        if self._done is not None:
            self._export(next_step)
        elif final:
            # The run ended before this rank reached a window: say so rather than go quiet.
            for w in (self.window, self.planned):
                if w is not None and w.trace_id not in self._served:
                    self._served.add(w.trace_id)
                    self.emitter.emit(Trace(stage=self.rank, id=w.trace_id, file=None, start_step=w.start, steps=0,
                                            message=f"the run ended at step {next_step} before the window began"))
        self._pass_traced = self._prof is not None
        return traced

    def _export(self, next_step: int) -> None:
        w = self.window
        assert w is not None and self._done is not None
        out_dir = self.run_dir / P.TRACES_DIR / w.trace_id
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / P.trace_file(self.rank)
        tmp = out_dir / f".tmp-{final.name}"  # export_chrome_trace compresses by the .gz suffix
        t0 = time.perf_counter()
        self._done.export_chrome_trace(str(tmp))
        os.replace(tmp, final)
        self._done = None
        self._served.add(w.trace_id)
        self.emitter.emit(Trace(stage=self.rank, id=w.trace_id, file=str(final.relative_to(self.run_dir)),
                                start_step=self._first_step, steps=min(w.end, next_step) - self._first_step,
                                export_s=round(time.perf_counter() - t0, 3)))


def planned_window(trace_steps: int, passes_before: int, n_mb: int) -> Window | None:
    """`run --trace-steps K`: K steps in the middle of the extra pass after the timed ones."""
    if trace_steps <= 0:
        return None
    steps = min(trace_steps, n_mb)
    return Window("run", passes_before * n_mb + (n_mb - steps) // 2, steps)
