"""torchrun entry point: one pipeline stage per rank, torch.distributed.pipelining over gloo.

    torchrun ... -m remote.runtime.pipeline --spec spec.json

Rank r runs stage r (with replicas, stage r % S of replica r // S: `remote.runtime.replicas`). Every
rank derives the same plan from the spec, builds only its own stage, and reports through JSON lines on
stdout (`remote.floor.protocol`).
Passes: warm-up, then (under `balanced`, `spec.refine`) calibration passes while
the measured stages suggest a better split (`remote.runtime.refine`), then the timed ones,
then the traced one (`--trace-steps`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe

from remote.data.images import load_images, load_labels, microbatches
from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.run_records import FirstOutput, Progress, RunEnd, RunStart, StageMoved, StageReady, Throughput
from remote.floor.spec import RunSpec
from remote.floor.wire import FP32
from remote.runtime.refine import RefineLoop, measured_compute_s
from remote.runtime.replicas import Replicas, replicas_of
from remote.runtime.timing import TimedStage, count_p2p, emit_mb_times, timed_pass
from remote.runtime.tracing import Tracer, planned_window, rendezvous_store
from remote.toolkit.codec import payload_meta
from remote.toolkit.measure import (
    ProgressClock,
    StageCounters,
    current_rss_mb,
    die_with_parent,
    peak_rss_mb,
    run_main,
    set_threads,
)
from remote.toolkit.numerics import engine
from remote.toolkit.outputs import open_checkpoint, report_outputs
from remote.toolkit.partition import StagePlan
from remote.toolkit.schedule_inputs import schedule_inputs
from remote.toolkit.stage import ModelLayout, build_stage, compact_pieces, layout_for, stage_codec, stage_io_shapes


@dataclass
class Built:
    """This rank's stage for one split, and the schedule that drives it."""

    plan: StagePlan
    stage: TimedStage
    schedule: ScheduleGPipe
    starts: tuple[int, ...]


def _build(spec: RunSpec, place: Replicas, n_mb: int, on_chunk: Callable[[], None],
           tracer: Tracer) -> tuple[Built, ModelLayout]:
    layout = layout_for(spec)
    plan = layout.stages[place.stage]
    codec = stage_codec(spec, layout, place.stage)
    module = build_stage(spec, layout, plan, open_checkpoint(spec), codec)
    in_shapes, out_shapes = stage_io_shapes(layout, spec.chunk)[place.stage]
    # What travels: the encoded tensors (another dtype, other shapes), so the schedule's buffers fit them.
    stage = TimedStage(module, place.stage, place.stages, torch.device("cpu"),
                       input_args=tuple(payload_meta(codec.fmt_in or FP32, in_shapes)),
                       output_args=tuple(payload_meta(codec.fmt_out or FP32, out_shapes)),
                       group=place.group, on_chunk=on_chunk, tracer=tracer)
    count_p2p(stage)
    return Built(plan, stage, ScheduleGPipe(stage, n_microbatches=n_mb), tuple(s.first for s in layout.stages[1:])), \
        layout


