"""Finished runs, sweeps and training jobs as the experiment trackers people compare them in take them:
TensorBoard (`tensorboard --logdir RUNS`) and Weights & Biases (offline by default: a cluster often has no
internet; `wandb sync` uploads later). This module turns a record into a `Series`; `tracker_writers` writes it.

What goes in, read from the record alone (so a past run can be tracked too, `pictl track`):
- a run: its options as hyperparameters (TensorBoard's HParams, W&B's config); throughput, serial img/s,
  speedup, efficiency, accuracy, latency percentiles and the waterfall's terms; each stage's compute, wait and
  send per microbatch and peak RSS; each link's average and peak MB/s; over time, every pass's img/s, each
  rank's compute, wait and send per microbatch in every pass, and each host's CPU, memory, temperature and
  throttling (`samples.jsonl`, written by the run);
- a sweep: each point's throughput, speedup and efficiency, one step per point, in the order run;
- a training job: the loss at every step, top-1 at every evaluation, samples/s, each rank's time per category.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from pictl.events import read_line
from pictl.figure_text import figures
from pictl.job_summaries import TrainSummary
from pictl.records.files import event_files, read_lines, write_bytes_atomic
from pictl.summary_figures import Open, SweepRecord, SweepRowRecord
from pictl.summary_models import RunSummary
from remote.floor.run_records import Progress, Throughput

Tracker = Literal["tensorboard", "wandb"]
TRACKERS: tuple[str, ...] = get_args(Tracker)
SAMPLES_FILE = "samples.jsonl"
"""A run's host samples over time, one JSON object per line (`pictl.cluster.monitor.HostSample`)."""

Scalar = str | int | float | bool


@dataclass
class Series:
    """What a record gives a tracker: hyperparameters, final figures, and figures over time."""

    name: str
    hparams: dict[str, Scalar]
    final: dict[str, float] = field(default_factory=dict)
    over_time: list[tuple[str, int, float, float]] = field(default_factory=list)
    """(tag, step, value, wall time)."""
    notes: list[str] = field(default_factory=list)
    """What of the record was left out (a file read only up to its cap, a link not followed), one line each."""

    def put(self, tag: str, value: object) -> None:
        """A final figure, if it is a finite number (a run that failed early has holes)."""
        if (number := _number(value)) is not None:
            self.final[tag] = number

    def add(self, tag: str, step: int, value: object, wall: float) -> None:
        if (number := _number(value)) is not None:
            self.over_time.append((tag, step, number, wall))


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _hparams(values: dict[str, object]) -> dict[str, Scalar]:
    return {k: v for k, v in values.items() if isinstance(v, str | int | float | bool)}


