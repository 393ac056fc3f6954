"""`pictl sweep --train`: one training job per mode, schedule, rank count and chunk count, side by side.

The global batch stays the same, so sweeping `--chunks` sweeps the microbatch (the split size): too small
and a step is bound by its transfers and per-microbatch overheads, too large and the pipeline's bubbles
grow. `single` runs once per chunk count (its microbatches are accumulated, so it is the reference every
mode's samples/s is compared with at that count); a ddp point whose chunks do not share evenly among its
ranks is left out and listed. The table is rewritten after every job (an interrupted sweep keeps what it
measured); plots: samples/s against chunks per mode, and where a step's time goes per mode.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster, format_validation_error
from pictl.job_summaries import TrainSummary
from pictl.jobs.sweep import write_tables
from pictl.jobs.training.options import TrainOptions, chunks_refusal
from pictl.jobs.training.session import TrainSession, placement
from pictl.records.runs import write_json_atomic
from pictl.run.hosts import held_hosts
from pictl.summary_figures import Open
from remote.floor import protocol as P

COLUMNS = ("mode", "schedule", "stages", "chunks", "workers", "wire", "microbatch", "status", "samples_per_s",
           "speedup", "loss_agreement", "loss_last", "top1", "avg_MBps", "peak_MBps", "compute_ms", "step_ms",
           "data_share", "comm_share", "idle_share", "peak_rss_mb", "job_id", "error")
CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)


@dataclass(frozen=True)
class TrainPoint:
    mode: str
    stages: int
    chunks: int
    schedule: str = "gpipe"
    workers: int = 0
    """Data-loading processes per image-reading rank."""
    wire: str = "fp32"
    """Pipeline: what crosses each cut, both ways."""

    @property
    def label(self) -> str:
        how = f"{self.mode} ({self.schedule})" if self.mode == "pipeline" else self.mode
        loaders = f", {self.workers} loader worker(s)" if self.workers else ""
        wire = f", wire {self.wire}" if self.wire != "fp32" else ""
        return f"{how}, {self.stages} rank(s), {self.chunks} chunk(s){loaders}{wire}"


class TrainSweepRow(Open):
    """A row of a training sweep's sweep.json: the point, and what its job measured (`row_of`; a failed job's row
    holds the point, its status and its error). Its keys are written in this order, `speedup` last
    (`with_speedups`: over single's samples/s at the same chunk count and loader workers)."""

    mode: str
    stages: int
    chunks: int
    schedule: str | None = None
    """Pipeline only (None for single and ddp)."""
    workers: int = 0
    wire: str = "fp32"
    microbatch: int | None = None
    status: str
    samples_per_s: float | None = None
    loss_agreement: str | None = None
    """`ok (max rel diff)` or `DIFFERS (...)`: the pipeline's losses against single's."""
    loss_last: float | None = None
    top1: float | None = None
    avg_MBps: float | None = None
    peak_MBps: float | None = None
    compute_ms: float | None = None
    """Forward and backward per step, mean over the ranks."""
    step_ms: float | None = None
    data_share: float | None = None
    comm_share: float | None = None
    idle_share: float | None = None
    peak_rss_mb: float | None = None
    job_id: str | None = None
    per_step_ms: dict[str, float | None] = {}
    """Per category (`CATEGORIES`): ms per step, mean over the ranks."""
    error: str | None = None
    speedup: float | None = None


def train_points(cluster: Cluster, base: TrainOptions, modes: list[str], stages: list[int], chunks: list[int],
                 schedules: list[str], workers: list[int] | None = None, wires: list[str] | None = None,
                 ) -> tuple[list[TrainPoint], list[str]]:
    """The jobs in run order (single first for each chunk count and worker count), and the combinations left
    out (why)."""
    points: list[TrainPoint] = []
    skipped: list[str] = []
    for c, w in ((c, w) for c in chunks for w in (workers or [base.workers])):
        for mode in modes:
            for s in ([1] if mode == "single" else [s for s in stages if s > 1]):
                for sched, wire in ((k, x) for k in (schedules if mode == "pipeline" else ["gpipe"])
                                    for x in ((wires or [base.wire]) if mode == "pipeline" else ["fp32"])):
                    point = TrainPoint(mode, s, c, sched, w, wire)
                    refused = chunks_refusal(mode, sched, s, c)
                    if refused:
                        skipped.append(f"{point.label}: {refused}")
                        continue
                    options = options_for(base, point)  # (its ConfigError names the point)
                    try:
                        placement(cluster, options)
                    except E.ConfigError as exc:
                        raise E.ConfigError(f"sweep point {point.label}: {exc}") from None
                    if point not in points:
                        points.append(point)
    if not points:
        raise E.ConfigError("the sweep has no point that can run")
    return points, skipped


def options_for(base: TrainOptions, point: TrainPoint) -> TrainOptions:
    values = {**base.model_dump(), "mode": point.mode, "stages": point.stages, "chunks": point.chunks,
              "schedule": point.schedule, "workers": point.workers, "wire": point.wire,
              # The base's split points where they cut this point's stages (a sweep at one stage count).
              "split": base.split if point.mode == "pipeline" and len(base.split) == point.stages - 1 else []}
    try:
        return TrainOptions(**values)
    except ValidationError as exc:  # the first problem, as `pictl train` says it (not pydantic's URL line)
        raise E.ConfigError(format_validation_error(f"sweep point {point.label}", exc)) from None


def row_of(point: TrainPoint, summary: TrainSummary | None, error: str | None = None) -> dict[str, Any]:
    """The point's row as sweep.json holds it (`TrainSweepRow`, written: the keys given, in its order)."""
    row = {**asdict(point), "schedule": point.schedule if point.mode == "pipeline" else None}
    if summary is None:
        return TrainSweepRow(**row, status="failed", error=error).written()
    ranks = summary.breakdown

    def share(key: str) -> float | None:
        values = [v for r in ranks if (v := r.share.get(key)) is not None]
        return round(sum(values) / len(values), 4) if values else None

    check = summary.agreement
    losses = summary.losses
    avg = [link.sender.avg_MBps for link in summary.links if link.sender.avg_MBps is not None]
    peak = [link.sender.peak_MBps for link in summary.links if link.sender.peak_MBps is not None]
    ips = summary.samples_per_s
    return TrainSweepRow(
        **row, microbatch=summary.microbatch, status=summary.status, samples_per_s=ips,
        loss_agreement=None if not check or check.max_rel_diff is None else
        f"{'ok' if check.passed else 'DIFFERS'} ({check.max_rel_diff})",
        loss_last=losses[-1].loss if losses else None, top1=summary.top1,
        # The source's table: bandwidth over the busiest link (sender's side), computation and time per batch.
        avg_MBps=max(avg, default=None), peak_MBps=max(peak, default=None),
        compute_ms=_mean([(r.per_step_ms.get("forward") or 0) + (r.per_step_ms.get("backward") or 0)
                          for r in ranks if r.per_step_ms.get("forward") is not None]),
        step_ms=round(1000 * summary.batch_size / ips, 2) if ips else None,
        data_share=share("data"), comm_share=share("comm"), idle_share=share("idle"),
        peak_rss_mb=max((r.peak_rss_mb for r in ranks if r.peak_rss_mb is not None), default=None),
        job_id=summary.job_id, per_step_ms={c: _mean([r.per_step_ms.get(c) for r in ranks]) for c in CATEGORIES},
        error=error).written()


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 3) if present else None


