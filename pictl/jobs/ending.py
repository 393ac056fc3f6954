"""How a job that runs ranks on the hosts ends, owned once: the order of its phases is the session's, the
ending is this module's.

Whatever ends a job, the same things happen in the same order:
- Its phases run in order. After the last one the job is `ok`, and then it is verified: a check that fails
  (tokens or losses that differ) raises, and the summary says so.
- **Ctrl-C:** the job is `interrupted` and ends with `Interrupted`.
- **Bad input found on a host** (`ConfigError`): the job never existed, so its record goes.
- **Any other error:** the error is kept for the summary.
- **Always:**
  - every process is stopped, each host confirms, and its run directory goes (`HostJob.close`);
  - then the session closes its record with the summary of how the job ended.

`pictl train` and `pictl generate` end this way (`jobs.training.session`, `jobs.generation.session`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass

from pictl import errors as E
from pictl.cluster.jobs import HostJob, to_the_end
from pictl.job_summaries import Status
from pictl.records.runs import RunRecord
from pictl.summary_models import RunError


@dataclass
class Ending:
    """How the job ended, as its summary says it."""

    started: float
    status: Status = "failed"
    error: RunError | None = None


class RankJob:
    """A job of phases on held hosts. A session gives its phases (`_phases`), what verifies a job that ran
    through them (`_verify`), and how its record closes (`_close`); `_run_to_the_end` owns the rest."""

    record: RunRecord | None = None
    interrupted = "interrupted: every rank was stopped"

    async def _phases(self, job: HostJob) -> None:
        raise NotImplementedError

    def _verify(self, ending: Ending) -> None:
        """After every phase ran: raise (E.OutputMismatch) when the job's outputs do not hold."""

    async def _close(self, ending: Ending) -> None:
        """Write the summary of how it ended into the record (there is one: the job got far enough to open it)."""
        raise NotImplementedError

    async def _run_to_the_end(self, job: HostJob) -> None:
        ending = Ending(started=time.time())
        try:
            await self._phases(job)
            ending.status = "ok"
            self._verify(ending)
        except asyncio.CancelledError:
            ending.status = "interrupted"
            raise E.Interrupted(self.interrupted) from None
        except E.ConfigError:
            if self.record is not None:  # bad input found on a host: the job never existed
                shutil.rmtree(self.record.path, ignore_errors=True)
                self.record = None
            raise
        except Exception as exc:
            ending.error = RunError(type=type(exc).__name__, message=str(exc))
            raise
        finally:
            await to_the_end(job.close())  # (a borrowed job: its processes and directories; the hosts stay held)
            if self.record is not None:  # however it ended, the record closes
                await self._close(ending)