def _json_lines(run_dir: Path, name: str, notes: list[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a record's file, read as a stream within its cap (`read_lines`)."""
    for line in read_lines(run_dir, name, notes):
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            yield obj


class _Sample(Open):
    """A line of samples.jsonl (`pictl.cluster.monitor.HostSample`), each figure as written (checked where it is
    tracked: a malformed one is left out, and said)."""

    host: Any = None
    at: Any = None
    cpu_pct: Any = None
    mem_used_mb: Any = None
    temp_c: Any = None
    throttled: Any = None
    power_w: Any = None


class _Kind(Open):
    """What a summary.json says it is: a training job's says `train` (a run's says nothing)."""

    kind: Any = None


def write_samples(run_dir: Path, samples: Iterable[object]) -> None:
    """The run's host samples beside its record (dataclasses; the run's monitor took them)."""
    lines = [json.dumps(dataclasses.asdict(s)) for s in samples if dataclasses.is_dataclass(s)
             and not isinstance(s, type)]
    write_bytes_atomic(run_dir / SAMPLES_FILE, "".join(line + "\n" for line in lines).encode())


def run_series(run_dir: Path, summary: RunSummary) -> Series:
    """A run's record as a tracker takes it."""
    s = summary
    series = Series(s.run_id, _hparams({
        "model": s.model, "stages": s.stages, "policy": s.policy, "chunk": s.chunk, "images": s.images,
        "warmup": s.warmup, "repeats": s.repeats, "threads": s.threads,
        "wire": s.wire.format if s.wire else "fp32", "split": ",".join(s.split_points) or "-", "status": s.status}))
    # Every figure the summary's models declare (`Figure`), under its field's name: a figure added to a model
    # is tracked without a line here.
    for prefix, record in (("", s), ("energy/", s.energy), ("latency/", s.latency.pipeline if s.latency else None)):
        for key, _, value in figures(record):
            series.put(f"{prefix}{key}", value)
    for term in s.waterfall.terms if s.waterfall else []:
        series.put(f"waterfall/{term.term}", term.points)
    for st in s.per_stage:
        for key in ("measured_ms", "wait_ms", "send_ms", "peak_rss_mb"):
            series.put(f"stage{st.rank}/{key}", getattr(st, key))
    for link in s.wire.links if s.wire else []:
        for key in ("avg_Bps", "peak_Bps"):
            value = getattr(link, key)
            series.put(f"link/{link.link}/{key.removesuffix('_Bps')}_MBps", None if value is None else value / 1e6)
    _events_over_time(series, run_dir)
    steps: dict[str, int] = {}
    malformed: list[str] = []  # a host's value that is no figure: left out, and said once for the file
    for sample in map(_Sample.of, _json_lines(run_dir, SAMPLES_FILE, series.notes)):
        host, wall = str(sample.host), _number(sample.at) or 0.0
        step = steps[host] = steps.get(host, -1) + 1
        for key in ("cpu_pct", "mem_used_mb", "temp_c", "throttled", "power_w"):
            written = getattr(sample, key)
            value = _throttling(written) if key == "throttled" and written is not None else written
            if written is not None and _number(value) is None:
                malformed.append(f"host {host!r} {key} {str(written)[:40]!r}")
            series.add(f"host/{host}/{key}", step, value, wall)
    if malformed:
        series.notes.append(f"{run_dir / SAMPLES_FILE}: {len(malformed)} malformed host value(s) left out "
                            f"(the first: {malformed[0]})")
    return series


def _throttling(value: object) -> float | None:
    """vcgencmd's bit mask ("0x50005") as 1 (anything set: throttling, now or since) or 0; None if it is none."""
    if not isinstance(value, str) or not value.startswith("0x"):
        return None
    try:
        return float(int(value, 16) != 0)
    except ValueError:
        return None


def _events_over_time(series: Series, run_dir: Path) -> None:
    """Each pass's img/s, and each rank's compute, wait and send per microbatch in each pass (each events file
    read as a stream, up to its cap)."""
    passes: dict[int, int] = {}
    for name in event_files(run_dir / "events", series.notes):
        side = "serial" if name == "serial.jsonl" else "pipeline"
        for line in read_lines(run_dir, f"events/{name}", series.notes):
            record = read_line(line)
            if isinstance(record, Throughput):
                series.add(f"{side}/pass_ips", record.repeat, record.ips, record.t)
            elif isinstance(record, Progress) and side == "pipeline" and record.microbatches:
                step = passes[record.rank] = passes.get(record.rank, -1) + 1
                for key in ("compute_s", "wait_s", "send_s"):
                    series.add(f"rank{record.rank}/{key.removesuffix('_s')}_ms_per_microbatch", step,
                               getattr(record, key) * 1000 / record.microbatches, record.t)


def sweep_series(name: str, rows: list[dict[str, Any]], options: dict[str, Any]) -> Series:
    """A sweep: one step per point in the order run; each point's own run is tracked as a run."""
    series = Series(name, _hparams({**options, "points": len(rows)}))
    points = [SweepRowRecord.of(row) for row in rows]
    for step, point in enumerate(points):
        for key in ("throughput_ips", "speedup", "efficiency", "stages", "chunk"):
            series.add(f"sweep/{key}", step, getattr(point, key), 0.0)
    best = max((p for p in points if p.status == "ok" and _number(p.speedup)), key=lambda p: p.speedup, default=None)
    if best is not None:
        series.put("best/speedup", best.speedup)
        series.put("best/throughput_ips", best.throughput_ips)
    return series


def train_series(summary: TrainSummary) -> Series:
    """A training job's summary as a tracker takes it."""
    s = summary
    series = Series(s.job_id, _hparams({
        "mode": s.mode, "schedule": s.schedule, "model": s.model, "stages": s.stages, "batch_size": s.batch_size,
        "chunks": s.chunks, "lr": s.lr, "optimizer": s.optimizer, "amp": s.amp, "threads": s.threads,
        "status": s.status}))
    series.put("samples_per_s", s.samples_per_s)
    series.put("top1", s.top1)
    started = s.started_at or 0.0
    for point in s.losses:
        series.add("train/loss", point.step, point.loss, started)
    for ev in s.evals:
        series.add("train/top1", ev.step if ev.step is not None else ev.epoch, ev.top1, started)
    for row in s.breakdown:
        for category, ms in row.per_step_ms.items():
            series.put(f"rank{row.rank}/{category}_ms", ms)
        series.put(f"rank{row.rank}/peak_rss_mb", row.peak_rss_mb)
    return series


def record_series(path: Path) -> Series:
    """A past record as a tracker takes it: a run's, a training job's or a sweep's directory (`pictl track`).
    RecordInvalid (naming the file and field) for one that is not what pictl wrote."""
    from pydantic import ValidationError

    from pictl.summary import RecordInvalid, parse_summary, read_json_object, validation_problem

    if (path / "sweep.json").is_file():
        sweep = SweepRecord.of(read_json_object(path / "sweep.json"))
        rows, options = sweep.rows, sweep.options
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or not isinstance(options, dict):
            raise RecordInvalid(path / "sweep.json", "not a sweep ('rows' and 'options' are missing or wrong)")
        return sweep_series(path.name, rows, options)
    data = read_json_object(path / "summary.json")
    if _Kind.of(data).kind == "train":
        try:
            return train_series(TrainSummary.model_validate(data))
        except ValidationError as exc:
            raise RecordInvalid(path / "summary.json", f"not a training summary ({validation_problem(exc)})") \
                from None
    return run_series(path, parse_summary(path / "summary.json", data))
