"""Which rank caused a multi-host torchrun failure: the pipeline's and training's shared blame.

A rank that dies (killed, out of memory, crashed) says nothing; its peers then fail too and do report
("connection closed by peer"), often first. So the cause is a rank that never reported, on a host whose
torchrun exited non-zero, where no rank of that host reported an error either (a rank stopped by its own
torchrun after a sibling's error is not a cause). A host counts only once its output is read to the end,
so every record it sent has been seen; how long its torchrun takes to notice and exit depends on the
host's load, so we wait for it rather than for a fixed time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

SETTLE_MOST_S = 10.0
"""How long to wait after a failure for every host to exit: the ranks' peers fail within a second or two
(closed sockets), so this bounds only a host that hangs (it is stopped after)."""


CONNECTION_LOST = 255
"""The status a host's command ends with when its connection is lost (as ssh(1) says it: `transport.ssh`)."""


@dataclass(frozen=True)
class SilentDeath:
    host: str
    rank: int
    returncode: int

    @property
    def message(self) -> str:
        if self.returncode == CONNECTION_LOST:
            return ("the host stopped answering: its connection was lost with the rank still silent (its link, its "
                    "power or its sshd gone)")
        return (f"the rank died without reporting an error (torchrun exit status {self.returncode}: "
                f"killed, out of memory or crashed)")


def silent_death(ended: Mapping[str, int], ranks_of: Mapping[str, Sequence[int]],
                 reported: Callable[[int], bool], errored: Callable[[int], bool]) -> SilentDeath | None:
    """Among the hosts read to the end (`ended`: host -> exit status), a rank that died without a word."""
    for host, ranks in ranks_of.items():
        rc = ended.get(host)
        if rc in (None, 0) or any(errored(r) for r in ranks):
            continue
        for rank in ranks:
            if not reported(rank):
                return SilentDeath(host, rank, rc)
    return None


async def await_culprit(ended: Mapping[str, int], ranks_of: Mapping[str, Sequence[int]],
                        reported: Callable[[int], bool], errored: Callable[[int], bool],
                        most: float = SETTLE_MOST_S) -> SilentDeath | None:
    """After a failure: wait until a silent death shows, every host has been read to the end, or `most`
    seconds; the silent death if one showed (else the blame goes to the earliest reported error)."""
    deadline = time.monotonic() + most
    while True:
        found = silent_death(ended, ranks_of, reported, errored)
        if found is not None or len(ended) >= len(ranks_of) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)
