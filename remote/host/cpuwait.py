"""The CPU a process waited for while other work held it, told apart from its host's CPU quota (stdlib only).

The kernel's schedstat run delay (/proc/self/schedstat: time runnable on a run queue, not running) counts both
another process's load and a CFS quota's throttling: a throttled task stays queued. Under a 0.4-core quota a
busy loop alone on an idle machine waits 0.6 s of every second, none of it for other work. `Span` takes the
throttling away: the quota's cgroup (`remote.host.probe.cpu_limit`, the tightest along this process's path)
counts its throttled time in `cpu.stat`, and a wait only counts while the process got less CPU than its quota.
"""

from __future__ import annotations

import os
import time

from remote.host.probe import cpu_limit


def run_delay_s() -> float | None:
    """Seconds this process's main thread (where a stage computes; torch's intra-op workers run beside it in
    step) has spent runnable but waiting for a CPU, or None where the kernel does not say. The gloo and helper
    threads are left out: they sleep on sockets, and their waits are not the stage's."""
    try:
        with open("/proc/self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def throttled_s(limit: tuple[float, str] | None) -> float | None:
    """Seconds the quota's cgroup (`limit`: `cpu_limit()`) has spent throttled (v2 `throttled_usec`, v1
    `throttled_time`); None: no quota, or a cpu.stat that does not say."""
    if limit is None:
        return None
    try:
        with open(os.path.join(limit[1], "cpu.stat")) as fh:
            fields = dict(ln.split() for ln in fh if len(ln.split()) == 2)
        if "throttled_usec" in fields:
            return int(fields["throttled_usec"]) / 1e6
        return int(fields["throttled_time"]) / 1e9
    except (OSError, ValueError, KeyError):
        return None


class Span:
    """Readings at the start of a span (a pass): run delay, throttled time, CPU time, wall time."""

    def __init__(self) -> None:
        # The quota is read now, not when this module was imported: a warm process imports it once and forks
        # jobs for hours, and a host's quota may be set (or lifted) meanwhile.
        self.limit = cpu_limit()
        self.delay, self.throttled = run_delay_s(), throttled_s(self.limit)
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def raw_delay(self) -> float:
        """The run delay since the span began, throttling and all."""
        now = run_delay_s()
        return 0.0 if self.delay is None or now is None else max(0.0, now - self.delay)

    def interference(self) -> float:
        """The time this process waited for a CPU that other work held, over the span so far.

        Its run delay, less its host's quota throttling. The cgroup's throttled time is not the whole of it
        (a 6.18 kernel counted 0.15-0.19 s of a capped loop's 0.6 s a second), and several capped hosts on one
        machine queue at each period's start (four 0.4-core hosts on two CPUs each waited 0.6-1.1 s in 3 s
        beyond their throttling, yet each got its full 1.2 s of CPU). So under a quota a wait counts only up to
        the CPU time the process fell short of its quota: a process that got its quota lost nothing to others."""
        end = Span()
        if self.delay is None or end.delay is None:
            return 0.0
        delay = end.delay - self.delay
        if self.throttled is not None and end.throttled is not None:
            delay -= end.throttled - self.throttled
        if self.limit is not None:
            delay = min(delay, self.limit[0] * (end.wall - self.wall) - (end.cpu - self.cpu))
        return max(0.0, delay)
