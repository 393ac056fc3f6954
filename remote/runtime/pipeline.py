"""torchrun entry point: one pipeline stage per rank, torch.distributed.pipelining over gloo.

    torchrun ... -m remote.runtime.pipeline --spec spec.json

Rank r runs stage r. Every rank derives the same plan from the spec, builds only
its own stage, and reports through JSON lines on stdout (`remote.protocol`).
Passes: warm-up, then (under `balanced`, `spec.refine`) calibration passes while
the measured stages suggest a better split (`remote.runtime.refine`), then the timed ones,
then the traced one (`--trace-steps`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.profiler import record_function

from remote import protocol as P
from remote.data.images import load_images, load_labels, microbatches
from remote.emit import Emitter
from remote.runtime.codec import payload_meta
from remote.runtime.measure import (
    ProgressClock,
    StageCounters,
    current_rss_mb,
    die_with_parent,
    peak_rss_mb,
    run_main,
    set_threads,
)
from remote.runtime.outputs import open_checkpoint, report_outputs
from remote.runtime.partition import StagePlan
from remote.runtime.refine import RefineLoop, measured_compute_s
from remote.runtime.stage import ModelLayout, build_stage, compact_pieces, layout_for, stage_codec, stage_io_shapes
from remote.runtime.tracing import Tracer, planned_window, rendezvous_store
from remote.spec import RunSpec
from remote.wire import FP32


class TimedStage(PipelineStage):
    """A PipelineStage that counts compute time, input wait and bytes sent.

    ScheduleGPipe calls, per microbatch: get_fwd_recv_ops -> (wait on them) ->
    forward_one_chunk -> get_fwd_send_ops. The gap between the first two calls is
    the time spent waiting for input; forward_one_chunk is compute. Sends are
    asynchronous, so the time blocked on them is what is left of the step.
    """

    def __init__(self, *args, on_chunk=None, tracer: Tracer | None = None, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.counters = StageCounters()
        self.compute_times: list[float] = []  # this pass's, per microbatch (refinement takes their median)
        self._on_chunk = on_chunk
        self._recv_posted = 0.0
        self.tracer = tracer
        self.first_step = 0  # the global number of this pass's first microbatch

    def get_fwd_recv_ops(self, fwd_chunk_id: int):  # noqa: ANN201
        if self.tracer is not None:
            self.tracer.before_step(self.first_step + fwd_chunk_id)
        ops = super().get_fwd_recv_ops(fwd_chunk_id)
        self._recv_posted = time.perf_counter()
        return ops

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
        elapsed = time.perf_counter() - start
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


@dataclass
class Built:
    """This rank's stage for one split, and the schedule that drives it."""

    plan: StagePlan
    stage: TimedStage
    schedule: ScheduleGPipe
    starts: tuple[int, ...]


def _build(spec: RunSpec, rank: int, world: int, n_mb: int, on_chunk: Callable[[], None],
           tracer: Tracer) -> tuple[Built, ModelLayout]:
    layout = layout_for(spec)
    plan = layout.stages[rank]
    codec = stage_codec(spec, layout, rank)
    module = build_stage(spec, layout, plan, open_checkpoint(spec), codec)
    in_shapes, out_shapes = stage_io_shapes(layout, spec.chunk)[rank]
    # What travels: the encoded tensors (another dtype, other shapes), so the schedule's buffers fit them.
    stage = TimedStage(module, rank, world, torch.device("cpu"),
                       input_args=tuple(payload_meta(codec.fmt_in or FP32, in_shapes)),
                       output_args=tuple(payload_meta(codec.fmt_out or FP32, out_shapes)),
                       on_chunk=on_chunk, tracer=tracer)
    return Built(plan, stage, ScheduleGPipe(stage, n_microbatches=n_mb), tuple(s.first for s in layout.stages[1:])), \
        layout


