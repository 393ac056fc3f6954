"""Run a pictl module through this workdir's warm process, or start one (stdlib only: it costs no torch import).

    python -m remote.host.warmclient MODULE ARGS...     run MODULE as a program, forked from the warm process
    python -m remote.host.warmclient --ensure            start this workdir's warm process if none runs; its status
    python -m remote.host.warmclient --status            its status as one JSON line (or {"running": false})
    python -m remote.host.warmclient --stop [--all]      end this controller's jobs in it (every job with --all),
                                                         and it, and the root, when nothing else is left in them

A job is handed over with this process's stdin, stdout and stderr (file descriptors passed over the Unix
socket), its environment and its working directory: the forked child writes straight into the pipes this
process was given, so whoever started it (torchrun, pictl's supervisor) sees the job exactly as a process
of its own. This process stays as the job's stand-in: it forwards SIGTERM, SIGINT and SIGHUP to the job,
and ends with the job's exit status (a job killed by a signal kills it with the same signal). If this
process dies, the warm process sees the socket close and stops the job's process group.

Which warm process serves us is decided by `remote.host.warm`: the root by `server_key` (this login, the
interpreter and its packages, the code's manifest, the network namespace and the cgroup), and under it the
server of this workdir (the directory of the code we run). When none is running, the root is started (under a
lock, so concurrent clients start one) and asked for this workdir's server. Whenever a warm process cannot
serve (too little memory, a broken import, stopped or stuck: every wait has a timeout), the job runs cold, in
a fresh interpreter, with one note on stderr.
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

from remote.floor import entries
from remote.floor.protocol import WARM_NOTE
from remote.host import warm as W

START_TIMEOUT_S = float(os.environ.get("PICTL_WARM_START_TIMEOUT", "300"))
"""Importing torch on a Pi 4 from an SD card takes tens of seconds; more means something is wrong."""
STATUS_POLL_S = 2.0
"""While a job runs, how often its client looks whether the job ended unreported."""


def _note(message: str) -> None:
    sys.stderr.write(f"{WARM_NOTE} {message}\n")
    sys.stderr.flush()


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        W.connect_path(sock, path)
        return sock
    except OSError:
        sock.close()
        return None


class Unavailable(Exception):
    """No warm process can serve this job: the note says why, and the job runs cold."""


def _lock(path: str) -> int:
    """This warm directory's start-up lock, taken within the start timeout (a client that holds it forever, as
    a stopped one would, does not hang every other one)."""
    try:
        fd = W.open_private(f"{path}.lock", os.O_WRONLY | os.O_CREAT)
    except OSError as exc:
        raise Unavailable(f"cannot open {path}.lock ({exc.strerror})") from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise Unavailable(f"another client held {path}.lock for {START_TIMEOUT_S:.0f} s") from None
            time.sleep(0.05)


def _root(path: str) -> socket.socket:
    """The root warm process at `path`: connected to, or started (one client at a time, under a lock)."""
    if not W.is_socket_or_absent(path):
        raise Unavailable(f"{path} is not a socket")
    sock = _connect(path)
    if sock is not None:
        return sock
    lock = _lock(path)
    try:
        sock = _connect(path)  # another client may have started it while we waited for the lock
        if sock is not None:
            return sock
        try:
            log = W.open_private(f"{path}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise Unavailable(f"cannot open {path}.log ({exc.strerror})") from None
        proc = subprocess.Popen([sys.executable, "-m", entries.WARM_ROOT.module, "--socket", path],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, cwd="/", env=_server_env())
        os.close(log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if proc.poll() is not None:  # it gave up (too little memory, an import failed): its log says why
                raise Unavailable(f"the warm process could not start (exit {proc.returncode}): "
                                  f"{W.last_line(path)}")
            time.sleep(0.05)
        raise Unavailable(f"the warm process did not start within {START_TIMEOUT_S:.0f} s")
    finally:
        os.close(lock)


def _workdir_server(root_path: str, *, start: bool = True) -> socket.socket | None:
    """A connection to this workdir's warm server, asking the root for one (started if need be) when none
    runs; None if none runs and `start` is False. Unavailable (with the reason) when none can serve."""
    path = W.workdir_socket_path(root_path)
    if not W.is_socket_or_absent(path):
        raise Unavailable(f"{path} is not a socket")
    sock = _connect(path)
    if sock is not None or not start:
        return sock
    with _root(root_path) as root:
        try:
            reply = W.ask(root, {"op": "spawn", "code": W.code_root()})
        except (OSError, ValueError) as exc:
            raise Unavailable(str(exc)) from None
    if not reply or "pid" not in reply:
        raise Unavailable(f"the root refused to start this workdir's server ({(reply or {}).get('error')})")
    deadline = time.monotonic() + W.REPLY_TIMEOUT_S
    while time.monotonic() < deadline:  # (it listens a moment after the fork)
        sock = _connect(path)
        if sock is not None:
            return sock
        if not W.process_state(int(reply["pid"])) or W.stopped(int(reply["pid"])):
            break
        time.sleep(0.02)
    raise Unavailable(f"this workdir's warm server (pid {reply['pid']}) did not start listening")


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
        sock = _workdir_server(W.socket_path())
        assert sock is not None
    except (Unavailable, OSError) as exc:  # (OSError: no directory of this login's for the sockets)
        _note(f"no warm process ({exc}); running the job cold")
        return _cold(argv)
    # What a child does not inherit from us but must have (a cold process would): environment, directory,
    # umask, the CPUs it may run on (taskset, a pinned caller) and its niceness. The deadline: a warm process
    # that reads this after we gave up and went cold must not run the job a second time.
    request = json.dumps({"op": "run", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                          "umask": _umask(), "cpus": sorted(os.sched_getaffinity(0)),
                          "nice": os.getpriority(os.PRIO_PROCESS, 0),
                          "deadline": time.time() + W.REPLY_TIMEOUT_S}).encode()
    server = W.peer_pid(sock)
    try:
        # First a question that carries no file descriptors: a server that is stopped or stuck must not be left
        # holding our stdout in its socket's queue (the job's reader would never see it end).
        W.ask(sock, {"op": "status"})
        sock.settimeout(W.REPLY_TIMEOUT_S)
        socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
        reply = W.read_message(sock)
    except W.NoAnswer as exc:
        _note(f"{exc}; running the job cold")
        sock.close()
        return _cold(argv)
    except TimeoutError:
        _note(f"{W.silence(server, W.REPLY_TIMEOUT_S)}; running the job cold")
        sock.close()
        return _cold(argv)
    except (OSError, ValueError) as exc:
        _note(f"the warm process did not take the job ({exc}); running it cold")
        sock.close()
        return _cold(argv)
    if reply is None or "pid" not in reply:
        _note(f"the warm process refused the job ({(reply or {}).get('error', 'no answer')}); running it cold")
        sock.close()
        return _cold(argv)
    sock.settimeout(STATUS_POLL_S)
    job = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            W.send_message(sock, {"op": "signal", "signal": signum})
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    done = _wait(sock, job)
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


def _wait(sock: socket.socket, job: int) -> dict | None:
    """The job's end as its warm process reports it; if that process stops answering (stopped under the job)
    once the job has finished, the status is read from the job's own /proc entry instead."""
    unreported_since: float | None = None
    while True:
        try:
            return W.read_message(sock)
        except (InterruptedError, TimeoutError):
            pass
        except (OSError, ValueError):
            return None
        status = W.zombie_status(job)
        if status is None:
            unreported_since = None
            continue
        unreported_since = unreported_since or time.monotonic()
        if time.monotonic() - unreported_since >= STATUS_POLL_S:
            _note(f"the warm process did not report job {job}'s end; its status was read from /proc")
            return {"status": os.waitstatus_to_exitcode(status)}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _control(op: str, owner: str | None) -> dict:
    """`--status`, `--ensure` or `--stop` of this workdir's warm server, as one JSON object. A warm process that
    does not answer is reported (`answering` false, with the reason), never waited for."""
    root_path = W.socket_path()
    out: dict = {"running": False, "socket": W.workdir_socket_path(root_path), "key": W.server_key()}
    try:
        sock = _workdir_server(root_path, start=op == "ensure")
    except Unavailable as exc:
        return {**out, "error": str(exc)}
    if sock is None:
        return out if op != "stop" else {**out, **_stop_root(root_path)}
    with sock:
        try:
            reply = W.ask(sock, {"op": op, "owner": owner} if op == "stop" else {"op": op}) or {}
        except W.NoAnswer as exc:
            return {**out, "running": True, "answering": False, "pid": exc.pid, "error": str(exc)}
        except (OSError, ValueError) as exc:
            return {**out, "running": True, "answering": False, "error": f"the warm process: {exc}"}
    out.update(reply, running=True, answering=True)
    if op == "stop" and reply.get("ended"):
        _until_gone(reply.get("pid"))
        out.update(running=False, **_stop_root(root_path))
    return out


