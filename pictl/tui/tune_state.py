"""A tune as the dashboard follows it (no Textual here): where it writes, the base it searches from, the
candidate being measured, every candidate so far (`pictl.jobs.tune_verdicts.Measured`), and once it ended,
the winner and the preset it was saved as."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pictl.jobs.tune_verdicts import Measured
from pictl.planning.options import RunOptions


@dataclass
class TuneView:
    directory: str
    base: RunOptions
    trying: str = ""
    """The candidate whose run is on the panel, and why it is measured."""
    rows: list[Measured] = field(default_factory=list)
    winner: Measured | None = None
    preset: Path | None = None

    @property
    def measured(self) -> int:
        """Candidates measured (the serial row, the first run's own serial run, is the reference, not one)."""
        return sum(1 for m in self.rows if m.status and not m.reference)


@dataclass(frozen=True)
class TuneStep:
    """A tune's next run took the panel: the candidate it measures, and why."""

    trying: str