def with_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's samples/s over single's at the same chunk count and loader workers (None without one)."""
    viewed = [TrainSweepRow.view(r) for r in rows]
    single = {(v.chunks, v.workers): v.samples_per_s for v in viewed if v.mode == "single" and v.status == "ok"}
    return [{**r, "speedup": round(v.samples_per_s / base, 3)
             if v.samples_per_s and (base := single.get((v.chunks, v.workers))) else None}
            for r, v in zip(rows, viewed, strict=True)]


def write_table(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    rows = with_speedups(rows)
    write_json_atomic(out / "sweep.json", {**meta, "kind": "train", "rows": rows})
    write_tables(out, rows, COLUMNS, COLUMNS[:-2])


def plot(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """samples/s against chunks per mode (and rank count); the time breakdown of a step per job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in map(TrainSweepRow.view, with_speedups(rows)) if r.status == "ok" and r.samples_per_s]
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    series: dict[str, list[TrainSweepRow]] = {}
    for r in ok:
        name = r.mode + (f" {r.schedule}" if r.schedule else "") + f", {r.stages} rank(s)"
        series.setdefault(name, []).append(r)
    for name, group in series.items():
        group.sort(key=lambda r: r.chunks)
        ax.plot([r.chunks for r in group], [r.samples_per_s or 0.0 for r in group], "o-", label=name)  # (each has one)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks (microbatches per step; the microbatch shrinks as they grow)")
    ax.set_ylabel("samples / s")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "samples_vs_chunks.png", dpi=120)
    plt.close(fig)
    written.append(out / "samples_vs_chunks.png")
    fig, ax = plt.subplots(figsize=(max(6, len(ok) * 0.7), 4))
    bottoms = [0.0] * len(ok)
    for c in CATEGORIES:
        values = [r.per_step_ms.get(c) or 0.0 for r in ok]
        ax.bar(range(len(ok)), values, bottom=bottoms, label=c)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.set_xticks(range(len(ok)), [f"{r.mode}{' ' + r.schedule if r.schedule else ''}\n"
                                   f"{r.stages}r c{r.chunks}" for r in ok], fontsize=7)
    ax.set_ylabel("ms per step (mean over ranks)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "time_breakdown.png", dpi=120)
    plt.close(fig)
    written.append(out / "time_breakdown.png")
    return written


async def run_train_sweep(cluster: Cluster, base: TrainOptions, points: list[TrainPoint], skipped: list[str],
                          out: Path, *, on_event: EventSink | None = None, wait: bool = False,
                          ) -> list[dict[str, Any]]:
    out.mkdir(parents=True)
    meta = {"started_at": time.time(), "cluster": cluster.source, "options": base.model_dump(),
            "points": [asdict(p) for p in points], "skipped": skipped}
    for why in skipped:
        if on_event:
            on_event(Phase("sweep", f"left out: {why}"))
    rows: list[dict[str, Any]] = []
    # Every host held once for the whole sweep (connected, leased under the sweep's name, the code pushed once);
    # each job borrows them. A host that is down is one error naming it before the first job.
    async with held_hosts(cluster, "train-sweep", out.name, wait=wait, on_event=on_event) as held:
        for i, point in enumerate(points, 1):
            if on_event:
                on_event(Phase("sweep", f"job {i}/{len(points)}: {point.label}"))
            session = TrainSession(cluster, options_for(base, point), on_event=on_event, root=out / "jobs",
                                   wait=wait, hosts=held)
            try:
                rows.append(row_of(point, await session.run()))
            except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
                rows.append(row_of(point, session.summary, error=str(exc)))
                await held.mend()  # a host whose connection the job lost: connected, leased, pushed again
            except E.Interrupted:
                rows.append(row_of(point, session.summary, error="interrupted"))
                write_table(out, rows, {**meta, "interrupted": True})
                raise
            write_table(out, rows, meta)
    plot(out, rows)
    return with_speedups(rows)
