"""Uneven background load that a test or a benchmark makes itself: a busy loop pinned to one CPU, switched on and
off (SIGCONT / SIGSTOP) at uneven intervals while a comparison measures, as another team's jobs come and go on
a shared Pi. Used as a context manager; the loop is killed on the way out, whatever happened."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from types import TracebackType


class ToggledLoad:
    """A busy loop on `cpu` (default: the last CPU this process may use), on for `on_s` and off for `off_s`
    seconds in turn (each drawn uniformly from its range, seeded); `switches` counts how often it changed."""

    def __init__(self, cpu: int | None = None, *, on_s: tuple[float, float] = (0.5, 3.0),
                 off_s: tuple[float, float] = (0.5, 3.0), seed: int = 43) -> None:
        self.cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu
        self.on_s, self.off_s = on_s, off_s
        self.rng = random.Random(seed)
        self.switches = 0
        self.busy_s = 0.0
        """Seconds the loop was switched on."""
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ToggledLoad:
        cpu = self.cpu
        self._proc = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                      preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        self._thread = threading.Thread(target=self._toggle, name="toggled-load", daemon=True)
        self._thread.start()
        return self

    def _toggle(self) -> None:
        proc = self._proc
        assert proc is not None
        on = True
        while not self._stop.is_set():
            span = self.rng.uniform(*(self.on_s if on else self.off_s))
            began = time.monotonic()
            self._stop.wait(span)
            if on:
                self.busy_s += time.monotonic() - began
            if self._stop.is_set() or proc.poll() is not None:
                return
            proc.send_signal(signal.SIGSTOP if on else signal.SIGCONT)
            on = not on
            self.switches += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # (a stopped process takes SIGKILL too; said for the reader)
            self._proc.kill()
            self._proc.wait(timeout=10)
