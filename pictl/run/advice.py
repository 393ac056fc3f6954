"""What would reduce a waterfall term, worded from the run's own options and figures.

Advice a user cannot follow is worse than none: a `balanced` run is never told to try `--policy balanced`, a run
at chunk 1 never to take a smaller `--chunk`, a run already on a compressing wire never to compress, and other
work on a host is pointed at what shows it (`pictl check`'s busy cores and run queue). `advice` is a pure
function of the summary's figures (`pictl.run.waterfall` calls it for the dominant term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pictl.summary_models import RunSummary

__all__ = ["Bottleneck", "advice"]

FILL_TARGET = 0.95
"""The share of N the fill/drain advice aims at (the `fill_drain_bound` flag's threshold)."""
COMPRESSING = ("fp16", "bf16", "int8", "lowrank")


@dataclass(frozen=True)
class Bottleneck:
    """The figures the advice names: the run's shape and its bottleneck rank, per image (seconds)."""

    stages: int
    """Stages in one replica (S)."""
    replicas: int
    microbatches: int
    """Each replica's microbatches per pass (M)."""
    rank: int
    compute_s: float
    mean_compute_s: float
    wait_for_cpu_s: float


def advice(term: str, s: dict[str, Any], b: Bottleneck) -> str:
    """What would reduce `term` for this run (its options: policy, chunk, images, wire, repeats, baseline)."""
    run = RunSummary.view(s)  # (the summary as the run wrote it, or is writing it: nothing coerced)
    chunk = run.chunk or 1
    # (the wire, the stage rows and the baseline are read as written: their models require the fields read here,
    # and a summary lacking one still gets advice)
    wire = str((s.get("wire") or {}).get("format") or "fp32")
    host = next((st.get("host") for st in s.get("per_stage") or [] if st.get("rank") == b.rank), None) or "its host"
    if term == "fill_drain":
        keep = b.microbatches / (b.microbatches + b.stages - 1)
        need = math.ceil(round(FILL_TARGET / (1 - FILL_TARGET) * (b.stages - 1), 6)) * chunk * b.replicas
        smaller = f", or a smaller --chunk than {chunk}" if chunk > 1 else ""
        return (f"more images per pass: {b.microbatches} microbatches through {b.stages} stages keep {keep:.0%} of "
                f"them busy, {need} images or more keep {FILL_TARGET:.0%}{smaller}")
    if term == "imbalance":
        slowest = (f"rank {b.rank} computes {b.compute_s * 1000:.0f} ms per image against the mean stage's "
                   f"{b.mean_compute_s * 1000:.0f} ms")
        if run.policy == "balanced":
            refined = "" if run.refine else "; --refine measures the split and corrects it"
            return (f"{slowest} under balanced's split: move a cut off it with an explicit --split (cuts fall on "
                    f"module boundaries, and a host's cost profile may be stale: `pictl costs`){refined}")
        if run.policy == "explicit":
            return f"{slowest}: move a cut off it (--split), or --policy balanced to place the cuts by measured cost"
        return f"{slowest}: --policy balanced, or move a cut toward the lighter stage (--split)"
    if term == "split_overhead":
        if b.replicas > 1:
            return ("the copies computed slower than the serial run alone: copies on one machine share its memory "
                    "bandwidth and caches (`pictl check`), or their hosts are slower than the serial run's")
        return "cuts at block boundaries, and the serial run's thread count for every stage"
    if term == "interference":
        return (f"free {host}'s cores of other work (rank {b.rank} waited {b.wait_for_cpu_s * 1000:.1f} ms per image "
                "for a CPU): `pictl check` shows each host's busy cores and run queue")
    if term == "communication":
        ways = [] if wire.startswith(COMPRESSING) else ["a compressing --wire (fp16, int8)"]
        return ", ".join([*ways, f"a larger --chunk than {chunk}"]) + ", or a faster link"
    if term == "runtime":
        return f"a larger --chunk than {chunk}: fewer, larger microbatches spread the schedule's per-microbatch cost"
    if term == "baseline":
        base = s.get("baseline") or {}
        if run.serial_reused:
            return "--fresh-baseline on an idle host: this serial baseline was reused"
        return (f"measure the serial run again on an idle {base.get('host') or 'host'} (it ran slower or faster "
                "than its own compute)")
    if term == "residual":
        return f"more timed passes than {run.repeats or '-'} (--repeats): the pass-to-pass spread is not modelled"
    if term == "host_lost":
        return ("a host was lost during the run (`host_lost`) and it went on with fewer: run again with every host "
                "for the figure of N")
    if term == "recut":
        return "a host drifted during the run: the passes before the re-cut ran a worse split (see `recuts`)"
    return "-"