def _run(spec: RunSpec, emitter: Emitter) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    die_with_parent()
    threads = set_threads(spec.threads)
    if world != spec.stages * spec.replicas:
        raise RuntimeError(f"world size {world} != {spec.replicas} replica(s) x {spec.stages} stage(s)")
    emitter.emit(RunStart(world_size=world, stages=spec.stages, model=spec.model, images=spec.images,
                          chunk=spec.chunk, threads=threads, torch=torch.__version__, pid=os.getpid(),
                          import_rss_mb=current_rss_mb()))
    t_rendezvous = time.perf_counter()
    dist.init_process_group("gloo", timeout=timedelta(seconds=spec.pg_timeout_s))
    rendezvous_s = time.perf_counter() - t_rendezvous
    place = replicas_of(rank, world, spec.stages, spec.replicas)

    all_mb = -(-spec.images // spec.chunk)
    n_mb = place.microbatches(all_mb)
    first, last = place.first, place.last
    state = {"phase": "warmup", "repeat": 0, "step_start": 0.0}
    built: Built

    def report() -> None:
        live = StageCounters(**built.stage.counters.rounded())
        live.send_s = max(0.0, time.perf_counter() - state["step_start"] - live.compute_s - live.wait_s)
        emitter.emit(Progress(stage=rank, phase=state["phase"], repeat=state["repeat"], microbatches_total=n_mb,
                              **live.rounded()))

    clock = ProgressClock(spec.progress_interval_s, report)

    def on_chunk() -> None:
        if last and not state.get("first_output"):
            state["first_output"] = True
            emitter.emit(FirstOutput(stage=rank))
        clock.tick()

    t0 = time.perf_counter()
    tracer = Tracer(rank, emitter, Path.cwd(), rendezvous_store())
    built, layout = _build(spec, place, n_mb, on_chunk, tracer)
    mbs = place.deal(microbatches(load_images(spec.data, spec.images, layout.meta_model.pretrained_cfg, spec.seed),
                                  spec.chunk)) if first else None
    labels = load_labels(spec.data, spec.images) if place.gathers else None
    feed = schedule_inputs(mbs)  # (once: on a torch that takes the whole batch, it is put together here)

    def ready(kind: type[StageReady], **extra: Any) -> None:
        plan = built.plan
        emitter.emit(kind(stage=rank, modules=compact_pieces(layout.pieces[plan.first:plan.end]),
                          pieces=list(plan.pieces), params=plan.params, **extra))

    ready(StageReady, load_s=round(time.perf_counter() - t0, 3), rendezvous_s=round(rendezvous_s, 3),
          rss_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb(), engine=engine() if spec.numerics != "fp32" else None)

    passes_run = 0
    # Fault injection (tests, `RunSpec.slowdown`): this rank's [rank, from timed pass, factor, killed at re-cut].
    slowed = spec.slowdown if spec.slowdown and rank == int(spec.slowdown[0]) else None

    def one_pass(phase: str, repeat: int) -> tuple[float, torch.Tensor | None]:
        nonlocal passes_run
        state.update(phase=phase, repeat=repeat)
        stage = built.stage
        stage.new_pass()
        stage.slow_factor = slowed[2] if slowed and phase == "timed" and repeat >= slowed[1] else 1.0
        stage.first_step = passes_run * n_mb
        dist.barrier()
        state["step_start"] = time.perf_counter()
        with torch.no_grad():
            seconds, out = timed_pass(
                lambda: feed.eval(built.schedule),
                lambda: stage.counters)
        stage.counters.send_s = max(0.0, seconds - stage.counters.compute_s - stage.counters.wait_s)
        passes_run += 1
        state["replica_seconds"] = place.pass_times(seconds)
        return max(state["replica_seconds"]), out  # with replicas, the pass lasts until the slowest one is done

    def rebuild(starts: tuple[int, ...]) -> None:
        nonlocal built, layout
        named = [layout.pieces[i].name for i in starts]
        built, layout = _build(replace(spec, policy="explicit", split_points=named), place, n_mb,
                               on_chunk, tracer)

    for w in range(spec.warmup):
        one_pass("warmup", w)
        tracer.end_of_pass(passes_run * n_mb)
        report()
    loop: RefineLoop | None = None
    if spec.refine is not None and spec.stages > 1 and place.count == 1:
        names = [p.name for p in layout.pieces]
        loop = RefineLoop(spec.refine, built.starts, rank, world, names, emitter)
        calibrations = 0
        if spec.warmup == 0:  # refinement needs one measured pass
            one_pass("calibrate", 0)
            calibrations = 1
        # Each step hands rank 0 every microbatch's compute time, so it can tell a gain from the noise.
        while (nxt := loop.step(built.stage.compute_times)) is not None:
            if nxt != built.starts:  # (a split measured again right after itself needs no rebuild)
                rebuild(nxt)
            one_pass("calibrate", calibrations)
            calibrations += 1
            report()
        if (chosen := loop.final()) != built.starts:
            rebuild(chosen)
        loop.announce(calibrations)
        ready(StageMoved)

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
        # Between timed passes: a host that drifted far enough moves the cut (`remote.floor.recut`); the next pass
        # runs the new split. The moved pieces' weights come from the checkpoint on this host, as at start-up
        # (or the seeded initialisation): nothing crosses the pipeline's links but the next pass's states.
        if timed and loop is not None and loop.spec.recut and repeat < spec.repeats - 1:
            if (moved := loop.watch_pass(measured_compute_s(built.stage.compute_times), repeat)) is not None:
                if slowed and len(slowed) > 3 and slowed[3]:  # fault injection: killed as the re-cut begins
                    os.kill(os.getpid(), signal.SIGKILL)
                rebuild(moved)
                ready(StageMoved)
        # Each microbatch's wall time entering stage 0 and leaving the last: the controller pairs them (with
        # the hosts' clock offsets) into the latency per image.
        # With replicas, replica 0's: its images' latencies are every replica's (the same stages, dealt alike).
        phase = "timed" if timed else "trace"
        if first and place.replica == 0:
            emit_mb_times(emitter, "enter", phase, repeat, built.stage.enter_times)
        if last and place.replica == 0:
            emit_mb_times(emitter, "leave", phase, repeat, built.stage.leave_times)
        # The outputs checked are those of the first timed pass (of the split that was timed), every
        # replica's gathered into image order on the last rank of all.
        gathered = place.gather_outputs(out if last else None, all_mb, spec.chunk) if timed and repeat == 0 else None
        if place.gathers and timed:
            emitter.emit(Throughput(repeat=repeat, images=spec.images, seconds=round(seconds, 6),
                                    ips=round(spec.images / seconds, 4), traced=traced,
                                    replica_seconds=[round(t, 6) for t in state["replica_seconds"]]
                                    if place.count > 1 else None))
            if gathered is not None:
                logits = gathered[: spec.images]  # drop the padded rows of the last microbatch
                predictions = logits.argmax(dim=1)
                check_logits = logits[: spec.check_images].clone()
    dist.barrier()
    if place.gathers:
        report_outputs(emitter, spec, check_logits, predictions, labels, P.LOGITS_FILE_PIPELINE)
    emitter.emit(RunEnd(stage=rank, status="ok", peak_rss_mb=peak_rss_mb(), **totals.rounded()))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_PIPELINE, rank=int(os.environ.get("RANK", "0")))
    return run_main(emitter, lambda: _run(RunSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
