"""A sweep as the dashboard follows it (no Textual here): where it writes, which of its runs is on the panel,
and its table so far (the rows `pictl.jobs.sweep` writes to table.csv)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SweepView:
    directory: str
    total: int
    index: int = 0
    """The run on the panel, counted from 0."""
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class SweepStep:
    """A sweep's next run took the panel: which one, of how many planned (rounds add to them as they go)."""

    index: int
    total: int
