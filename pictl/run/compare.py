"""Phase 7, collect and compare: the last stage's check logits, fetched and kept beside the serial run's,
and how far apart they are: bit-identical (unless `--atol` allows more) with an exact wire; with a lossy
`--wire`, top-1 agreement over every image, at least `--min-agreement`."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from pictl.cluster.jobs import HostJob
from pictl.run.context import RunContext
from pictl.run.placement import Placement
from pictl.run.serial import Serial
from remote.floor import protocol as P
from remote.floor.spec import RunSpec


@dataclass(frozen=True)
class Comparison:
    max_abs_diff: float | None
    """None when the two logit files do not even have the same size."""
    outputs_match: bool
    lossy: bool = False
    agreement: float | None = None
    """Lossy wire: the share of images whose top-1 class is the serial run's."""
    mean_abs_diff: float | None = None


async def collect_and_compare(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec,
                              serial: Serial) -> Comparison:
    """The outputs set against the serial run's, each kept in the run's record (and the fp32 serial
    reference's, under other numerics)."""
    record, baseline = serial.record, serial.baseline
    if spec.stages * spec.replicas > 1:  # the last rank of all gathers every replica's outputs: the last node's
        last = placement.nodes[-1].host
        logits = await job.transport(last).get_bytes(f"{last.run_dir(spec.run_id)}/{P.LOGITS_FILE_PIPELINE}")
        record.save_bytes(P.LOGITS_FILE_PIPELINE, logits)
    else:
        logits = baseline.logits
    record.save_bytes(P.LOGITS_FILE_SERIAL, baseline.logits)
    if serial.fp32 is not None:
        record.save_bytes(P.LOGITS_FILE_SERIAL_FP32, serial.fp32.logits)
    diff = max_abs_diff(logits, baseline.logits)
    if not ctx.options.lossy_wire:
        return Comparison(diff, diff is not None and diff <= ctx.options.atol)
    agreed = agreement(logits, baseline.logits, spec.num_classes)
    if agreed is None:
        return Comparison(None, False, lossy=True)
    share, mean = agreed
    return Comparison(diff, share >= ctx.options.min_agreement, lossy=True, agreement=share, mean_abs_diff=mean)


def agreement(a: bytes, b: bytes, classes: int) -> tuple[float, float] | None:
    """Over two float32 logit files of `classes` columns: the share of rows with the same argmax, and the mean
    |a - b|; None when their sizes differ or are not whole rows."""
    if len(a) != len(b) or not a or len(a) % (4 * classes):
        return None
    xa, xb = array("f"), array("f")
    xa.frombytes(a)
    xb.frombytes(b)
    rows = len(xa) // classes
    same = 0
    for r in range(rows):
        ra, rb = xa[r * classes:(r + 1) * classes], xb[r * classes:(r + 1) * classes]
        same += ra.index(max(ra)) == rb.index(max(rb))
    return same / rows, sum(abs(x - y) for x, y in zip(xa, xb, strict=True)) / len(xa)


def max_abs_diff(a: bytes, b: bytes) -> float | None:
    """Largest |a - b| over two float32 logit files, or None when their sizes differ."""
    if len(a) != len(b) or len(a) % 4:
        return None
    xa, xb = array("f"), array("f")
    xa.frombytes(a)
    xb.frombytes(b)
    return max((abs(x - y) for x, y in zip(xa, xb, strict=True)), default=0.0)
