"""Phase 7, collect and compare: the last stage's check logits, fetched and kept beside the serial run's,
and how far apart they are (bit-identical unless `--atol` allows more)."""

from __future__ import annotations

from dataclasses import dataclass

from pictl.run.baselines import Baseline
from pictl.run.context import RunContext
from pictl.run.placement import Placement
from pictl.run.telemetry import max_abs_diff
from remote import protocol as P
from remote.spec import RunSpec


@dataclass(frozen=True)
class Comparison:
    max_abs_diff: float | None
    """None when the two logit files do not even have the same size."""
    outputs_match: bool


async def collect_and_compare(ctx: RunContext, placement: Placement, spec: RunSpec,
                              baseline: Baseline) -> Comparison:
    assert ctx.record is not None
    if spec.stages > 1:
        last = placement.node_of(spec.stages - 1).host
        logits = await ctx.transport(last).get_bytes(f"{last.run_dir(spec.run_id)}/{P.LOGITS_FILE_PIPELINE}")
        ctx.record.save_bytes(P.LOGITS_FILE_PIPELINE, logits)
    else:
        logits = baseline.logits
    ctx.record.save_bytes(P.LOGITS_FILE_SERIAL, baseline.logits)
    diff = max_abs_diff(logits, baseline.logits)
    return Comparison(diff, diff is not None and diff <= ctx.options.atol)
