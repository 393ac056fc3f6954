"""Measure what the balanced policy needs on this host: each piece's time, each cut's bytes, and what
sending and receiving a stage's state costs here.

    python -m remote.profiling.costs --model NAME --num-classes N --chunk C --threads T [--seconds 2]

Runs the whole model, piece by piece, on one microbatch of the run's chunk size with
the run's thread count, back to back for `--seconds` (at least `MIN_PASSES` passes),
timing every piece inside every pass. A piece's cost is the trimmed mean of its
times over the passes: every number is taken at the speed the host keeps up (a CPU
quota or a throttling SoC is in every pass, not just in a separate scale step), and
no piece is judged by a cold first call or one preempted call. The spread of the
passes' totals is recorded; a profile whose spread is over `MAX_SPREAD` is measured
again (at most `ATTEMPTS` times, keeping the steadiest).

The copy cost is a loopback TCP stream of stage-sized messages (what gloo's send and
receive do with the CPU), in seconds per byte moved by each side.

Emits one `costs` event.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from dataclasses import replace

import torch

from remote.data.images import load_images
from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.run_records import Costs
from remote.floor.spec import DataSpec, RunSpec
from remote.toolkit.measure import run_main, set_threads
from remote.toolkit.model import count_params
from remote.toolkit.outputs import open_checkpoint
from remote.toolkit.stage import build_stage, layout_for

MIN_PASSES = 8
MAX_SPREAD = 0.10
"""(p90 - p10) / median of the passes' totals above which a profile is measured again."""
ATTEMPTS = 3
TRIM = 0.2
"""Share of the fastest and of the slowest times left out of each piece's mean."""


def _bytes(state: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in state)


def trimmed_mean(values: list[float], trim: float = TRIM) -> float:
    ordered = sorted(values)
    cut = int(len(ordered) * trim)
    kept = ordered[cut:len(ordered) - cut] or ordered
    return sum(kept) / len(kept)


def spread(totals: list[float]) -> float:
    """(p90 - p10) / median: how much the passes disagree."""
    if len(totals) < 2:
        return 0.0
    deciles = statistics.quantiles(totals, n=10, method="inclusive")
    return (deciles[-1] - deciles[0]) / statistics.median(totals)


@torch.no_grad()
def time_pieces(model: torch.nn.Module, pieces: list, state: tuple[torch.Tensor, ...], seconds: float,
                min_passes: int = MIN_PASSES) -> tuple[list[list[float]], list[float]]:
    """Per piece, its time in every whole pass; and each pass's total."""
    s = state
    for piece in pieces:  # one untimed pass: first-call allocations are nobody's cost
        s = piece.fn(model, s)
    times: list[list[float]] = [[] for _ in pieces]
    totals: list[float] = []
    started = time.perf_counter()
    while len(totals) < min_passes or time.perf_counter() - started < seconds:
        s, begin = state, time.perf_counter()
        for i, piece in enumerate(pieces):
            t0 = time.perf_counter()
            s = piece.fn(model, s)
            times[i].append(time.perf_counter() - t0)
        totals.append(time.perf_counter() - begin)
    return times, totals


def copy_cost(message_bytes: int, messages: int = 16) -> float:
    """Seconds per byte each side spends moving `message_bytes` messages over loopback TCP."""
    payload = bytes(message_bytes)
    server = socket.create_server(("127.0.0.1", 0))
    received = [0]

    def sink() -> None:
        conn, _ = server.accept()
        with conn:
            view = bytearray(1 << 20)
            while (n := conn.recv_into(view)) > 0:
                received[0] += n

    reader = threading.Thread(target=sink, daemon=True)
    reader.start()
    with socket.create_connection(server.getsockname()) as conn:
        conn.sendall(payload)  # warm the connection's buffers
        start = time.perf_counter()
        for _ in range(messages):
            conn.sendall(payload)
    reader.join(timeout=30)
    elapsed = time.perf_counter() - start
    server.close()
    # Sender and receiver share the host: on a capped host they share its quota, as a stage's
    # send and the next microbatch's receive do.
    return elapsed / (2 * messages * message_bytes)


def measure(spec: RunSpec, seconds: float) -> dict:
    started = time.time()
    set_threads(spec.threads)
    whole = replace(spec, stages=1, policy="equal", split_points=[])
    layout = layout_for(whole)
    model = build_stage(whole, layout, layout.stages[0], open_checkpoint(whole)).model
    # Time does not depend on pixel values: synthetic images, whatever the run's data set.
    first: tuple[torch.Tensor, ...] = (load_images(DataSpec(), spec.chunk, layout.meta_model.pretrained_cfg,
                                                   spec.seed),)
    entering, s = [], first
    with torch.no_grad():
        for piece in layout.pieces:
            entering.append(_bytes(s))
            s = piece.fn(model, s)
    best: tuple[float, list[list[float]], list[float]] | None = None
    attempts = 0
    while attempts < ATTEMPTS and (best is None or best[0] > MAX_SPREAD):
        times, totals = time_pieces(model, layout.pieces, first, seconds)
        attempts += 1
        if best is None or spread(totals) < best[0]:
            best = (spread(totals), times, totals)
    assert best is not None
    variation, times, totals = best
    return {"pieces": [p.name for p in layout.pieces], "compute_s": [round(trimmed_mean(t), 7) for t in times],
            "passes": len(totals), "pass_ms": round(statistics.median(totals) * 1000, 3),
            "spread": round(variation, 4), "attempts": attempts,
            "comm_s_per_byte": copy_cost(max(entering[1:], default=1 << 18)),
            "cut_bytes": entering,
            "piece_bytes": [4 * count_params(layout.meta_model, p.modules) for p in layout.pieces],
            "chunk": spec.chunk, "threads": spec.threads, "model": spec.model, "torch": torch.__version__,
            "measured_from": round(started, 3), "measured_until": round(time.time(), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=RunSpec.tokens, help="token ids per input of a text model")
    parser.add_argument("--seconds", type=float, default=2.0, help="whole passes back to back for this long")
    parser.add_argument("--checkpoint", help="a pruned-model artifact: profile its own (narrower) layers")
    args = parser.parse_args(argv)
    spec = RunSpec(model=args.model, num_classes=args.num_classes, chunk=args.chunk, threads=args.threads,
                   checkpoint=args.checkpoint, tokens=args.tokens)
    emitter = Emitter(P.ROLE_PIPELINE)
    return run_main(emitter, lambda: emitter.emit(Costs(**measure(spec, args.seconds))))


if __name__ == "__main__":
    sys.exit(main())
