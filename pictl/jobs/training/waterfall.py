"""Why a training step takes longer than its compute shared evenly: the step's efficiency taken apart into
measured terms, like the inference waterfall (`pictl.run.waterfall`), from the time each rank spent per step
by category (data, forward, backward, optimizer, communication, idle: they add up to the step).

Per step, on rank r: fb_r its forward and backward; b the rank with the most. T the bottleneck's step time,
F = (M + N - 1) / M for a pipeline of N stages and M microbatches (1 under DDP, where every rank computes the
whole model on its own samples). Efficiency E = mean(fb) / T, stepping down from 1:

    1
    bubble          mean(fb) / (F mean(fb))             the pipeline fills and drains every step
    imbalance       mean(fb) / (F fb_b)                 the bottleneck's compute against the mean rank's
    communication   ... / (F fb_b + comm_b)             sends, receives, all-reduce on the bottleneck
    optimizer       ... / (... + optimizer_b)
    data            ... / (... + data_b)                loading the step's samples
    residual        E - the above                       idle beyond the modelled bubble, and the rest
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pictl.job_summaries import TrainWaterfall
from pictl.summary_figures import Open

TERMS = ("bubble", "imbalance", "communication", "optimizer", "data", "residual")


class _Job(Open):
    """What the waterfall reads of a training job's summary (`TrainSummary`'s fields of these names), as the job
    builds it (`view`: never coerced)."""

    mode: str | None = None
    chunks: int | None = None
    breakdown: list[Any] | None = None


class _RankSteps(Open):
    """What the waterfall reads of one rank's row of the breakdown (`RankBreakdown`): a row without its rank or its
    seconds, or with seconds but no steps, gives no waterfall."""

    rank: int
    steps: int = 0
    seconds: dict[str, float]


def train_waterfall(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The efficiency waterfall of a pipeline or DDP training job, or None (a single run, no figures)."""
    job = _Job.view(summary)
    mode, ranks = job.mode, job.breakdown or []
    if mode not in ("pipeline", "ddp") or len(ranks) < 2:
        return None
    try:
        timed = [_RankSteps.model_validate(r) for r in ranks]
        per = [{k.removesuffix("_s"): v / r.steps for k, v in r.seconds.items()} for r in timed]
    except (ValidationError, ZeroDivisionError):
        return None
    fb = [p.get("forward", 0.0) + p.get("backward", 0.0) for p in per]
    b = max(range(len(fb)), key=lambda i: fb[i])
    step = sum(per[b].values())
    chunks = int(job.chunks or 1)
    n = len(ranks)
    f = (chunks + n - 1) / chunks if mode == "pipeline" else 1.0
    ideal = sum(fb) / n
    if ideal <= 0 or step <= 0:
        return None
    times = [ideal, ideal * f, fb[b] * f]
    for key in ("comm", "optimizer", "data"):
        times.append(times[-1] + per[b].get(key, 0.0))
    times.append(step)
    eff = [ideal / t for t in times]
    points = [round(after - before, 4) for before, after in zip(eff[:-1], eff[1:], strict=True)]
    losses = [(name, p) for name, p in zip(TERMS, points, strict=True) if p < 0]
    return {"ranks": n, "efficiency": round(eff[-1], 4), "bottleneck_rank": timed[b].rank,
            "terms": [{"term": name, "points": p} for name, p in zip(TERMS, points, strict=True)],
            "dominant": min(losses, key=lambda loss: loss[1])[0] if losses else None,
            "step_ms": round(step * 1000, 3), "ideal_step_ms": round(ideal * 1000, 3)}


def train_waterfall_line(w: TrainWaterfall) -> str:
    parts = [f"{t.term} {-t.points:.2f}" for t in sorted(w.terms, key=lambda t: t.points) if abs(t.points) >= 0.005]
    return (f"efficiency {_fixed(w.efficiency, '.2f')} of 1 (step {_fixed(w.step_ms, '.0f')} ms, compute shared "
            f"evenly {_fixed(w.ideal_step_ms, '.0f')} ms): " + ", ".join(parts))


def _fixed(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
