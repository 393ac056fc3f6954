"""How far a host's clock is from ours, measured NTP-style over the connection that is already open.

One small stdlib process on the host (`remote/host/probe.py clock`) answers each line
we send with its clock read on receipt and on reply. For every exchange, with t1
and t4 our clock at sending and receiving, t2 and t3 the host's:

    offset = ((t2 - t1) + (t3 - t4)) / 2        round trip = (t4 - t1) - (t3 - t2)

The host's reading happened somewhere inside the round trip, so the true offset
lies within half the round trip of the estimate, whatever the delays each way.
Many short exchanges, the one with the smallest round trip kept: a slow one (a
busy event loop, a scheduler hiccup) only widens its own interval. `pictl check`
and the merging of profiler traces both use this.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import remote
from pictl import errors as E
from pictl.cluster.transport import Transport

PROBE_SOURCE = remote.source("host/probe.py")
EXCHANGES = 40


@dataclass(frozen=True)
class ClockOffset:
    """The host clock minus ours; the true value lies within `uncertainty_ns` of `offset_ns`."""

    offset_ns: int
    uncertainty_ns: int
    exchanges: int

    @property
    def significant(self) -> bool:
        """Whether the offset is told apart from zero (clocks of NTP-synced hosts on a LAN agree to within
        a millisecond or so; shifting by noise would only reorder events)."""
        return abs(self.offset_ns) > self.uncertainty_ns


async def measure_clock(t: Transport, exchanges: int = EXCHANGES, timeout_s: float = 20.0) -> ClockOffset:
    """Measure `t`'s host clock against ours. A local host is this machine: offset 0, exactly."""
    if t.host.transport == "local":
        return ClockOffset(0, 0, 0)
    proc = await t.start([t.host.base_python(), "-c", PROBE_SOURCE, "clock"])
    lines = proc.lines()

    async def stdout_line() -> str:
        async for stream, line in lines:
            if stream == "stdout":
                return line
        raise E.TransportError(f"host '{t.host.name}': the clock probe ended early")

    async def exchange_all() -> ClockOffset:
        if (await stdout_line()) != "ready":
            raise E.TransportError(f"host '{t.host.name}': the clock probe did not start")
        best: tuple[int, int] | None = None  # (round trip, offset)
        for _ in range(exchanges):
            t1 = time.time_ns()
            await proc.send_line("t")
            reply = await stdout_line()
            t4 = time.time_ns()
            try:
                t2, t3 = (int(v) for v in reply.split())
            except ValueError:
                raise E.TransportError(f"host '{t.host.name}': the clock probe said {reply[:80]!r}") from None
            round_trip = (t4 - t1) - (t3 - t2)
            if best is None or round_trip < best[0]:
                best = (round_trip, ((t2 - t1) + (t3 - t4)) // 2)
        assert best is not None
        return ClockOffset(best[1], (best[0] + 1) // 2, exchanges)

    try:
        return await asyncio.wait_for(exchange_all(), timeout_s)
    except TimeoutError:
        raise E.TransportError(f"host '{t.host.name}': no clock reading within {timeout_s:.0f} s") from None
    finally:
        await proc.stop(grace_s=2)
        await lines.aclose()
