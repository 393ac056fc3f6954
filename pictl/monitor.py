"""Live host health for the dashboard: CPU %, memory, temperature and throttling, up or down.

Every few seconds each host runs one fixed shell command (no user values in it)
that prints /proc/stat's CPU line, MemTotal/MemAvailable, the SoC temperature and,
on a Raspberry Pi, `vcgencmd get_throttled`. CPU % is the busy share between two
samples. A host that does not answer within the timeout is reported down, so the
dashboard turns it red within seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from pictl import errors as E
from pictl.inventory import Cluster
from pictl.transport import Transport, transport_for

SAMPLE_SCRIPT = (
    "head -n1 /proc/stat; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; "
    "cat /sys/class/thermal/thermal_zone0/temp 2>/dev/null || echo notemp; "
    "vcgencmd get_throttled 2>/dev/null || echo nothrottle"
)


@dataclass(frozen=True)
class HostSample:
    """One host's health at `at` (controller clock)."""

    host: str
    up: bool
    at: float
    cpu_pct: float | None = None
    mem_used_mb: int | None = None
    mem_total_mb: int | None = None
    temp_c: float | None = None
    throttled: str | None = None
    error: str | None = None


def parse_sample(host: str, text: str, previous: tuple[int, int] | None, at: float
                 ) -> tuple[HostSample, tuple[int, int] | None]:
    """A sample from the script's output, and the (busy, total) jiffies for the next one."""
    cpu_pct = mem_total = mem_avail = temp = None
    throttled = None
    jiffies = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "cpu":
            values = [int(v) for v in parts[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            jiffies = (sum(values) - idle, sum(values))
        elif parts[0] == "MemTotal:":
            mem_total = int(parts[1]) // 1024
        elif parts[0] == "MemAvailable:":
            mem_avail = int(parts[1]) // 1024
        elif parts[0].isdigit():
            temp = int(parts[0]) / 1000.0
        elif parts[0].startswith("throttled="):
            throttled = parts[0].split("=", 1)[1]
    if jiffies and previous and jiffies[1] > previous[1]:
        cpu_pct = round(100.0 * (jiffies[0] - previous[0]) / (jiffies[1] - previous[1]), 1)
    used = mem_total - mem_avail if mem_total is not None and mem_avail is not None else None
    return HostSample(host, True, at, cpu_pct, used, mem_total, temp, throttled), jiffies


class HostMonitor:
    """Samples every host of a cluster on its own connections until stopped."""

    def __init__(self, cluster: Cluster, on_sample: Callable[[HostSample], None], *,
                 interval_s: float = 2.0, timeout_s: float = 4.0) -> None:
        self.cluster = cluster
        self.on_sample = on_sample
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def _watch(self, t: Transport) -> None:
        previous: tuple[int, int] | None = None
        connected = False
        while True:
            started = time.monotonic()
            try:
                if not connected:
                    await asyncio.wait_for(t.connect(), self.timeout_s)
                    connected = True
                result = await t.run(["sh", "-c", SAMPLE_SCRIPT], timeout_s=self.timeout_s)
                sample, previous = parse_sample(t.host.name, result.stdout, previous, time.time())
            except (E.PictlError, OSError, TimeoutError) as exc:
                connected = False
                await t.close()
                sample = HostSample(t.host.name, False, time.time(), error=str(exc) or type(exc).__name__)
            self.on_sample(sample)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def run(self) -> None:
        transports = [transport_for(h) for h in self.cluster.hosts]
        try:
            await asyncio.gather(*(self._watch(t) for t in transports))
        finally:
            await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