def _until_gone(pid: object) -> None:
    deadline = time.monotonic() + W.GRACE_S + 2
    while isinstance(pid, int) and W.process_state(pid) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.05)


def _stop_root(root_path: str) -> dict:
    """Ask the root to end unless it still serves another workdir (whose team's jobs it must not end)."""
    sock = _connect(root_path)
    if sock is None:
        return {"root_ended": False, "root_running": False}
    with sock:
        try:
            reply = W.ask(sock, {"op": "stop"}) or {}
        except (OSError, ValueError) as exc:
            return {"root_ended": False, "root_running": True, "root_error": str(exc)}
    return {"root_ended": reply.get("ended") is True, "root_running": reply.get("ended") is not True,
            "root_pid": reply.get("pid"), "root_workdirs": reply.get("workdirs")}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(__doc__ or "")
        return 2
    if args[0] in ("--ensure", "--status", "--stop"):
        op = args[0][2:]
        if op == "stop" and args[1:2] != ["--all"] and (len(args) != 3 or args[1] != "--owner"):
            sys.stderr.write("usage: warmclient --stop (--owner NAME | --all)\n")
            return 2
        found = _control(op, args[2] if op == "stop" and len(args) == 3 else None)
        print(json.dumps(found))
        return 1 if op == "ensure" and not found.get("running") else 0
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
