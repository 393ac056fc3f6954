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
    # What travels: the encoded tensors (another dtype, other shapes), so the schedule's buffers fit them. The
    # first stage takes the model's input as it is (a text model's: token ids).
    inputs = (layout.input_meta(spec.chunk),) if place.stage == 0 else payload_meta(codec.fmt_in or FP32, in_shapes)
    stage = TimedStage(module, place.stage, place.stages, torch.device("cpu"), input_args=tuple(inputs),
                       output_args=tuple(payload_meta(codec.fmt_out or FP32, out_shapes)),
                       group=place.group, on_chunk=on_chunk, tracer=tracer)
    count_p2p(stage)
    return Built(plan, stage, ScheduleGPipe(stage, n_microbatches=n_mb), tuple(s.first for s in layout.stages[1:])), \
        layout


def _run(spec: RunSpec, emitter: Emitter) -> None:
    """One rank's run, a line of phases like the controller's `pictl.run.session`: each reads and writes the
    rank's `RankRun` (its stage, its inputs, the passes so far)."""
    rank = RankRun.join(spec, emitter)
    rank.build_first()
    rank.warm_up()
    loop = rank.refine()
    kept = rank.timed_passes(loop)
    rank.finish(kept)


@dataclass
class Kept:
    """What the timed passes leave for the end: the counters summed over them, and the outputs checked (those of
    the first timed pass, of the split that was timed, on the rank that gathers them)."""

    totals: StageCounters
    check_logits: torch.Tensor | None = None
    predictions: torch.Tensor | None = None


