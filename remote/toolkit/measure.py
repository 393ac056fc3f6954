"""Process-level helpers shared by the runners: memory, threads, timing, parent death."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.errors import BadInput
from remote.floor.run_records import Error


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)  # Linux: KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return round(int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def die_with_parent() -> None:
    """Ask Linux to SIGTERM us when our parent (torchrun) dies, however it dies.

    torchrun starts each worker in a session of its own, so a SIGKILLed torchrun
    would otherwise leave its workers running on the host.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)


def set_threads(threads: int) -> int:
    """Use the controller's per-host count when it gave one, else the spec's; returns what is used."""
    threads = int(os.environ.get(P.ENV_THREADS) or threads)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


@dataclass
class StageCounters:
    """What a stage did over the timed repeats so far (or one repeat)."""

    microbatches: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    send_s: float = 0.0
    bytes_sent: int = 0
    """Bytes on the wire (after `--wire`'s encoding)."""
    raw_bytes: int = 0
    """The same activations' fp32 bytes (what would travel uncompressed)."""
    compress_s: float = 0.0
    decompress_s: float = 0.0
    peak_Bps: float = 0.0
    """The highest wire bytes per second of computation over one microbatch (a maximum, not a sum)."""
    recv_post_s: float = 0.0
    """Posting receives (inside `wait_s`)."""
    recv_wait_s: float = 0.0
    """Waiting on posted receives (inside `wait_s`): for the neighbour's compute, or for the wire."""
    first_wait_s: float = 0.0
    """The part of `recv_wait_s` spent on each pass's first microbatch: the pipeline filling."""
    send_post_s: float = 0.0
    """Posting sends (inside `send_s`, which is what is left of a pass after compute and wait)."""
    drain_s: float = 0.0
    """Waiting for the pass's sends to finish, after the last microbatch (inside `send_s`)."""
    run_delay_s: float = 0.0
    """Time this process's main thread waited for while runnable because other work held the CPU (the
    kernel's schedstat run delay less the host's CPU-quota throttling), over the passes."""
    pass_s: float = 0.0
    """The passes' wall time on this rank."""

    def add(self, other: StageCounters) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, max(getattr(self, key), value) if key == "peak_Bps" else getattr(self, key) + value)

    def rounded(self) -> dict:
        d = asdict(self)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}


class ProgressClock:
    """Calls `report` at most every `interval` seconds."""

    def __init__(self, interval: float, report: Callable[[], None]) -> None:
        self.interval = interval
        self.report = report
        self._last = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self.report()


def run_main(emitter: Emitter, body: Callable[[], None]) -> int:
    """Run a host entry point: bad input exits 2, anything else exits 1, both with an error event."""
    try:
        body()
        return 0
    except BadInput as exc:
        emitter.emit(Error(kind="bad_input", message=str(exc), traceback=""))
        print(f"pictl: {exc}", file=sys.stderr)
        return P.EXIT_BAD_INPUT
    except Exception as exc:  # the controller needs every failure as an event
        emitter.emit(Error(kind="runtime", message=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()))
        traceback.print_exc()
        return P.EXIT_RUNTIME_ERROR
