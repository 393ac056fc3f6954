"""Training entry point: one process per rank, under torchrun (or alone for `single`).

    torchrun ... -m remote.training.train --spec spec.json
    python -m remote.training.train --spec spec.json          (single, no process group)

Every rank derives the same layout and batches from the spec, trains for `steps` optimizer steps,
evaluates after every epoch (and at the end), writes the weights it ends with and the trained model's
logits on the first evaluation images, and reports through JSON lines on stdout (`remote.floor.protocol`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from remote.data.datasets import class_count
from remote.data.images import load_images
from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.job_records import TrainEnd, TrainEval, TrainStart, TrainStep
from remote.floor.run_records import Outputs, StageReady
from remote.floor.spec import DataSpec, TrainSpec
from remote.floor.wire import parse_wire
from remote.toolkit.artifact import attention_heads
from remote.toolkit.kept_pair import PAIRS
from remote.toolkit.measure import current_rss_mb, die_with_parent, peak_rss_mb, run_main, set_threads
from remote.toolkit.model import Checkpoint
from remote.toolkit.outputs import write_logits
from remote.toolkit.stage import ModelLayout, StageModule, compact_pieces
from remote.training.data import Batches, Labelled, Prefetched, labelled, padded_microbatches, take_padded
from remote.training.layout import layout_kwargs, train_layout
from remote.training.lora import merge
from remote.training.timing import StepTimes
from remote.training.workers import PipelineStageWorker, WholeModel, Worker


def check(spec: TrainSpec, world: int) -> None:
    """What the controller also checks; a host never trusts that it did."""
    if spec.chunks < 1 or spec.batch_size % spec.chunks:
        raise BadInput(f"--chunks {spec.chunks} does not divide the batch of {spec.batch_size}")
    if spec.mode == "pipeline" and world != spec.stages:
        raise BadInput(f"world size {world} != {spec.stages} stages")
    if spec.mode == "ddp" and spec.chunks % world:
        raise BadInput(f"ddp gives each of its {world} ranks the same number of microbatches: --chunks "
                       f"{spec.chunks} must be a multiple of {world}")
    if spec.mode == "single" and world != 1:
        raise BadInput(f"single runs one rank, not {world}")
    if spec.train_images < spec.batch_size:
        raise BadInput(f"--train-images {spec.train_images} is less than one batch of {spec.batch_size}")


def _mine(micro: list[list[int]], spec: TrainSpec, rank: int, world: int) -> list[list[int]]:
    """The microbatches of a step whose images rank `rank` reads (`Worker.step`'s order)."""
    return micro if spec.mode == "pipeline" else micro[rank::world]


def _worker(spec: TrainSpec, layout: ModelLayout, rank: int, world: int, steps: int) -> Worker:
    checkpoint = Checkpoint(spec.checkpoint, allow_pickle=spec.allow_pickle) if spec.checkpoint else None
    cls = PipelineStageWorker if spec.mode == "pipeline" else WholeModel
    return cls(spec, layout, checkpoint, rank=rank, world=world, steps=steps)


class _Evaluator:
    """Top-1 on the held-out images, on the rank that sees the output (every rank takes part)."""

    def __init__(self, spec: TrainSpec, worker: Worker, held_out: Labelled, reads_images: bool) -> None:
        self.spec, self.worker, self.held_out, self.reads = spec, worker, held_out, reads_images
        group = spec.chunks if spec.mode == "pipeline" else 1
        self.micro = padded_microbatches(list(range(len(held_out))), spec.microbatch, group)

    def run(self) -> tuple[int, int] | None:
        images = [take_padded(self.held_out, m) if self.reads else None for m in self.micro]
        logits = self.worker.logits(images)
        if logits is None:
            return None
        n = len(self.held_out)
        right = int((logits[:n].argmax(dim=1) == self.held_out.labels).sum())
        return right, n


def _train(spec: TrainSpec, emitter: Emitter) -> None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    die_with_parent()
    threads = set_threads(spec.threads)
    check(spec, world)
    if not spec.num_classes:  # an ImageFolder's class count is read here, where the data is
        spec = replace(spec, num_classes=class_count(spec.data))
    if world > 1:
        dist.init_process_group("gloo", timeout=timedelta(seconds=spec.pg_timeout_s))
    t0 = time.perf_counter()
    layout = train_layout(spec)
    cfg = layout.meta_model.pretrained_cfg
    pipeline = spec.mode == "pipeline"
    reads_images = rank == 0 or not pipeline
    batches = Batches(spec.train_images, spec.batch_size, spec.microbatch, spec.seed)
    steps = spec.steps or spec.epochs * batches.steps_per_epoch
    worker = _worker(spec, layout, rank, world, steps)
    # Every rank needs the labels' count; the images are read where they enter the model.
    train = labelled(spec, "train", spec.train_images, cfg)
    if len(train) < spec.train_images:
        raise BadInput(f"data set {spec.data.path} has {len(train)} training images; "
                       f"--train-images {spec.train_images} were asked for")
    if spec.workers and reads_images:  # read ahead, in the order this rank's steps take the images
        todo = min(steps, spec.stop_after) if spec.stop_after else steps
        train = Prefetched(train, [idx for step in range(todo) for idx in _mine(batches.step(step), spec, rank, world)],
                           spec.workers)
    held_out = labelled(spec, "test", spec.eval_images, cfg)
    evaluator = _Evaluator(spec, worker, held_out, reads_images)
    plan = layout.stages[rank if pipeline else 0]
    emitter.emit(TrainStart(mode=spec.mode, schedule=spec.schedule if pipeline else None, world_size=world,
                 model=spec.model, num_classes=spec.num_classes, model_kwargs=layout_kwargs(spec, layout),
                 batch_size=spec.batch_size, chunks=spec.chunks, steps=steps,
                 steps_per_epoch=batches.steps_per_epoch, amp=spec.amp, threads=threads, torch=torch.__version__,
                 pid=os.getpid()))
    emitter.emit(StageReady(stage=rank, modules=compact_pieces(layout.pieces[plan.first:plan.end]),
                 pieces=list(plan.pieces), params=plan.params, load_s=round(time.perf_counter() - t0, 3),
                 rss_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb()))

    totals, timed_s, timed_steps = StepTimes(), 0.0, 0
    for step in range(min(steps, spec.stop_after) if spec.stop_after else steps):
        epoch = step // batches.steps_per_epoch + 1
        micro = batches.step(step)
        if world > 1:
            dist.barrier()  # every rank starts the step together: its wall time is the step's
        start = time.perf_counter()
        loss, times = worker.step(micro, train)
        seconds = time.perf_counter() - start
        times.close(seconds)
        timed = step >= spec.warmup_steps
        if timed:
            totals.add(times)
            timed_s += seconds
            timed_steps += 1
        fields = {"loss": round(loss / spec.chunks, 6)} if worker.holds_loss and loss is not None else {}
        emitter.emit(TrainStep(stage=rank, step=step + 1, epoch=epoch, seconds=round(seconds, 6),
                     timed=timed, samples=spec.batch_size, lr=worker.sched.get_last_lr()[0],  # type: ignore[attr-defined]
                     times=times.rounded(), **fields))
        end_of_epoch = (step + 1) % batches.steps_per_epoch == 0 or step + 1 == steps
        if end_of_epoch and len(held_out):
            started = time.perf_counter()
            result = evaluator.run()
            if result is not None:
                right, n = result
                emitter.emit(TrainEval(epoch=epoch, step=step + 1, correct=right, total=n,
                             top1=round(right / n, 6), seconds=round(time.perf_counter() - started, 3)))
    _finish(spec, emitter, worker, layout, rank, reads_images, totals, timed_s, timed_steps)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def kept_halves(spec: TrainSpec, layout: ModelLayout, rank: int, module: StageModule) -> dict[str, torch.Tensor]:
    """This rank's halves of the learned pairs, under their names in the kept model (`kept_pair.PAIRS`): the
    encoder of the cut it sends to, the decoder of the one it receives at; N counts the learned cuts."""
    wire = parse_wire(spec.wire)
    cuts = [layout.pieces[s.first].name for s in layout.stages[1:]]
    learned = [c for c in cuts if wire.at(c).learned]
    out = {}
    for side, held, cut in (("encoders", "wire_encoders", cuts[rank] if rank < len(cuts) else None),
                            ("decoders", "wire_decoders", cuts[rank - 1] if rank > 0 else None)):
        if cut in learned and hasattr(module, held):
            n = learned.index(cut)
            out.update({f"{PAIRS}.{n}.{side}.{k}": v.detach().contiguous()
                        for k, v in getattr(module, held).state_dict().items()})
    return out


def _finish(spec: TrainSpec, emitter: Emitter, worker: Worker, layout: ModelLayout, rank: int, reads_images: bool,
            totals: StepTimes, timed_s: float, timed_steps: int) -> None:
    """The trained model's logits on the first evaluation images, and this rank's weights on disk."""
    merge(worker.lora)  # (what is evaluated and written is the model `pictl run` will run: adapters folded in)
    if spec.check_images:
        check = DataSpec(kind=spec.data.kind, path=spec.data.path, split="test")
        group = spec.chunks if spec.mode == "pipeline" else 1
        micro = padded_microbatches(list(range(spec.check_images)), spec.microbatch, group)
        images = load_images(check, spec.check_images, layout.meta_model.pretrained_cfg, spec.seed) \
            if reads_images else None
        batches = [None if images is None else
                   torch.stack([images[i] if i is not None else torch.zeros_like(images[0]) for i in m])
                   for m in micro]
        logits = worker.logits(batches)
        if logits is not None:
            path = write_logits(logits[: spec.check_images], P.LOGITS_FILE_TRAINED)
            emitter.emit(Outputs(logits_file=str(path), logits_shape=[spec.check_images, int(logits.shape[1])]))
    part = None
    if spec.save and (spec.mode == "pipeline" or rank == 0):
        from safetensors.torch import save_file

        part = P.train_part_file(rank)
        tensors = {k: v.detach().contiguous() for k, v in worker.module.model.state_dict().items()}
        if spec.keep_compressor:
            tensors.update(kept_halves(spec, layout, rank, worker.module))
        tmp = Path(f".{part}.tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, part)
    emitter.emit(TrainEnd(stage=rank, status="ok", steps=timed_steps, seconds=round(timed_s, 6),
                 times=totals.rounded(), bytes_sent=getattr(worker, "bytes_sent", 0),
                 grad_bytes_sent=getattr(worker, "grad_bytes_sent", None),
                 allreduce_s=round(getattr(getattr(worker, "clock", None), "reduce_s", 0.0), 6),
                 part_file=part, heads=attention_heads(worker.module.model), peak_rss_mb=peak_rss_mb()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_TRAIN, rank=int(os.environ.get("RANK", "0")))
    return run_main(emitter, lambda: _train(TrainSpec.load(args.spec), emitter))


if __name__ == "__main__":
    sys.exit(main())
