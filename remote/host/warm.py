"""This login's warm processes: torch, timm and pictl's runtime imported once, jobs served by forking. This
module is what the processes, their jobs and their clients share: where the sockets are, which process may
serve a job, the messages and their timeouts; the loop is `remote.host.warmserve` (the root `warmroot`, a
workdir server `warmworkdir`), a job `remote.host.warmjob`, the client `remote.host.warmclient`.

    python -m remote.host.warmroot --socket PATH     (started by `remote.host.warmclient`, never by hand)

Two levels, so that one torch import serves a login while no process is shared between workdirs:

- the **root** (one per `server_key`: this login, the interpreter and its packages, the pushed code's
  manifest, the network namespace and the cgroup) imports the modules every job needs (and nothing that
  starts a thread) and runs no job itself: it forks one **workdir server** per workdir that asks;
- a **workdir server** (one per root and workdir: the pushed code's directory names the workdir) is a fork of
  the root that imported nothing new; it serves that workdir's jobs, each forked again, in a session (and
  process group) of its own, as `MODULE.main()` under `__main__`'s rules, with PR_SET_PDEATHSIG so that it
  dies with its server; its group id is recorded in its working directory (`pgid-warm-<pid>`), where
  `pictl stop` and the cleanup sweeps find it. A team's `pictl stop` ends its own workdir's server only, and
  within it only its own controller's jobs (`owner`, from `PICTL_OWNER`) unless it asks for all.

A client (the stdlib-only `warmclient`, which torchrun and pictl start in place of `python -m MODULE`) hands
over a job: its stdin, stdout and stderr (passed file descriptors), environment, working directory and
arguments. It stays as the job's stand-in: a signal it gets is forwarded to the job's group, the job's exit
status comes back to it, and if the client goes away (killed, its torchrun gone) the job's group is stopped.
Every wait for an answer has a timeout (`REPLY_TIMEOUT_S`): a warm process that is stopped (SIGSTOP) or
stuck is reported and the job runs cold, never hangs.

Only this login is served: the directory is 0700 and every peer's credentials are checked (SO_PEERCRED).
A process ends after `PICTL_WARM_IDLE` seconds without a job (default 600; the root when it has no workdir
server left), when the code it loaded is replaced (a push changed it: it finishes its jobs and goes), on
`--stop` (`pictl stop`), and on SIGTERM.

Stdlib only at import: the client imports this module for the sockets' paths and the message format.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import struct
import sys
import sysconfig
from typing import Any

from remote.floor import entries
from remote.floor.protocol import ENV_OWNER

EXIT_WARM_LOST = 75
"""A client's status when the warm process ended under its job (EX_TEMPFAIL: a next job starts a fresh one)."""
IDLE_S = 600.0
GRACE_S = 5.0
MIN_AVAILABLE_MB = 600
"""Below this much available memory the warm process does not start (its jobs run cold): a Pi with 1 GB."""
REPLY_TIMEOUT_S = float(os.environ.get("PICTL_WARM_REPLY_TIMEOUT") or 20.0)
"""How long a client waits for a warm process to answer a request (a job taken, a status, a stop): one that
answers later is stopped or stuck, and the job runs cold instead of hanging with it."""
OWNER_ENV = ENV_OWNER
"""The controller a job belongs to (set by the controller on every job): what `pictl stop` matches."""
ENTRY_MODULES = entries.JOBS
"""What a job may be: the programs pictl starts on a host (torchrun's agent included; `remote/floor/entries.py`)."""
PRELOAD = ("torch", "torch.distributed", "torch.distributed.pipelining", "timm", "safetensors.torch",
           *entries.PRELOADED)
"""Imported before the first job. Every `remote` module is imported too (a job never reads pictl's code from
disk: the code directory it came from may be gone by then); torch-pruning is left to the jobs that prune."""


# -- where, and the messages (client and server) ---------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 16).decode(errors="replace")
    except OSError:
        return ""


def code_manifest(root: str | None = None) -> str:
    """The pushed code's manifest (what `pictl push` wrote beside `remote/`, in `root`, else this process's
    code directory): which code a job runs."""
    return _read(os.path.join(root or code_root(), ".pictl-manifest.json"))


def packages_stamp() -> int:
    """When this interpreter's installed packages last changed (an install or removal touches the directory)."""
    try:
        return os.stat(sysconfig.get_paths()["purelib"]).st_mtime_ns
    except OSError:
        return 0


def code_root() -> str:
    """The directory of the code this process runs (a workdir's `code/`, where `pictl push` puts it)."""
    import remote

    return os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(remote.__file__))))


