"""Live host health: CPU %, CPU contention, memory, temperature, throttling and power, up or down.

Every few seconds each host runs one fixed shell command (no user values in it)
that prints /proc/stat (the CPU lines and the runnable count), the kernel's CPU
pressure (/proc/pressure/cpu), the load average, /proc/meminfo, the SoC
temperature, the boot id (which hosts are one machine), on a Raspberry Pi
`vcgencmd get_throttled` and `vcgencmd pmic_read_adc` (the PMIC's rails: volts
and amps), and the RAPL package energy counters where the user may read them; a
local host's files are read in-process. CPU % is the busy share between two
samples; `cpu_wait` the share of that time in which some runnable thread waited
for a CPU. A host that does not answer within the timeout is reported down, so
the dashboard turns it red within seconds. A run samples its own hosts with the
same monitor, over its open connections, for the sanity flags of its result and
its energy per image (`summarize_samples`).
"""

from __future__ import annotations

import asyncio
import functools
import glob
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from pictl import errors as E
from pictl.cluster.transport import Transport, transport_for
from pictl.inventory import Cluster

# One `cat` (and `vcgencmd` on a Pi): 1.7 ms of CPU per sample here, against 6.8 ms for a process per file.
BOOT_ID = "/proc/sys/kernel/random/boot_id"
RAPL_GLOB = "/sys/class/powercap/intel-rapl:[0-9]"
"""The RAPL package domains (x86, Intel and AMD): `energy_uj` counts the package's energy since boot; their
sub-domains (`intel-rapl:0:0`) are parts of it. Kernels since 5.10 let only root read it: "n/a" otherwise."""
SAMPLE_SCRIPT = (
    "cat /proc/stat /proc/pressure/cpu /proc/loadavg /proc/meminfo /sys/class/thermal/thermal_zone0/temp "
    f"{BOOT_ID} 2>/dev/null; "
    f"for d in {RAPL_GLOB}; do [ -r $d/energy_uj ] && echo rapl $(cat $d/energy_uj $d/max_energy_range_uj); done "
    "2>/dev/null; "
    "command -v vcgencmd >/dev/null && vcgencmd get_throttled && vcgencmd pmic_read_adc; true"
)


SAMPLED_FILES = ("/proc/stat", "/proc/pressure/cpu", "/proc/loadavg", "/proc/meminfo",
                 "/sys/class/thermal/thermal_zone0/temp", BOOT_ID)


def local_sample_text() -> str:
    """What SAMPLE_SCRIPT prints, read here: a local host is this machine, and reading six small files
    costs far less than starting a shell and `cat` for each host every second (the dashboard's own cost)."""
    parts = []
    for name in SAMPLED_FILES:
        try:
            with open(name) as f:
                parts.append(f.read())
        except OSError:
            continue  # (cat's 2>/dev/null: a kernel without PSI, a machine without a thermal zone)
    for domain in _rapl_domains():
        try:
            with open(f"{domain}/energy_uj") as f, open(f"{domain}/max_energy_range_uj") as g:
                parts.append(f"rapl {f.read().strip()} {g.read().strip()}\n")
        except OSError:
            continue  # (readable by root only, as on most kernels since 5.10)
    return "".join(parts)


@functools.cache
def _rapl_domains() -> list[str]:
    """This machine's RAPL package domains: found once (they are the hardware's), read at every sample."""
    return sorted(glob.glob(RAPL_GLOB))


def has_vcgencmd() -> bool:
    """This machine is a Pi (or has a recorded `vcgencmd` on its PATH): its local hosts' samples need the
    script, not only the files. Looked up once per PATH (a test, or a user, may change it)."""
    return _vcgencmd_on(os.environ.get("PATH"))


@functools.lru_cache(maxsize=8)
def _vcgencmd_on(path: str | None) -> bool:
    return shutil.which("vcgencmd", path=path) is not None


PMIC_RAIL = re.compile(r"^\s*(\w+)_([AV]) (?:current|volt)\(\d+\)=([0-9.]+)[AV]\s*$")
"""A line of `vcgencmd pmic_read_adc` (Raspberry Pi 5): `VDD_CORE_A current(7)=1.11625000A`,
`VDD_CORE_V volt(15)=0.74944980V`."""


def pmic_power_w(lines: list[str]) -> float | None:
    """The board's power from the PMIC's rails: the sum of volts x amps over every rail measured both ways.
    The 5 V input (EXT5V_V) has no current reading, so this is what the board's rails draw, not what the
    power supply delivers (its converters' losses are not in it). None if no rail has both."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in lines:
        if m := PMIC_RAIL.match(line):
            (amps if m.group(2) == "A" else volts)[m.group(1)] = float(m.group(3))
    rails = amps.keys() & volts.keys()
    return round(sum(amps[r] * volts[r] for r in rails), 3) if rails else None


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
    power_w: float | None = None
    """The host's power draw: the PMIC's rails at the instant of the sample (a Pi 5), or the RAPL packages'
    mean since the previous sample (x86, where readable); None where the host cannot measure it."""
    power_source: str | None = None
    """Which meter: "pmic" (`vcgencmd pmic_read_adc`) or "rapl" (the powercap package counters)."""
    machine: str | None = None
    """The host's boot id: hosts that share it are one machine, with one power meter (local hosts)."""


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
    energy_uj: list[tuple[int, int]] | None = None
    """Each RAPL package's energy counter and the value it wraps at (None where unreadable)."""


