"""The serial baseline: the whole model on one host, same inputs, same protocol.

    python -m remote.runtime.serial --spec spec.json [--plan]

`--plan` first checks the spec and emits its stage plan, as `remote.runtime.plan` does:
the controller needs both on the first run, and one process imports torch once.

Batches are the pipeline's microbatches (same size, same zero padding), so the
logits are computed with the same shapes and compare bit for bit.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import torch

from remote.data.images import load_images, load_labels, microbatches
from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.run_records import Progress, RunEnd, RunStart, StageReady, Throughput
from remote.floor.spec import RunSpec
from remote.host.cpuwait import Span
from remote.runtime.plan import emit_plan
from remote.runtime.timing import emit_mb_times
from remote.toolkit.artifact import meta_model_for
from remote.toolkit.cnn_pieces import pieces_for
from remote.toolkit.kept_pair import whole_forward
from remote.toolkit.measure import StageCounters, current_rss_mb, peak_rss_mb, run_main, set_threads
from remote.toolkit.model import materialize
from remote.toolkit.numerics import apply_numerics
from remote.toolkit.outputs import open_checkpoint, report_outputs


def _run(spec: RunSpec, emitter: Emitter, *, plan: bool = False, logits_file: str = P.LOGITS_FILE_SERIAL) -> None:
    threads = set_threads(spec.threads)
    import_rss_mb = current_rss_mb()
    if plan:
        emit_plan(spec, emitter)
    emitter.emit(RunStart(world_size=1, stages=1, model=spec.model, images=spec.images, chunk=spec.chunk,
                          threads=threads, torch=torch.__version__, import_rss_mb=import_rss_mb))
    t0 = time.perf_counter()
    model = meta_model_for(spec)
    pieces_for(model, spec.model)  # (a model pictl cannot split is refused here as everywhere: one line)
    materialize(model, seed=spec.seed, checkpoint=open_checkpoint(spec))
    params = sum(p.numel() for p in model.parameters())  # (an int8 Linear's weights are no Parameters)
    engine = apply_numerics(model, spec.numerics)
    forward = whole_forward(model)  # (a trained model with a kept compressor pair runs it between two pieces)
    mbs = microbatches(load_images(spec.data, spec.images, model.pretrained_cfg, spec.seed), spec.chunk)
    labels = load_labels(spec.data, spec.images)
    emitter.emit(StageReady(stage=0, modules=["<whole model>"], params=params,
                            load_s=round(time.perf_counter() - t0, 3), rss_mb=current_rss_mb(),
                            peak_rss_mb=peak_rss_mb(), engine=engine))

    totals = StageCounters()
    check_logits = predictions = None
    for repeat in range(spec.warmup + spec.repeats):
        timed = repeat >= spec.warmup
        outs, per_mb = [], []
        span = Span()
        start = span.wall
        with torch.no_grad():
            for mb in mbs:
                began = time.perf_counter()
                outs.append(forward(mb))
                per_mb.append(time.perf_counter() - began)
        seconds = time.perf_counter() - start
        counters = StageCounters(microbatches=len(mbs), compute_s=seconds, pass_s=seconds,
                                 run_delay_s=span.interference())
        emitter.emit(Progress(stage=0, phase="timed" if timed else "warmup",
                              repeat=repeat - spec.warmup if timed else repeat, microbatches_total=len(mbs),
                              **counters.rounded()))
        if timed:
            totals.add(counters)
            emit_mb_times(emitter, "serial", "timed", repeat - spec.warmup, per_mb)  # an image's latency, alone
            emitter.emit(Throughput(repeat=repeat - spec.warmup, images=spec.images, seconds=round(seconds, 6),
                                    ips=round(spec.images / seconds, 4)))
        if predictions is None:
            logits = torch.cat(outs)[: spec.images]
            predictions = logits.argmax(dim=1)
            check_logits = logits[: spec.check_images].clone()
    report_outputs(emitter, spec, check_logits, predictions, labels, logits_file)
    emitter.emit(RunEnd(stage=0, status="ok", peak_rss_mb=peak_rss_mb(), **totals.rounded()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--plan", action="store_true", help="emit the stage plan first")
    parser.add_argument("--fp32-reference", action="store_true",
                        help="run the spec in fp32 whatever its numerics, writing the logits to their own file")
    args = parser.parse_args(argv)
    emitter = Emitter(P.ROLE_SERIAL)

    def measure() -> None:
        spec = RunSpec.load(args.spec)
        if args.fp32_reference:
            spec = replace(spec, numerics="fp32")
        _run(spec, emitter, plan=args.plan,
             logits_file=P.LOGITS_FILE_SERIAL_FP32 if args.fp32_reference else P.LOGITS_FILE_SERIAL)
    return run_main(emitter, measure)


if __name__ == "__main__":
    sys.exit(main())
