"""A pruning job as the dashboard folds it (no Textual here): its options, where it runs, what it prunes,
top-1 at each step, fine-tuning's progress, and its summary once it ended."""

from __future__ import annotations

from dataclasses import dataclass, field

from pictl.job_summaries import PruneSummary
from pictl.jobs.prune_options import PruneOptions
from remote.floor.job_records import PruneAccuracy, PruneProgress, PruneStart
from remote.floor.records import Record


@dataclass
class PruneView:
    options: PruneOptions
    where: str
    start: PruneStart | None = None
    progress: PruneProgress | None = None
    accuracy: list[PruneAccuracy] = field(default_factory=list)
    summary: PruneSummary | None = None

    def apply(self, rec: Record) -> None:
        match rec:
            case PruneStart():
                self.start = rec
            case PruneProgress():
                self.progress = rec
            case PruneAccuracy():
                self.accuracy.append(rec)