def parse_sample(host: str, text: str, previous: Counters | None, at: float
                 ) -> tuple[HostSample, Counters | None]:
    """A sample from the script's output, and the counters for the next one."""
    cpu_pct = mem_total = mem_avail = temp = runnable = load1 = cpu_wait = None
    throttled = None
    jiffies = stall_us = machine = None
    rapl: list[tuple[int, int]] = []
    pmic: list[str] = []
    cpus = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if PMIC_RAIL.match(line):
            pmic.append(line)
        elif parts[0] == "rapl" and len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            rapl.append((int(parts[1]), int(parts[2])))
        elif len(parts[0]) == 36 and parts[0].count("-") == 4 and len(parts) == 1:  # the boot id (a UUID)
            machine = parts[0]
        elif parts[0] == "cpu":
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
    counters = Counters(jiffies[0], jiffies[1], cpus or 1, stall_us, at, rapl or None) if jiffies else None
    power, source = pmic_power_w(pmic), "pmic"
    if power is None and counters and counters.energy_uj and previous and previous.energy_uj \
            and len(previous.energy_uj) == len(counters.energy_uj) and at > previous.at:
        # A counter that wrapped since the last sample went round once at most (over 60 s at 1 kW).
        joules = sum((now - then) % wrap if wrap else now - then
                     for (now, wrap), (then, _) in zip(counters.energy_uj, previous.energy_uj, strict=True)) / 1e6
        power, source = round(joules / (at - previous.at), 3), "rapl"
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
                      busy_cores=busy, cpus=counters.cpus if counters else None, power_w=power,
                      power_source=source if power is not None else None, machine=machine), counters


async def read_sample(t: Transport, previous: Counters | None, timeout_s: float
                      ) -> tuple[HostSample, Counters | None]:
    """One sample of a connected host (this machine's files, read here, for a local host off a Pi)."""
    text = (local_sample_text() if t.host.transport == "local" and not has_vcgencmd() else
            (await t.run(["sh", "-c", SAMPLE_SCRIPT], timeout_s=timeout_s)).stdout)
    return parse_sample(t.host.name, text, previous, time.time())


async def load_now(t: Transport, span_s: float = 0.5, timeout_s: float = 4.0) -> HostSample:
    """A connected host's load over `span_s` (two samples): busy cores, run queue and CPU wait, as `pictl check`
    shows them."""
    _, first = await read_sample(t, None, timeout_s)
    await asyncio.sleep(span_s)
    return (await read_sample(t, first, timeout_s))[0]


def _overlaps(samples: list[HostSample], value: Callable[[HostSample], float | None], start: float, end: float
              ) -> list[tuple[float, float]]:
    """Each sample's `value` with the seconds of the window [start, end] it stands for: a figure covers the span
    since the sample before, so a sample taken just after the window still speaks for its end."""
    out = []
    for s in samples:
        v = value(s)
        if s.up and v is not None and s.since is not None and min(s.at, end) > max(s.since, start):
            out.append((v, min(s.at, end) - max(s.since, start)))
    return out


def summarize_samples(samples: list[HostSample], start: float, end: float, *, power_from: float | None = None
                      ) -> dict | None:
    """One host's samples taken between `start` and `end` (controller clock), folded: None if there were none.
    The power is over [`power_from`, end] where given (a serial run's passes, not its start-up)."""
    inside = [s for s in samples if s.up and start <= s.at <= end]
    if not inside:
        return None
    runnable = [s.runnable for s in inside if s.runnable is not None]
    # Each CPU-pressure figure is weighted by how much of its span lies in the window, so the processes'
    # start-up just before it counts for little.
    waits = _overlaps(samples, lambda s: s.cpu_wait, start, end)
    weight = sum(w for _, w in waits)
    cpu = [s.cpu_pct for s in inside if s.cpu_pct is not None]
    temps = [s.temp_c for s in inside if s.temp_c is not None]
    # Power the same way (a PMIC reading is an instant's, taken every interval; a RAPL one that span's mean).
    # Half the window unmeasured: no figure.
    power_start = start if power_from is None else power_from
    powers = _overlaps(samples, lambda s: s.power_w, power_start, end)
    covered = sum(w for _, w in powers)
    power = round(sum(v * w for v, w in powers) / covered, 3) \
        if powers and covered >= 0.5 * (end - power_start) else None
    return {"samples": len(inside),
            "runnable_mean": round(sum(runnable) / len(runnable), 2) if runnable else None,
            "runnable_max": max(runnable, default=None),
            "cpu_wait_mean": round(sum(v * w for v, w in waits) / weight, 3) if weight > 0 else None,
            "cpu_pct_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
            "temp_max_c": max(temps, default=None),
            "throttled": sorted({s.throttled for s in inside if s.throttled}),
            "power_w_mean": power,
            "power_source": next((s.power_source for s in inside if s.power_source), None),
            "machine": next((s.machine for s in inside if s.machine), None)}


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
