"""The one contract every job keeps with its front ends (`pictl run`, `pictl train`, `pictl prune`; the dashboard's
`tui/job_runner.py`; the Python API): run it to its end; then, however it ended, its summary (None when nothing
started) and whether its record could not be written whole. `RunSession`, `TrainSession` and `PruneSession`
keep it; a sweep or a tune is many of them (its own tables are its result)."""

from __future__ import annotations

from typing import Protocol, TypeVar

from pydantic import BaseModel

from pictl import errors as E

S = TypeVar("S", bound=BaseModel, covariant=True)


class Job(Protocol[S]):
    async def run(self) -> S:
        """The job, start to end: its checked summary, or the error that ended it (then `summary` holds the
        failed job's, if it got far enough to have one)."""
        ...

    @property
    def summary(self) -> S | None:
        """The summary the job ended with, well or not, as its record keeps it; None when nothing started."""
        ...

    @property
    def write_error(self) -> E.RecordWriteFailed | None:
        """Its record could not be written whole (a full disk): the result stands, the record is incomplete."""
        ...
