"""A training job as the dashboard folds it (no Textual here): its options, the losses as they come, the
samples/s of each step, where each rank's steps went, its evaluations, and its summary once it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote import protocol as P

CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)


@dataclass
class TrainView:
    options: dict[str, Any]
    start: dict[str, Any] | None = None
    losses: list[float] = field(default_factory=list)
    step: int = 0
    rate: float | None = None
    """Samples per second of the latest step (the loss rank's)."""
    ranks: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per rank, ms per timed step by category (running mean)."""
    hosts: dict[int, str] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    _counts: dict[int, int] = field(default_factory=dict)

    def apply(self, source: str, host: str, rec: dict[str, Any]) -> None:
        if source == "reference":
            return  # the single-mode reference's steps are not the job's
        kind, rank = rec.get(P.KEY_EVENT), int(rec.get(P.KEY_RANK, 0))
        if kind == P.TRAIN_START and rank == 0:
            self.start = rec
        elif kind == P.TRAIN_STEP:
            self.hosts[rank] = host
            if "loss" in rec:
                self.losses.append(float(rec["loss"]))
                self.step = int(rec["step"])
                self.rate = rec["samples"] / rec["seconds"] if rec.get("seconds") else None
            if rec.get("timed"):
                n = self._counts[rank] = self._counts.get(rank, 0) + 1
                mean = self.ranks.setdefault(rank, dict.fromkeys(CATEGORIES, 0.0))
                for c in CATEGORIES:
                    mean[c] += (rec["times"].get(f"{c}_s", 0.0) * 1000 - mean[c]) / n
        elif kind == P.TRAIN_EVAL:
            self.evals.append(rec)

    @property
    def steps(self) -> int | None:
        return (self.start or {}).get("steps")