def _run(spec: RunSpec, emitter: Emitter) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    die_with_parent()
    threads = set_threads(spec.threads)
    if world != spec.stages:
        raise RuntimeError(f"world size {world} != {spec.stages} stages")
    emitter.emit(P.RUN_START, world_size=world, stages=spec.stages, model=spec.model, images=spec.images,
                 chunk=spec.chunk, threads=threads, torch=torch.__version__, pid=os.getpid(),
                 import_rss_mb=current_rss_mb())
    t_rendezvous = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec.pg_timeout_s))
    rendezvous_s = time.perf_counter() - t_rendezvous

    n_mb = -(-spec.images // spec.chunk)
    first, last = rank == 0, rank == world - 1
    state = {"phase": "warmup", "repeat": 0, "step_start": 0.0}
    built: Built

    def report() -> None:
        live = StageCounters(**built.stage.counters.rounded())
        live.send_s = max(0.0, time.perf_counter() - state["step_start"] - live.compute_s - live.wait_s)
        emitter.emit(P.PROGRESS, stage=rank, phase=state["phase"], repeat=state["repeat"],
                     microbatches_total=n_mb, **live.rounded())

    clock = ProgressClock(spec.progress_interval_s, report)

    def on_chunk() -> None:
        if last and not state.get("first_output"):
            state["first_output"] = True
            emitter.emit(P.FIRST_OUTPUT, stage=rank)
        clock.tick()

    t0 = time.perf_counter()
    tracer = Tracer(rank, emitter, Path.cwd(), rendezvous_store())
    built, layout = _build(spec, rank, world, n_mb, on_chunk, tracer)
    mbs = microbatches(load_images(spec.data, spec.images, layout.meta_model.pretrained_cfg, spec.seed),
                       spec.chunk) if first else None
    labels = load_labels(spec.data, spec.images) if last else None

    def ready(event: str, **extra: object) -> None:
        plan = built.plan
        emitter.emit(event, stage=rank, modules=compact_pieces(layout.pieces[plan.first:plan.end]),
                     pieces=list(plan.pieces), params=plan.params, **extra)

    ready(P.STAGE_READY, load_s=round(time.perf_counter() - t0, 3), rendezvous_s=round(rendezvous_s, 3),
          rss_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb())

    passes_run = 0

    def one_pass(phase: str, repeat: int) -> tuple[float, torch.Tensor | None]:
        nonlocal passes_run
        state.update(phase=phase, repeat=repeat)
        stage = built.stage
        stage.counters, stage.compute_times = StageCounters(), []
        stage.first_step = passes_run * n_mb
        dist.barrier()
        state["step_start"] = start = time.perf_counter()
        with torch.no_grad():
            out = built.schedule.eval(arg_mbs=[(mb,) for mb in mbs]) if first else built.schedule.eval()
        seconds = time.perf_counter() - start
        stage.counters.send_s = max(0.0, seconds - stage.counters.compute_s - stage.counters.wait_s)
        passes_run += 1
        return seconds, out

    def rebuild(starts: tuple[int, ...]) -> None:
        nonlocal built, layout
        named = [layout.pieces[i].name for i in starts]
        built, layout = _build(replace(spec, policy="explicit", split_points=named), rank, world, n_mb,
                               on_chunk, tracer)

    for w in range(spec.warmup):
        one_pass("warmup", w)
        tracer.end_of_pass(passes_run * n_mb)
        report()
    if spec.refine is not None and world > 1:
        names = [p.name for p in layout.pieces]
        loop = RefineLoop(spec.refine, built.starts, rank, world, names, emitter)
        if spec.warmup == 0:  # refinement needs one measured pass
            one_pass("calibrate", 0)
        calibrations = 0
        while (nxt := loop.step(measured_compute_s(built.stage.compute_times))) is not None:
            rebuild(nxt)
            calibrations += 1
            one_pass("calibrate", calibrations)
            report()
        if (chosen := loop.final()) != built.starts:
            rebuild(chosen)
        ready(P.STAGE_MOVED)

    totals = StageCounters()
    check_logits = predictions = None
    # `--trace-steps` adds one untimed pass after the timed ones, so the profiler never touches a timed pass.
    tracer.planned = planned_window(spec.trace_steps, passes_run + spec.repeats, n_mb)
    extra = 1 if spec.trace_steps > 0 else 0
    for repeat in range(spec.repeats + extra):
        timed = repeat < spec.repeats
        seconds, out = one_pass("timed" if timed else "trace", repeat)
        # Exporting a finished window happens here, between passes: never inside a timed span.
        traced = tracer.end_of_pass(passes_run * n_mb, final=repeat == spec.repeats + extra - 1)
        report()
        if timed:
            totals.add(built.stage.counters)
        if last and timed:
            logits = out[: spec.images]  # drop the padded rows of the last microbatch
            emitter.emit(P.THROUGHPUT, repeat=repeat, images=spec.images,
                         seconds=round(seconds, 6), ips=round(spec.images / seconds, 4), traced=traced)
            if predictions is None:  # the outputs checked are those of the split that was timed
                predictions = logits.argmax(dim=1)
                check_logits = logits[: spec.check_images].clone()
    dist.barrier()
    if last:
        report_outputs(emitter, spec, check_logits, predictions, labels, P.LOGITS_FILE_PIPELINE)
    emitter.emit(P.RUN_END, stage=rank, status="ok", peak_rss_mb=peak_rss_mb(), **totals.rounded())
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_PIPELINE, rank=int(os.environ.get("RANK", "0")))
    return run_main(emitter, lambda: _run(RunSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
