"""Measure what the balanced policy needs on this host: each piece's time and each cut's bytes.

    python -m remote.costs --model NAME --num-classes N --chunk C --threads T [--repeats 5]

Runs the whole model piece by piece on one microbatch of the spec's chunk size,
with the spec's thread count, and emits one `costs` event: per piece its median
forward time (scaled to the speed the whole model keeps up for a second, see
`sustained_scale`), the bytes of the state entering it (what a stage that begins there
receives; inside a block that includes the residual) and its weight bytes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import torch

from remote import protocol as P
from remote.data import load_images
from remote.emit import Emitter
from remote.measure import run_main, set_threads
from remote.model import count_params
from remote.outputs import open_checkpoint
from remote.spec import DataSpec, RunSpec
from remote.stage import build_stage, layout_for


def _bytes(state: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in state)


SUSTAIN_S = 1.0
"""Ten CFS periods (100 ms each): long enough that a CPU quota throttles as it does in a run."""


@torch.no_grad()
def sustained_scale(model: torch.nn.Module, pieces: list, state: tuple[torch.Tensor, ...], burst_total: float) -> float:
    """How much slower the whole model runs back to back than its pieces timed one by one.

    A piece takes milliseconds, less than a CFS period: under a CPU quota (a throttled Pi, a
    capped container) it runs at full speed before the quota runs out, so per-piece medians show
    an unthrottled host and every capped host looks alike. Running the pieces back to back for
    ten periods measures the speed a stage really gets; the per-piece shape is kept and scaled
    to it. On an uncapped host the scale is about 1.
    """
    passes, start = 0, time.perf_counter()
    while True:
        s = state
        for piece in pieces:
            s = piece.fn(model, s)
        passes += 1
        elapsed = time.perf_counter() - start
        if elapsed >= SUSTAIN_S and passes >= 2:
            break
    return (elapsed / passes) / burst_total if burst_total > 0 else 1.0


def measure(spec: RunSpec, repeats: int) -> dict:
    set_threads(spec.threads)
    whole = replace(spec, stages=1, policy="equal", split_points=[])
    layout = layout_for(whole)
    model = build_stage(whole, layout, layout.stages[0], open_checkpoint(whole)).model
    # Time does not depend on pixel values: synthetic images, whatever the run's data set.
    state: tuple[torch.Tensor, ...] = (load_images(DataSpec(), spec.chunk, layout.meta_model.pretrained_cfg,
                                                   spec.seed),)
    first = state
    compute, entering = [], []
    with torch.no_grad():
        for piece in layout.pieces:
            entering.append(_bytes(state))
            piece.fn(model, state)  # warm-up: first-call allocations are not the piece's cost
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                out = piece.fn(model, state)
                times.append(time.perf_counter() - start)
            compute.append(statistics.median(times))
            state = out
    scale = sustained_scale(model, layout.pieces, first, sum(compute))
    return {"pieces": [p.name for p in layout.pieces], "compute_s": [round(t * scale, 7) for t in compute],
            "burst_compute_s": [round(t, 7) for t in compute], "sustained_scale": round(scale, 4),
            "cut_bytes": entering,
            "piece_bytes": [4 * count_params(layout.meta_model, p.modules) for p in layout.pieces],
            "chunk": spec.chunk, "threads": spec.threads, "model": spec.model, "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--checkpoint", help="a pruned-model artifact: profile its own (narrower) layers")
    args = parser.parse_args(argv)
    spec = RunSpec(model=args.model, num_classes=args.num_classes, chunk=args.chunk, threads=args.threads,
                   checkpoint=args.checkpoint)
    emitter = Emitter(P.ROLE_PIPELINE)
    return run_main(emitter, lambda: emitter.emit(P.COSTS, **measure(spec, args.repeats)))


if __name__ == "__main__":
    sys.exit(main())