class RankRun:
    """This rank's part of a run: where it sits, its stage (rebuilt when the split moves), its inputs, and the
    passes so far. The phases of `_run` are its methods, in order."""

    def __init__(self, spec: RunSpec, emitter: Emitter, rank: int, world: int, place: Replicas,
                 rendezvous_s: float) -> None:
        self.spec, self.emitter, self.rank, self.world, self.place = spec, emitter, rank, world, place
        self.rendezvous_s = rendezvous_s
        self.all_mb = -(-spec.images // spec.chunk)
        self.n_mb = place.microbatches(self.all_mb)
        self.phase, self.repeat, self.step_start = "warmup", 0, 0.0
        self.first_output_sent = False
        self.replica_seconds: list[float] = []
        self.passes_run = 0
        self.clock = ProgressClock(spec.progress_interval_s, self.report)
        self.tracer = Tracer(rank, emitter, Path.cwd(), rendezvous_store())
        # Fault injection (tests, `RunSpec.slowdown`): this rank's [rank, from timed pass, factor, killed at re-cut].
        self.slowed = spec.slowdown if spec.slowdown and rank == int(spec.slowdown[0]) else None
        self.built: Built
        self.layout: ModelLayout

    @classmethod
    def join(cls, spec: RunSpec, emitter: Emitter) -> RankRun:
        """The run starts: this rank says so, joins the others (gloo's rendezvous) and learns where it sits."""
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
        return cls(spec, emitter, rank, world, replicas_of(rank, world, spec.stages, spec.replicas), rendezvous_s)

    def build_first(self) -> None:
        """Its stage of the first split, and the inputs it feeds (the first stage) or the labels it checks."""
        spec, place = self.spec, self.place
        t0 = time.perf_counter()
        self.built, self.layout = _build(spec, place, self.n_mb, self.on_chunk, self.tracer)
        mbs = place.deal(microbatches(load_images(spec.data, spec.images, self.layout.meta_model.pretrained_cfg,
                                                  spec.seed), spec.chunk)) if place.first else None
        self.labels = load_labels(spec.data, spec.images) if place.gathers else None
        self.feed = schedule_inputs(mbs)  # (once: on a torch that takes the whole batch, it is put together here)
        self.ready(StageReady, load_s=round(time.perf_counter() - t0, 3), rendezvous_s=round(self.rendezvous_s, 3),
                   rss_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb(),
                   engine=engine() if spec.numerics != "fp32" else None)

    def warm_up(self) -> None:
        for w in range(self.spec.warmup):
            self.one_pass("warmup", w)
            self.tracer.end_of_pass(self.passes_run * self.n_mb)
            self.report()

    def refine(self) -> RefineLoop | None:
        """Under `balanced`: calibration passes while the measured stages suggest a better split; the loop that
        then watches the timed passes (None: no refinement)."""
        spec = self.spec
        if spec.refine is None or spec.stages <= 1 or self.place.count != 1:
            return None
        loop = RefineLoop(spec.refine, self.built.starts, self.rank, self.world,
                          [p.name for p in self.layout.pieces], self.emitter)
        calibrations = 0
        if spec.warmup == 0:  # refinement needs one measured pass
            self.one_pass("calibrate", 0)
            calibrations = 1
        # Each step hands rank 0 every microbatch's compute time, so it can tell a gain from the noise.
        while (nxt := loop.step(self.built.stage.compute_times)) is not None:
            if nxt != self.built.starts:  # (a split measured again right after itself needs no rebuild)
                self.rebuild(nxt)
            self.one_pass("calibrate", calibrations)
            calibrations += 1
            self.report()
        if (chosen := loop.final()) != self.built.starts:
            self.rebuild(chosen)
        loop.announce(calibrations)
        self.ready(StageMoved)
        return loop

    def timed_passes(self, loop: RefineLoop | None) -> Kept:
        """The timed passes (a re-cut between two of them moves the split for the next), then the traced one
        (`--trace-steps` adds it after them, so the profiler never touches a timed pass)."""
        spec, place = self.spec, self.place
        kept = Kept(StageCounters())
        self.tracer.planned = planned_window(spec.trace_steps, self.passes_run + spec.repeats - spec.first_pass,
                                             self.n_mb)
        extra = 1 if spec.trace_steps > 0 else 0
        # (A launch that continues a run on fewer hosts begins at its `first_pass`: passes keep the run's numbers.)
        for repeat in range(spec.first_pass, spec.repeats + extra):
            timed = repeat < spec.repeats
            seconds, out = self.one_pass("timed" if timed else "trace", repeat)
            # Exporting a finished window happens here, between passes: never inside a timed span.
            traced = self.tracer.end_of_pass(self.passes_run * self.n_mb, final=repeat == spec.repeats + extra - 1)
            self.report()
            if timed:
                kept.totals.add(self.built.stage.counters)
            # Each microbatch's wall time entering stage 0 and leaving the last: the controller pairs them (with
            # the hosts' clock offsets) into the latency per image.
            # With replicas, replica 0's: its images' latencies are every replica's (the same stages, dealt alike).
            phase = "timed" if timed else "trace"
            if place.first and place.replica == 0:
                emit_mb_times(self.emitter, "enter", phase, repeat, self.built.stage.enter_times)
            if place.last and place.replica == 0:
                emit_mb_times(self.emitter, "leave", phase, repeat, self.built.stage.leave_times)
            # The outputs checked are those of this launch's first timed pass (of the split that was timed), every
            # replica's gathered into image order on the last rank of all.
            gathered = (place.gather_outputs(out if place.last else None, self.all_mb, spec.chunk)
                        if timed and repeat == spec.first_pass else None)
            if place.gathers and timed:
                self.emitter.emit(Throughput(
                    repeat=repeat, images=spec.images, seconds=round(seconds, 6), ips=round(spec.images / seconds, 4),
                    traced=traced,
                    replica_seconds=[round(t, 6) for t in self.replica_seconds] if place.count > 1 else None))
                if gathered is not None:
                    logits = gathered[: spec.images]  # drop the padded rows of the last microbatch
                    kept.predictions = logits.argmax(dim=1)
                    kept.check_logits = logits[: spec.check_images].clone()
            # Last, once this pass's times and outputs are out: a re-cut replaces the stage that measured them.
            if timed and loop is not None and loop.spec.recut and repeat < spec.repeats - 1:
                self.watch(loop, repeat)
        return kept

    def watch(self, loop: RefineLoop, repeat: int) -> None:
        """Between timed passes: a host that drifted far enough moves the cut (the controller's watch decides,
        `pictl.run.segments`); the next pass runs the new split. The moved pieces' weights come from the checkpoint
        on this host, as at start-up (or the seeded initialisation): nothing crosses the pipeline's links but the
        next pass's states."""
        if (moved := loop.watch_pass(measured_compute_s(self.built.stage.compute_times), repeat, Path.cwd(),
                                     self.spec.pg_timeout_s)) is None:
            return
        if self.slowed and len(self.slowed) > 3 and self.slowed[3]:  # fault injection: killed as the re-cut begins
            os.kill(os.getpid(), signal.SIGKILL)
        self.rebuild(moved)
        self.ready(StageMoved)

    def finish(self, kept: Kept) -> None:
        """Every rank done: the outputs reported (by the rank that gathered them), this rank's end."""
        dist.barrier()
        if self.place.gathers:
            report_outputs(self.emitter, self.spec, kept.check_logits, kept.predictions, self.labels,
                           P.LOGITS_FILE_PIPELINE)
        self.emitter.emit(RunEnd(stage=self.rank, status="ok", peak_rss_mb=peak_rss_mb(), **kept.totals.rounded()))
        dist.destroy_process_group()

    # What the phases share: one pass, a rebuild, the progress they report.

    def one_pass(self, phase: str, repeat: int) -> tuple[float, torch.Tensor | None]:
        self.phase, self.repeat = phase, repeat
        stage = self.built.stage
        stage.new_pass()
        slowed = self.slowed
        stage.slow_factor = slowed[2] if slowed and phase == "timed" and repeat >= slowed[1] else 1.0
        stage.first_step = self.passes_run * self.n_mb
        dist.barrier()
        self.step_start = time.perf_counter()
        with torch.no_grad():
            seconds, out = timed_pass(lambda: self.feed.eval(self.built.schedule), lambda: stage.counters)
        stage.counters.send_s = max(0.0, seconds - stage.counters.compute_s - stage.counters.wait_s)
        self.passes_run += 1
        self.replica_seconds = self.place.pass_times(seconds)
        return max(self.replica_seconds), out  # with replicas, the pass lasts until the slowest one is done

    def rebuild(self, starts: tuple[int, ...]) -> None:
        named = [self.layout.pieces[i].name for i in starts]
        self.built, self.layout = _build(replace(self.spec, policy="explicit", split_points=named), self.place,
                                         self.n_mb, self.on_chunk, self.tracer)

    def ready(self, kind: type[StageReady], **extra: Any) -> None:
        plan = self.built.plan
        self.emitter.emit(kind(stage=self.rank, modules=compact_pieces(self.layout.pieces[plan.first:plan.end]),
                               pieces=list(plan.pieces), params=plan.params, **extra))

    def report(self) -> None:
        live = StageCounters(**self.built.stage.counters.rounded())
        live.send_s = max(0.0, time.perf_counter() - self.step_start - live.compute_s - live.wait_s)
        self.emitter.emit(Progress(stage=self.rank, phase=self.phase, repeat=self.repeat,
                                   microbatches_total=self.n_mb, **live.rounded()))

    def on_chunk(self) -> None:
        if self.place.last and not self.first_output_sent:
            self.first_output_sent = True
            self.emitter.emit(FirstOutput(stage=self.rank))
        self.clock.tick()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_PIPELINE, rank=int(os.environ.get("RANK", "0")))
    return run_main(emitter, lambda: _run(RunSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
