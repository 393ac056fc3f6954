"""A training job as the dashboard folds it (no Textual here): its options, the losses as they come, the
samples/s of each step, where each rank's steps went, its evaluations, and its summary once it ended."""

from __future__ import annotations

from dataclasses import dataclass, field

from pictl.job_summaries import TrainSummary
from pictl.jobs.training.options import TrainOptions
from remote.floor import protocol as P
from remote.floor.job_records import TrainEval, TrainStart, TrainStep
from remote.floor.records import Record

CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)


@dataclass
class TrainView:
    options: TrainOptions
    start: TrainStart | None = None
    losses: list[float] = field(default_factory=list)
    step: int = 0
    rate: float | None = None
    """Samples per second of the latest step (the loss rank's)."""
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per rank, ms per timed step by category (running mean)."""
    hosts: dict[int, str] = field(default_factory=dict)
    evals: list[TrainEval] = field(default_factory=list)
    summary: TrainSummary | None = None
    _counts: dict[int, int] = field(default_factory=dict)
    _slowest: dict[int, float] = field(default_factory=dict)
    """Step -> seconds of its slowest rank so far: a pipeline's step ends with its first stage's backward."""

    def apply(self, source: str, host: str, rec: Record) -> None:
        if source == "reference":
            return  # the single-mode reference's steps are not the job's
        match rec:
            case TrainStart(rank=0):
                self.start = rec
            case TrainStep():
                self._step(host, rec)
            case TrainEval():
                self.evals.append(rec)

    def _step(self, host: str, rec: TrainStep) -> None:
        rank = rec.rank
        self.hosts[rank] = host
        self._slowest[rec.step] = max(self._slowest.get(rec.step, 0.0), rec.seconds or 0.0)
        if rec.loss is not None:
            self.losses.append(float(rec.loss))
            self.step = rec.step
        # The step before the newest is whole (every rank has reported it).
        seconds = self._slowest.get(self.step - 1) or self._slowest.get(self.step) if self.step else None
        self.rate = rec.samples / seconds if seconds else self.rate
        if rec.timed:
            n = self._counts[rank] = self._counts.get(rank, 0) + 1
            mean = self.ranks.setdefault(rank, dict.fromkeys(CATEGORIES, 0.0))
            times = rec.times or {}
            for c in CATEGORIES:
                value = times.get(f"{c}_s", 0.0)
                ms = float(value) * 1000 if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
                mean[c] += (ms - mean[c]) / n

    @property
    def steps(self) -> int | None:
        return self.start.steps if self.start else None
