"""torchrun entry point: one pipeline stage per rank, torch.distributed.pipelining over gloo.

    torchrun ... -m remote.pipeline --spec spec.json

Rank r runs stage r. Every rank derives the same plan from the spec, builds only
its own stage, and reports through JSON lines on stdout (`remote.protocol`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.profiler import record_function

from remote import protocol as P
from remote.data import load_images, load_labels, microbatches
from remote.emit import Emitter
from remote.measure import (
    ProgressClock,
    StageCounters,
    current_rss_mb,
    die_with_parent,
    peak_rss_mb,
    run_main,
    set_threads,
)
from remote.outputs import open_checkpoint, report_outputs
from remote.spec import RunSpec
from remote.stage import build_stage, compact_pieces, layout_for, stage_io_shapes
from remote.tracing import Tracer, planned_window, rendezvous_store


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
        self.counters.compute_s += time.perf_counter() - start
        self.counters.microbatches += 1
        if not self.is_last:
            outs = out if isinstance(out, tuple) else (out,)
            self.counters.bytes_sent += sum(t.numel() * t.element_size() for t in outs)
        if self._on_chunk:
            self._on_chunk()
        return out


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

    t0 = time.perf_counter()
    layout = layout_for(spec)
    stage_plan = layout.stages[rank]
    module = build_stage(spec, layout, stage_plan, open_checkpoint(spec))
    in_shapes, out_shapes = stage_io_shapes(layout, spec.chunk)[rank]
    n_mb = -(-spec.images // spec.chunk)

    first, last = rank == 0, rank == world - 1
    mbs = microbatches(load_images(spec.data, spec.images, layout.meta_model.pretrained_cfg, spec.seed),
                       spec.chunk) if first else None
    labels = load_labels(spec.data, spec.images) if last else None
    emitter.emit(P.STAGE_READY, stage=rank, modules=compact_pieces(layout.pieces[stage_plan.first:stage_plan.end]),
                 pieces=list(stage_plan.pieces), params=stage_plan.params,
                 load_s=round(time.perf_counter() - t0, 3), rendezvous_s=round(rendezvous_s, 3),
                 rss_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb())

    totals = StageCounters()
    state = {"phase": "warmup", "repeat": 0, "step_start": 0.0}
    stage: TimedStage

    def report() -> None:
        live = StageCounters(**stage.counters.rounded())
        live.send_s = max(0.0, time.perf_counter() - state["step_start"] - live.compute_s - live.wait_s)
        emitter.emit(P.PROGRESS, stage=rank, phase=state["phase"], repeat=state["repeat"],
                     microbatches_total=n_mb, **live.rounded())

    clock = ProgressClock(spec.progress_interval_s, report)

    def on_chunk() -> None:
        if last and not state.get("first_output"):
            state["first_output"] = True
            emitter.emit(P.FIRST_OUTPUT, stage=rank)
        clock.tick()

    passes = spec.warmup + spec.repeats
    tracer = Tracer(rank, emitter, Path.cwd(), rendezvous_store(), planned_window(spec.trace_steps, passes, n_mb))
    stage = TimedStage(module, rank, world, torch.device("cpu"),
                       input_args=tuple(torch.empty(s, device="meta") for s in in_shapes),
                       output_args=tuple(torch.empty(s, device="meta") for s in out_shapes),
                       on_chunk=on_chunk, tracer=tracer)
    schedule = ScheduleGPipe(stage, n_microbatches=n_mb)

    check_logits = None
    predictions = None
    # `--trace-steps` adds one untimed pass after the timed ones, so the profiler never touches a timed pass.
    last_pass = passes if spec.trace_steps > 0 else passes - 1
    for repeat in range(last_pass + 1):
        timed = spec.warmup <= repeat < passes
        phase = "timed" if timed else ("warmup" if repeat < spec.warmup else "trace")
        state.update(phase=phase, repeat=repeat - spec.warmup if timed else repeat)
        stage.counters = StageCounters()
        stage.first_step = repeat * n_mb
        dist.barrier()
        state["step_start"] = start = time.perf_counter()
        with torch.no_grad():
            out = schedule.eval(arg_mbs=[(mb,) for mb in mbs]) if first else schedule.eval()
        seconds = time.perf_counter() - start
        stage.counters.send_s = max(0.0, seconds - stage.counters.compute_s - stage.counters.wait_s)
        # Exporting a finished window happens here, between passes: never inside a timed span.
        traced = tracer.end_of_pass((repeat + 1) * n_mb, final=repeat == last_pass)
        report()
        if timed:
            totals.add(stage.counters)
        if last:
            logits = out[: spec.images]  # drop the padded rows of the last microbatch
            if timed:
                emitter.emit(P.THROUGHPUT, repeat=state["repeat"], images=spec.images,
                             seconds=round(seconds, 6), ips=round(spec.images / seconds, 4), traced=traced)
            if predictions is None:
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
