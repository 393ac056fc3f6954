"""Why not N times: the gap between N stages and the measured speedup, taken apart into measured terms.

A pure function of a run's summary. All times are per image, over the timed passes (P passes of I images, M
microbatches, N stages, F = (M + N - 1) / M). For each stage i: c_i its compute, d_i the time its main thread
waited for a CPU other work held (the kernel's schedstat run delay less the host's quota throttling), c'_i = c_i -
d_i. b is the stage with the most compute. On b: k_b its communication (encoding and decoding, posting
receives and sends, waiting for input after the first microbatch of a pass, draining sends at the end) and
o_b the rest of its pass time (the schedule's own work: what is left after compute, communication and the
first microbatch's wait). t_s is the serial run's time per image (1 / its img/s), t_sc' its compute less
its own CPU wait. The chain, each step replacing one ideal by a measurement:

    N
    fill_drain      N / F                              GPipe fills and drains every pass
    imbalance       x c'_mean / c'_b                   the bottleneck's compute against the mean stage's
    split_overhead  = t_sc' / (F c'_b)                 the stages' compute added up against the serial's
    interference    = t_sc' / (F c_b)                  other processes' load on the bottleneck's CPU
    communication   = t_sc' / (F (c_b + k_b))          the bottleneck's wire time
    runtime         = t_sc' / (F (c_b + k_b + o_b))    the schedule's time on the bottleneck
    baseline        = t_s / (F (c_b + k_b + o_b))      the serial run's own CPU wait and loop, as measured
    residual        measured speedup - the above       shown, never hidden
    recut           (a re-cut run) the passes before the last re-cut, and its cold first pass
    host_lost       (a run that lost a host and went on with n of its N ranks) N - n, and the passes before the
                    loss: the chain above is then taken over the last segment's passes, with n for N

A run that re-cut (`remote.floor.recut`) is taken apart over its settled passes (those after the last re-cut's
cold first pass, from their own per-pass counters), so every term describes one split; the passes before
are the `recut` term: the whole run's speedup less the settled passes'.

With R replicas (`--replicas`), N is R x S ranks: each rank's figures are per image of its replica's share
(I / R images a pass, M / R microbatches), F = (M / R + S - 1) / (M / R), b is the slowest rank of any
replica (a pass lasts until the slowest replica is done), and every step after `imbalance` is R times one
replica's, since the replicas compute side by side.

Each term is the change in speedup points (negative: lost) and its share of the gap N - speedup; the terms
add up to the gap exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pictl.records.waterfall_view import waterfall_line as view_line
from pictl.records.waterfall_view import waterfall_view
from pictl.run.advice import Bottleneck, advice
from pictl.summary_figures import SerialTiming, WaterfallRecord, WaterfallTerm
from pictl.summary_models import RunSummary, StageFigures

TERMS = ("fill_drain", "imbalance", "split_overhead", "interference", "communication", "runtime", "baseline",
         "residual")
"""Every run's terms, in the chain's order."""
ALL_TERMS = (*TERMS, "recut", "host_lost")
"""With a re-cut run's own last term, and a run's that lost a host (`host_lost`: the ranks the loss took away, and
the passes before it, which ran another split on more hosts)."""
RESIDUAL_LIMIT = 0.05
"""A residual above this share of N raises the `waterfall_residual` flag: the model missed something."""


@dataclass(frozen=True)
class Settled:
    """A re-cut run's passes after its last re-cut (and that re-cut's cold first pass)."""

    stages: list[dict[str, Any]]
    """Per rank, the counters summed over those passes (the keys of a summary's `per_stage` totals)."""
    passes: int
    speedup: float
    """Their mean img/s over the serial run's."""
    first: int
    """The first settled pass (0-based)."""
    ranks_before: int | None = None
    """A run that lost a host and went on with fewer ranks: the ranks it began with (the N its gap is to)."""


def waterfall(summary: RunSummary | dict[str, Any], settled: Settled | None = None) -> dict[str, Any] | None:
    """The speedup waterfall of a pipeline run's summary (the model, or the dict the run writes), or None when it
    has no figures to take apart."""
    # A dict (the run's, being built; a test's, partial) is read by field as it is, never coerced or refused.
    s = summary if isinstance(summary, RunSummary) else RunSummary.view(summary)
    n, speedup, r = getattr(s, "stages", None), s.speedup, s.replicas or 1
    images, chunk = s.images, s.chunk or 1
    repeats = settled.passes if settled else s.repeats
    serial_ips = s.serial_ips
    # The counters as the run summed them (a settled re-cut's: the same keys), read by name.
    counted = settled.stages if settled else s.per_stage or []
    if not all(isinstance(st, StageFigures | dict) for st in counted):
        return None
    stages = [st if isinstance(st, StageFigures) else StageFigures.view(st) for st in counted]
    if not (isinstance(n, int) and n * r > 1 and speedup and serial_ips and images and repeats
            and len(stages) == n * r):
        return None
    per = float(images * repeats) / r  # the images each rank computed
    if not all(_number(st.compute_s) and _number(st.run_delay_s or 0.0) for st in stages):
        return None
    c = [float(st.compute_s or 0.0) / per for st in stages]
    d = [float(st.run_delay_s or 0.0) / per for st in stages]
    b = max(range(n * r), key=lambda i: c[i])
    bst = stages[b]

    def total(key: str) -> float:
        return float(getattr(bst, key, None) or 0.0) / per

    codec = total("compress_s") + total("decompress_s")
    waits = total("recv_wait_s") - total("first_wait_s")
    k_b = codec + total("recv_post_s") + waits + total("send_post_s") + total("drain_s")
    pass_b = total("pass_s") or total("compute_s") + total("wait_s") + total("send_s")
    o_b = pass_b - c[b] - codec - total("recv_post_s") - total("recv_wait_s") - total("send_post_s") - total("drain_s")
    clean = [max(ci - di, 1e-12) for ci, di in zip(c, d, strict=True)]
    m = -(-images // chunk) // r  # each replica's microbatches
    f = (m + n - 1) / m
    t_s = 1.0 / serial_ips
    recorded = s.serial_timing
    timing = recorded if isinstance(recorded, SerialTiming) else SerialTiming.view(
        recorded if isinstance(recorded, dict) else None)
    t_sc = (timing.compute_per_image_s or t_s) - (timing.run_delay_per_image_s or 0.0)
    if t_sc <= 0 or c[b] <= 0:
        return None
    steps = [float(n * r), n * r / f]
    steps.append(steps[-1] * (sum(clean) / (n * r)) / clean[b])
    steps.append(r * t_sc / (f * clean[b]))
    steps.append(r * t_sc / (f * c[b]))
    steps.append(r * t_sc / (f * (c[b] + k_b)))
    steps.append(r * t_sc / (f * (c[b] + k_b + o_b)) if c[b] + k_b + o_b > 0 else steps[-1])
    steps.append(t_s / t_sc * steps[-1])
    steps.append(settled.speedup if settled else float(speedup))
    names = list(TERMS)
    lost_ranks = settled.ranks_before if settled else None
    if settled:
        steps.append(float(speedup))
        names.append("host_lost" if lost_ranks else "recut")
    if lost_ranks:  # N is the ranks the run began with: the loss took N - n of them, then the passes before it
        steps.insert(0, float(lost_ranks))
        names.insert(0, "host_lost")
    top = float(lost_ranks or n * r)
    gap = top - float(speedup)
    points: dict[str, float] = {}
    for name, before, after in zip(names, steps[:-1], steps[1:], strict=True):
        points[name] = points.get(name, 0.0) + after - before
    terms = [WaterfallTerm(term=name, points=round(change, 4),
                           share=round(-change / gap, 4) if abs(gap) > 1e-9 else None)
             for name, change in points.items()]
    losses = [t for t in terms if t.points < 0]
    dominant = min(losses, key=lambda t: t.points).term if losses else None
    # What would reduce the dominant term, worded from this run's options (never its own policy, never a
    # smaller chunk than 1).
    shape = Bottleneck(stages=n, replicas=r, microbatches=m, rank=b, compute_s=c[b], mean_compute_s=sum(c) / len(c),
                       wait_for_cpu_s=d[b])
    told = advice(dominant, summary if isinstance(summary, dict) else summary.written(), shape) if dominant else None
    return {"stages": int(top), "replicas": r, "speedup": round(float(speedup), 4), "gap": round(gap, 4),
            "bottleneck_rank": b,
            "microbatches": m, "terms": [t.written() for t in terms], "dominant": dominant,
            "settled_from_pass": settled.first if settled else None,
            "advice": told,
            "per_image_ms": {"serial": round(t_s * 1000, 3), "serial_compute": round(t_sc * 1000, 3),
                             "bottleneck_compute": round(c[b] * 1000, 3), "bottleneck_wait_for_cpu":
                             round(d[b] * 1000, 3), "bottleneck_communication": round(k_b * 1000, 3),
                             "bottleneck_runtime": round(o_b * 1000, 3)}}


def _number(value: object) -> bool:
    """A counter the arithmetic takes: a number (a record's string or list is none: no waterfall)."""
    return isinstance(value, int | float)


def waterfall_line(w: dict[str, Any]) -> str:
    """One line: the measured speedup of N, then every term that cost (or gave) a hundredth or more, largest
    loss first, and the dominant term with what would reduce it (the readers' own form, `records.waterfall_view`)."""
    view = waterfall_view(w)
    if view is not None:
        return view_line(view)
    record = WaterfallRecord.model_construct(**w)  # (as recorded: a shape the view does not read)
    return f"{getattr(record, 'speedup', None)}x of {getattr(record, 'stages', None)}"
