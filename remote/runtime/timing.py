"""Where a stage's time goes, measured where it is spent: compute, posting and waiting on the wire, draining
sends, the CPU its threads waited for (another process's load), and each microbatch's wall time on entering
the first stage and leaving the last (latency per image).

`TimedStage` counts compute, input wait and bytes (ScheduleGPipe calls, per microbatch: get_fwd_recv_ops ->
post and wait on the receives -> forward_one_chunk -> get_fwd_send_ops -> post the sends; at the end of the
pass it waits for every send). `count_p2p` wraps the schedule's two p2p helpers so the time posting
operations and waiting on them is counted as it happens, each against the stage that asked for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as _schedules
from torch.profiler import record_function

from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.run_records import MbTimes
from remote.host.cpuwait import Span
from remote.runtime.tracing import Tracer
from remote.toolkit.measure import StageCounters

MB_TIMES_PER_LINE = 150
"""Times per `mb_times` line: a line stays under PIPE_BUF (ranks on one host share torchrun's pipe)."""


class Clock:
    """Wall time from the monotonic clock: one anchor, so a clock step (NTP) never tears a pass apart."""

    def __init__(self) -> None:
        self.wall0, self.perf0 = time.time(), time.perf_counter()

    def wall(self, perf: float) -> float:
        return self.wall0 + (perf - self.perf0)


class TimedStage(PipelineStage):
    """A PipelineStage that counts compute time, input wait, wire time and bytes sent."""

    def __init__(self, *args, on_chunk=None, tracer: Tracer | None = None, clock: Clock | None = None,  # noqa: ANN001, ANN002
                 **kwargs) -> None:  # noqa: ANN003
        super().__init__(*args, **kwargs)
        self.counters = StageCounters()
        self.compute_times: list[float] = []  # this pass's, per microbatch (refinement takes their median)
        self.enter_times: list[float] = []  # this pass's wall time as each microbatch's compute began
        self.leave_times: list[float] = []  # ... and ended
        self._on_chunk = on_chunk
        self._recv_posted = 0.0
        self.chunk = 0  # the microbatch whose receives are posted or awaited now
        self.tracer = tracer
        self.clock = clock or Clock()
        self.first_step = 0  # the global number of this pass's first microbatch
        self.slow_factor = 1.0
        """Fault injection (tests, `RunSpec.slowdown`): every microbatch takes this many times its compute."""
        self._prefetched: dict[int, dict[int, list[dist.Work]]] = {}

    def new_pass(self) -> None:
        self.counters, self.compute_times, self.enter_times, self.leave_times = StageCounters(), [], [], []

    def get_fwd_recv_ops(self, fwd_chunk_id: int):  # noqa: ANN201
        if self.tracer is not None:
            self.tracer.before_step(self.first_step + fwd_chunk_id)
        self._recv_posted = time.perf_counter()  # the stage is ready for this microbatch's input from here on
        if self.is_first:
            self.chunk = fwd_chunk_id
            return super().get_fwd_recv_ops(fwd_chunk_id)
        # Receives run one microbatch ahead: gloo moves a send's bytes only once the matching receive is posted,
        # so a receive posted when the stage asks for its input puts the whole transfer (and the sender's wake-up)
        # on the stage's critical path, every microbatch. Posted a microbatch early, the next input crosses the
        # link while this one computes. Each microbatch has a receive buffer of its own (the stage allocates them
        # once), so two in flight never share memory. Not into or inside a trace window: the profiler must not
        # stop with an operation it saw start still in flight (`Tracer._stop`), and a traced step's receive must
        # be in its trace, so a traced step receives as the schedule does. (A window another rank requested is
        # known here a few steps ahead, `tracing.LEAD`; one learnt later may miss its first step's receive.)
        works = self._prefetched.pop(fwd_chunk_id, None)
        if works is None:
            works = self._post_recv(fwd_chunk_id)
        if fwd_chunk_id + 1 in self.args_recv_info and not self._traced(self.first_step + fwd_chunk_id + 1):
            self._prefetched[fwd_chunk_id + 1] = self._post_recv(fwd_chunk_id + 1)
        self.chunk = fwd_chunk_id
        for peer_works in works.values():
            _schedules._wait_batch_p2p(peer_works)  # (looked up at call time: `count_p2p` counts the wait)
        return []

    def _traced(self, step: int) -> bool:
        return self.tracer is not None and (self.tracer.active or self.tracer.will_trace(step))

    def _post_recv(self, fwd_chunk_id: int) -> dict[int, list[dist.Work]]:
        return _schedules._sorted_batch_p2p(super().get_fwd_recv_ops(fwd_chunk_id), desc="fwd_recv")

    def get_fwd_send_ops(self, fwd_chunk_id: int):  # noqa: ANN201
        ops = super().get_fwd_send_ops(fwd_chunk_id)
        if not ops or self.tracer is None or not self.tracer.active:
            return ops
        # While profiling, post the sends here and keep their handles, so the window can end
        # with none in flight; they stay asynchronous, as the schedule would have posted them.
        self.tracer.hold(dist.batch_isend_irecv(ops))
        return []

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):  # noqa: ANN001, ANN201
        start = time.perf_counter()
        if not self.is_first:
            self.counters.wait_s += start - self._recv_posted
        if self.tracer is not None and self.tracer.active:
            with record_function(f"{P.TRACE_COMPUTE_RANGE} {self.first_step + fwd_chunk_id}"):
                out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        else:
            out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        if self.slow_factor > 1.0:  # as if the host had slowed down (a throttled clock, a neighbour's load)
            time.sleep((time.perf_counter() - start) * (self.slow_factor - 1.0))
        end = time.perf_counter()
        elapsed = end - start
        self.enter_times.append(self.clock.wall(start))
        self.leave_times.append(self.clock.wall(end))
        codec = self.submod.codec.take() if self.submod.codec is not None else None
        # Refinement sees the stage's whole busy time (so `balanced` learns what encoding costs from the run);
        # the compute figure reported leaves the wire's formats out (they have counters of their own).
        self.compute_times.append(elapsed)
        if codec is not None:
            self.counters.compress_s += codec.compress_s
            self.counters.decompress_s += codec.decompress_s
            self.counters.raw_bytes += codec.raw_bytes
            elapsed -= codec.compress_s + codec.decompress_s
        self.counters.compute_s += elapsed
        self.counters.microbatches += 1
        if not self.is_last:
            outs = out if isinstance(out, tuple) else (out,)
            sent = sum(t.numel() * t.element_size() for t in outs)
            self.counters.bytes_sent += sent
            # The fastest this stage produced wire bytes: one microbatch's payload over its computation.
            self.counters.peak_Bps = max(self.counters.peak_Bps, sent / max(elapsed, 1e-9))
        if self._on_chunk:
            self._on_chunk()
        return out


