"""Run a pictl module through this login's warm process, or start one (stdlib only: it costs no torch import).

    python -m remote.host.warmclient MODULE ARGS...     run MODULE as a program, forked from the warm process
    python -m remote.host.warmclient --ensure            start the warm process if it is not running; its status
    python -m remote.host.warmclient --status            its status as one JSON line (or {"running": false})
    python -m remote.host.warmclient --stop              end it (and whatever it still runs)

A job is handed over with this process's stdin, stdout and stderr (file descriptors passed over the Unix
socket), its environment and its working directory: the forked child writes straight into the pipes this
process was given, so whoever started it (torchrun, pictl's supervisor) sees the job exactly as a process
of its own. This process stays as the job's stand-in: it forwards SIGTERM, SIGINT and SIGHUP to the job,
and ends with the job's exit status (a job killed by a signal kills it with the same signal). If this
process dies, the warm process sees the socket close and stops the job's process group.

Which warm process serves us is decided by `remote.host.warm.server_key`: this login, the interpreter and
its installed packages, the code's manifest, the network namespace and the cgroup. When none is running,
one is started (under a lock, so concurrent clients start one) and we wait for it; when it cannot start
(too little memory, a broken import), the job runs cold, in a fresh interpreter, with a note on stderr.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

from remote.host import warm as W

START_TIMEOUT_S = float(os.environ.get("PICTL_WARM_START_TIMEOUT", "300"))
"""Importing torch on a Pi 4 from an SD card takes tens of seconds; more means something is wrong."""


def _note(message: str) -> None:
    sys.stderr.write(f"pictl-warm: {message}\n")
    sys.stderr.flush()


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        W.connect_path(sock, path)
        return sock
    except OSError:
        sock.close()
        return None


def _start_server(path: str) -> socket.socket | None:
    """Start the warm process (one client at a time, under a lock) and connect to it; None if it cannot start."""
    directory = os.path.dirname(path)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)  # another client may have started it while we waited for the lock
        if sock is not None:
            return sock
        log = open(os.path.join(directory, f"{os.path.basename(path)}.log"), "ab")
        proc = subprocess.Popen([sys.executable, "-m", "remote.host.warmserve", "--socket", path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, cwd="/", env=_server_env())
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if proc.poll() is not None:  # it gave up (too little memory, an import failed): its log says why
                _note(f"the warm process could not start (exit {proc.returncode}): {W.last_line(path)}")
                return None
            time.sleep(0.05)
        _note(f"the warm process did not start within {START_TIMEOUT_S:.0f} s")
        return None


def _server_env() -> dict[str, str]:
    """What the warm process starts with: not this job's environment (its ranks, ports and run), only what
    importing needs; each job brings its own. No BLAS thread pool at import: a fork copies no threads."""
    keep = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
            "PICTL_WARM_DIR", "PICTL_WARM_IDLE", "TMPDIR")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, "OPENBLAS_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def _cold(argv: list[str]) -> int:
    """Run the job in a fresh interpreter, as pictl did before warm processes (this process becomes it)."""
    os.execv(sys.executable, [sys.executable, "-m", *argv])
    return 127  # not reached


def _run(argv: list[str]) -> int:
    try:
        path = W.socket_path()
    except OSError as exc:  # no directory of this login's for the socket: the job runs as it always could
        _note(f"no warm process ({exc}); running the job cold")
        return _cold(argv)
    sock = _connect(path) or _start_server(path)
    if sock is None:
        return _cold(argv)
    # What a child does not inherit from us but must have (a cold process would): environment, directory,
    # umask, the CPUs it may run on (taskset, a pinned caller) and its niceness.
    request = json.dumps({"op": "run", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                          "umask": _umask(), "cpus": sorted(os.sched_getaffinity(0)),
                          "nice": os.getpriority(os.PRIO_PROCESS, 0)}).encode()
    try:
        socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        reply = W.read_message(sock)
    except (OSError, ValueError) as exc:
        _note(f"the warm process did not take the job ({exc}); running it cold")
        sock.close()
        return _cold(argv)
    if reply is None or "pid" not in reply:
        _note(f"the warm process refused the job ({(reply or {}).get('error', 'no answer')}); running it cold")
        sock.close()
        return _cold(argv)

    def forward(signum: int, _frame: object) -> None:
        try:
            W.send_message(sock, {"op": "signal", "signal": signum})
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            done = W.read_message(sock)
            break
        except InterruptedError:
            continue
        except (OSError, ValueError):
            done = None
            break
    if done is None or "status" not in done:
        # The warm process ended under the job (killed, or out of memory): the job is gone with it.
        _note(f"the warm process (pid {reply.get('server')}) ended while it ran this job")
        return W.EXIT_WARM_LOST
    status = int(done["status"])
    if status < 0:  # killed by a signal: end the same way, so the caller sees what the job saw
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _control(op: str) -> int:
    path = W.socket_path()
    sock = _connect(path)
    if sock is None and op == "ensure":
        sock = _start_server(path)
    if sock is None:
        print(json.dumps({"running": False, "socket": path, "key": W.server_key()}))
        return 0 if op != "ensure" else 1
    with sock:
        W.send_message(sock, {"op": op})
        reply = W.read_message(sock) or {}
    print(json.dumps({"running": op != "stop", "socket": path, **reply}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(__doc__ or "")
        return 2
    if args[0] in ("--ensure", "--status", "--stop"):
        return _control(args[0][2:])
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
