"""Live host health: CPU %, CPU contention, memory, temperature and throttling, up or down.

Every few seconds each host runs one fixed shell command (no user values in it)
that prints /proc/stat (the CPU lines and the runnable count), the kernel's CPU
pressure (/proc/pressure/cpu), the load average, /proc/meminfo, the SoC
temperature and, on a Raspberry Pi, `vcgencmd get_throttled`; a local host's
files are read in-process. CPU % is the busy share between two samples; `cpu_wait` the share of that time in which some
runnable thread waited for a CPU. A host that does not answer within
the timeout is reported down, so the dashboard turns it red within seconds. A run
samples its own hosts with the same monitor, over its open connections, for the
sanity flags of its result (`summarize_samples`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from pictl import errors as E
from pictl.cluster.transport import Transport, transport_for
from pictl.inventory import Cluster

# One `cat` (and `vcgencmd` on a Pi): 1.7 ms of CPU per sample here, against 6.8 ms for a process per file.
SAMPLE_SCRIPT = (
    "cat /proc/stat /proc/pressure/cpu /proc/loadavg /proc/meminfo /sys/class/thermal/thermal_zone0/temp 2>/dev/null; "
    "command -v vcgencmd >/dev/null && vcgencmd get_throttled; true"
)


SAMPLED_FILES = ("/proc/stat", "/proc/pressure/cpu", "/proc/loadavg", "/proc/meminfo",
                 "/sys/class/thermal/thermal_zone0/temp")
HAS_VCGENCMD = shutil.which("vcgencmd") is not None
"""This machine is a Pi: its local hosts' samples need `vcgencmd` (the script), not only the files."""


def local_sample_text() -> str:
    """What SAMPLE_SCRIPT prints, read here: a local host is this machine, and reading five small files
    costs far less than starting a shell and `cat` for each host every second (the dashboard's own cost)."""
    parts = []
    for name in SAMPLED_FILES:
        try:
            with open(name) as f:
                parts.append(f.read())
        except OSError:
            continue  # (cat's 2>/dev/null: a kernel without PSI, a machine without a thermal zone)
    return "".join(parts)


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
    runnable: int | None = None
    """Threads running or waiting for a CPU at the instant of the sample (/proc/stat procs_running), not
    counting the sampler's own. An instant's count: samplers of other hosts on the same machine, and some
    virtual machines' own threads, are in it (a 1-thread loop alone on 2 idle CPUs read 3 to 5 here)."""
    load1: float | None = None
    cpu_wait: float | None = None
    """Share of the time since the previous sample in which some runnable thread waited for a CPU: the
    kernel's pressure stall information (/proc/pressure/cpu "some", Linux >= 4.20), averaged over the CPUs as
    the kernel does (3 busy threads on 2 CPUs: 0.5; 4: 1.0). None without PSI or a previous sample."""
    since: float | None = None
    """When the previous sample was taken (controller clock): `cpu_wait` and `cpu_pct` cover since..at."""
    busy_cores: float | None = None
    """`cpu_pct` in cores (of the CPUs online): how much of the host something keeps busy; with `runnable`, the
    load `pictl check` and the dashboard's hosts table show, so that other work can be seen."""
    cpus: int | None = None
    """The CPUs online the sample read (what `busy_cores` is out of)."""


USER_HZ = 100
"""Ticks per second of /proc/stat's CPU lines (fixed at 100 for user space on Linux)."""


@dataclass(frozen=True)
class Counters:
    """Cumulative kernel counters one sample hands to the next: busy and total CPU ticks, CPUs online,
    microseconds in which some thread waited for a CPU (None without PSI), and when they were read."""

    busy: int
    total: int
    cpus: int
    stall_us: int | None
    at: float