_ACTIVE: list[TimedStage] = []  # the stage this process runs (one per rank); the p2p counters charge it
_KIND: dict[int, str] = {}  # id(list of works) -> "recv" or "send", between posting and waiting


def count_p2p(stage: TimedStage) -> None:
    """Charge the schedule's p2p posting and waiting to `stage` (once per process; a rebuilt stage takes over).

    ScheduleGPipe looks both helpers up in its module at call time, so wrapping them there counts every
    operation of every pass, and changes nothing of what they do."""
    _ACTIVE[:] = [stage]
    if getattr(_schedules._batch_p2p, "_pictl", False):
        return
    batch, wait = _schedules._batch_p2p, _schedules._wait_batch_p2p

    def counted_batch(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        start = time.perf_counter()
        works = batch(p2p_ops, desc)
        kind = "recv" if p2p_ops and all(p.op is dist.irecv for p in p2p_ops) else "send"
        if _ACTIVE:
            c = _ACTIVE[0].counters
            if kind == "recv":
                c.recv_post_s += time.perf_counter() - start
            else:
                c.send_post_s += time.perf_counter() - start
        _KIND[id(works)] = kind
        return works

    def counted_wait(works: list[dist.Work]) -> None:
        start = time.perf_counter()
        wait(works)
        spent = time.perf_counter() - start
        if not _ACTIVE:
            return
        st = _ACTIVE[0]
        if _KIND.pop(id(works), "send") == "recv":
            st.counters.recv_wait_s += spent
            if st.chunk == 0:
                st.counters.first_wait_s += spent  # the first input of a pass: the pipeline filling
        else:
            st.counters.drain_s += spent  # GPipe waits on its sends after the last microbatch

    counted_batch._pictl = True  # type: ignore[attr-defined]
    _schedules._batch_p2p = counted_batch
    _schedules._wait_batch_p2p = counted_wait


def emit_mb_times(emitter: Emitter, side: str, phase: str, repeat: int, times: list[float]) -> None:
    """A pass's per-microbatch wall times (`enter`: stage 0's compute began; `leave`: the last stage's ended;
    `serial`: the serial run's seconds per microbatch), in lines short enough never to interleave."""
    if not times:
        return
    base = times[0] if side != "serial" else 0.0
    for first in range(0, len(times), MB_TIMES_PER_LINE):
        part = times[first:first + MB_TIMES_PER_LINE]
        emitter.emit(MbTimes(side=side, phase=phase, repeat=repeat, first=first, base=round(base, 6),
                             times=[round(t - base, 6) for t in part]))


def timed_pass(run: Callable[[], Any], stage_counters: Callable[[], StageCounters]) -> tuple[float, Any]:
    """Run one pass, adding its wall time and its threads' CPU wait to the stage's counters."""
    span = Span()
    out = run()
    seconds = time.perf_counter() - span.wall
    c = stage_counters()
    c.pass_s += seconds
    c.run_delay_s += span.interference()
    return seconds, out