def server_key() -> str:
    """Which root may serve this process: one that would run its job exactly as this one would."""
    packages = packages_stamp()
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    parts = [str(os.getuid()), sys.prefix, sys.executable, str(packages), code_manifest(), netns,
             _read("/proc/self/cgroup")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def warm_dir() -> str:
    """This login's directory for warm sockets: 0700 and ours. `PICTL_WARM_DIR` may name a shared directory
    (a sticky /tmp-like one, or another user's): its mode is never changed; a private `pictl-warm-<uid>`
    inside it is used instead. A link where the directory should be is refused (OSError)."""
    base = os.environ.get("PICTL_WARM_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pictl", "warm")
    if _private_dir(base, create=not os.environ.get("PICTL_WARM_DIR") or not os.path.lexists(base)):
        return base
    return _private_dir(os.path.join(base, f"pictl-warm-{os.getuid()}"), create=True, must=True) or ""


def _private_dir(path: str, *, create: bool, must: bool = False) -> str | None:
    """`path` if it is a directory of ours that nobody else may enter (made 0700 when `create` and missing);
    None if it exists but is shared (and `must` is False); OSError if it is a link, not a directory, or
    another user's where it must be ours."""
    if create and not os.path.lexists(path):
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass  # another client made it meanwhile: checked below like any other
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory of pictl's (a link or a file): warm processes "
                                 "need a directory of their own")
    if st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return path
    if must:
        raise PermissionError(f"{path} is not this login's alone (owner uid {st.st_uid}, mode "
                              f"{stat.S_IMODE(st.st_mode):o}): warm processes need a directory of their own")
    return None


def socket_path() -> str:
    """The root's socket (one per `server_key`)."""
    return os.path.join(warm_dir(), f"{server_key()}.sock")


def workdir_socket_path(root_path: str, code: str | None = None) -> str:
    """The socket of the workdir server forked from the root at `root_path` for the code at `code` (this
    process's, by default): one per root and workdir."""
    digest = hashlib.sha256((code or code_root()).encode()).hexdigest()[:10]
    return f"{root_path.removesuffix('.sock')}-{digest}.sock"


def open_private(path: str, flags: int) -> int:
    """Open a file of the warm directory (a lock, a log) without following a link there (O_NOFOLLOW)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def is_socket_or_absent(path: str) -> bool:
    """Whether `path` can be a warm socket: a socket, or nothing yet (a directory or a file there cannot)."""
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process that listens at the other end of a connected Unix socket."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid = struct.unpack("3i", creds)[0]
    return pid or None


def process_state(pid: int) -> str:
    """The one-letter state of `pid` (R, S, D, T stopped, t traced, Z zombie, ...) or "" if it is gone."""
    stat_line = _read(f"/proc/{pid}/stat")
    try:
        return stat_line.rsplit(")", 1)[1].split()[0]
    except IndexError:
        return ""


def zombie_status(pid: int) -> int | None:
    """A finished but unreaped child's exit status (waitpid's encoding, from /proc/PID/stat's exit_code), read
    when its parent (a stopped warm process) cannot report it; None if `pid` is not a zombie."""
    stat_line = _read(f"/proc/{pid}/stat")
    try:
        fields = stat_line.rsplit(")", 1)[1].split()
    except IndexError:
        return None
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    return int(fields[49])


def stopped(pid: int | None) -> bool:
    return pid is not None and process_state(pid) in ("T", "t")


def connect_path(sock: socket.socket, path: str) -> None:
    """Connect to `path`; a path longer than a socket address holds (108 bytes) by its directory."""
    if len(path.encode()) < 100:
        sock.connect(path)
        return
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{os.path.basename(path)}")
    finally:
        os.close(fd)


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(body)) + body)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def read_message(sock: socket.socket) -> dict[str, Any] | None:
    """One length-prefixed JSON object, or None when the peer closed the socket."""
    head = _exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack("!I", head)
    if size > 16 << 20:
        raise ValueError(f"a message of {size} bytes")
    body = _exactly(sock, size)
    if body is None:
        return None
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


class NoAnswer(OSError):
    """A warm process did not take a request in time: stopped (SIGSTOP), or stuck. Its pid, if known."""

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid


def silence(pid: int | None, timeout_s: float) -> NoAnswer:
    """Why a warm process does not answer, in a line that says what to do about it."""
    who = f"the warm process (pid {pid})" if pid else "the warm process"
    if stopped(pid):
        return NoAnswer(f"{who} is stopped (SIGSTOP or a debugger): `kill -CONT {pid}` resumes it", pid)
    return NoAnswer(f"{who} did not answer within {timeout_s:g} s", pid)


def ask(sock: socket.socket, message: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any] | None:
    """Send one request and read its answer within `timeout_s` (REPLY_TIMEOUT_S): NoAnswer if none comes, at
    once if the warm process is seen stopped; None if it closed the socket."""
    timeout_s = REPLY_TIMEOUT_S if timeout_s is None else timeout_s
    pid = peer_pid(sock)
    if stopped(pid):
        raise silence(pid, timeout_s)
    sock.settimeout(timeout_s)
    try:
        send_message(sock, message)
        return read_message(sock)
    except TimeoutError:
        raise silence(pid, timeout_s) from None
    finally:
        sock.settimeout(None)


def last_line(path: str) -> str:
    lines = _read(f"{path}.log").strip().splitlines()
    return lines[-1] if lines else "no output"


def available_mb() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return None