def parse_sample(host: str, text: str, previous: Counters | None, at: float
                 ) -> tuple[HostSample, Counters | None]:
    """A sample from the script's output, and the counters for the next one."""
    cpu_pct = mem_total = mem_avail = temp = runnable = load1 = cpu_wait = None
    throttled = None
    jiffies = stall_us = None
    cpus = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "cpu":
            values = [int(v) for v in parts[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            jiffies = (sum(values) - idle, sum(values))
        elif parts[0].startswith("cpu") and parts[0][3:].isdigit():
            cpus += 1
        elif parts[0] == "some" and parts[-1].startswith("total=") and parts[-1][6:].isdigit():
            stall_us = int(parts[-1][6:])  # /proc/pressure/cpu
        elif parts[0] == "procs_running" and len(parts) > 1 and parts[1].isdigit():
            runnable = max(0, int(parts[1]) - 1)  # the reader was running (`cat`, or pictl for a local host)
        elif len(parts) == 5 and "/" in parts[3]:  # /proc/loadavg
            load1 = float(parts[0])
        elif parts[0] == "MemTotal:":
            mem_total = int(parts[1]) // 1024
        elif parts[0] == "MemAvailable:":
            mem_avail = int(parts[1]) // 1024
        elif parts[0].isdigit():
            temp = int(parts[0]) / 1000.0
        elif parts[0].startswith("throttled="):
            throttled = parts[0].split("=", 1)[1]
    counters = Counters(jiffies[0], jiffies[1], cpus or 1, stall_us, at) if jiffies else None
    if counters and previous and counters.total > previous.total:
        cpu_pct = round(100.0 * (counters.busy - previous.busy) / (counters.total - previous.total), 1)
        if counters.stall_us is not None and previous.stall_us is not None:
            # The span in the kernel's own time: every CPU's ticks, over the CPUs, at USER_HZ.
            span_us = (counters.total - previous.total) / counters.cpus / USER_HZ * 1e6
            cpu_wait = round(min(1.0, max(0.0, (counters.stall_us - previous.stall_us) / span_us)), 3)
    used = mem_total - mem_avail if mem_total is not None and mem_avail is not None else None
    busy = round(cpu_pct / 100.0 * counters.cpus, 2) if cpu_pct is not None and counters else None
    return HostSample(host, True, at, cpu_pct, used, mem_total, temp, throttled, runnable=runnable,
                      load1=load1, cpu_wait=cpu_wait, since=previous.at if previous else None,
                      busy_cores=busy, cpus=counters.cpus if counters else None), counters


async def read_sample(t: Transport, previous: Counters | None, timeout_s: float
                      ) -> tuple[HostSample, Counters | None]:
    """One sample of a connected host (this machine's files, read here, for a local host off a Pi)."""
    text = (local_sample_text() if t.host.transport == "local" and not HAS_VCGENCMD else
            (await t.run(["sh", "-c", SAMPLE_SCRIPT], timeout_s=timeout_s)).stdout)
    return parse_sample(t.host.name, text, previous, time.time())


async def load_now(t: Transport, span_s: float = 0.5, timeout_s: float = 4.0) -> HostSample:
    """A connected host's load over `span_s` (two samples): busy cores, run queue and CPU wait, as `pictl check`
    shows them."""
    _, first = await read_sample(t, None, timeout_s)
    await asyncio.sleep(span_s)
    return (await read_sample(t, first, timeout_s))[0]


def summarize_samples(samples: list[HostSample], start: float, end: float) -> dict | None:
    """One host's samples taken between `start` and `end` (controller clock), folded: None if there were none."""
    inside = [s for s in samples if s.up and start <= s.at <= end]
    if not inside:
        return None
    runnable = [s.runnable for s in inside if s.runnable is not None]
    # Each CPU-pressure figure covers the span since the sample before: weighted by how much of that span
    # lies in the window, so the processes' start-up just before it counts for little.
    waits = [(s.cpu_wait, min(s.at, end) - max(s.since, start)) for s in samples
             if s.up and s.cpu_wait is not None and s.since is not None and min(s.at, end) > max(s.since, start)]
    weight = sum(w for _, w in waits)
    cpu = [s.cpu_pct for s in inside if s.cpu_pct is not None]
    temps = [s.temp_c for s in inside if s.temp_c is not None]
    return {"samples": len(inside),
            "runnable_mean": round(sum(runnable) / len(runnable), 2) if runnable else None,
            "runnable_max": max(runnable, default=None),
            "cpu_wait_mean": round(sum(v * w for v, w in waits) / weight, 3) if weight > 0 else None,
            "cpu_pct_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "temp_max_c": max(temps, default=None),
            "throttled": sorted({s.throttled for s in inside if s.throttled})}


class HostMonitor:
    """Samples every host of a cluster on its own connections until stopped."""

    def __init__(self, cluster: Cluster, on_sample: Callable[[HostSample], None], *,
                 interval_s: float = 2.0, timeout_s: float = 4.0, transports: list[Transport] | None = None) -> None:
        """With `transports` (connected; a run's own), samples over them and leaves them open."""
        self.cluster = cluster
        self.transports = transports
        self.on_sample = on_sample
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def _watch(self, t: Transport, *, owned: bool = True) -> None:
        previous: Counters | None = None
        connected = not owned
        while True:
            started = time.monotonic()
            try:
                if not connected:
                    await asyncio.wait_for(t.connect(), self.timeout_s)
                    connected = True
                sample, previous = await read_sample(t, previous, self.timeout_s)
            except (E.PictlError, OSError, TimeoutError) as exc:
                if owned:
                    connected = False
                    await t.close()
                sample = HostSample(t.host.name, False, time.time(), error=str(exc) or type(exc).__name__)
            self.on_sample(sample)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def run(self) -> None:
        if self.transports is not None:
            await asyncio.gather(*(self._watch(t, owned=False) for t in self.transports))
            return
        transports = [transport_for(h) for h in self.cluster.hosts]
        try:
            await asyncio.gather(*(self._watch(t) for t in transports))
        finally:
            await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
