"""What a job forked from the warm process is (`remote.host.warmworkdir`): its own session and name, the
client's streams, environment and directory, its group recorded where the sweeps look, then `MODULE.main()` as
`python -m MODULE ARGS` would run it, and the way it ends.

Stdlib only at import (the warm process imports torch before it forks; this module needs none of it).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import io
import os
import signal
import sys
import threading
from dataclasses import dataclass


@dataclass
class Job:
    """What a child runs: a module's `main()` as the program `python -m MODULE ARGS` would be."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    umask: int
    cpus: list[int] | None = None
    """The CPUs the client may run on (its affinity: taskset, a pinned caller): the job gets the same."""
    nice: int | None = None

    def run(self) -> int:
        module_name, args = self.argv[0], self.argv[1:]
        if self.cpus:  # first: nothing of the job runs off its host's cores, not even in its run directory
            os.sched_setaffinity(0, self.cpus)
        os.chdir(self.cwd)
        os.umask(self.umask)
        if self.nice is not None and self.nice > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)  # (only ever lower: a job is never made more urgent)
        os.environ.clear()
        os.environ.update(self.env)
        _reset_stdio()
        module = importlib.import_module(module_name)
        sys.argv = [getattr(module, "__file__", module_name) or module_name, *args]
        try:
            code = module.main()
        except SystemExit as exc:
            code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1


def _reset_stdio() -> None:
    """Fresh text streams over fds 0-2 (now the client's): line-buffered and written through, as the
    `-u` / PYTHONUNBUFFERED that pictl's jobs run with."""
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True,
                                  errors="backslashreplace")



def die_with_parent(name: str) -> None:
    """PR_SET_PDEATHSIG, and the process's name (`name_process`)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)
    name_process(name)


def name_process(name: str) -> None:
    """PR_SET_NAME, so `top` and `ps -o comm` tell a job or a workdir server from the root it was forked from
    (its command line stays the root's: a fork does not change it)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode()[:15]))


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def record_group(cwd: str) -> None:
    """Where `pictl stop` and the cleanup sweeps look for a run's process groups (as `supervise` writes)."""
    if os.path.basename(os.path.dirname(os.path.abspath(cwd))) != "runs":
        return  # not a run directory (a profile's or a check's): nothing sweeps it
    path = os.path.join(cwd, f"pgid-warm-{os.getpid()}")
    try:
        with open(f"{path}.tmp", "w") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass


def finish(code: int) -> None:
    """End the job's process as a normal exit would for it (its threads joined, its atexit handlers run, its
    streams flushed), without tearing down every module torch and timm loaded: an interpreter that imported
    them spends a second or more on that at exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF if code >= 0 else 1)
