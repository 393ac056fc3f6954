"""This login's warm process: torch, timm and pictl's runtime imported once, jobs served by forking. This
module is what the process, its jobs and its clients share: where its socket is, which process may serve a
job, the messages; the loop is `remote.host.warmserve`, a job `remote.host.warmjob`, the client
`remote.host.warmclient`.

    python -m remote.host.warmserve --socket PATH     (started by `remote.host.warmclient`, never by hand)

It imports the modules every pictl job needs (and nothing that starts a thread: a child sets its own
thread count), then listens on a Unix socket in a 0700 directory of this login's. A client (the stdlib-only
`warmclient`, which torchrun and pictl start in place of `python -m MODULE`) hands over a job: its stdin,
stdout and stderr (passed file descriptors), environment, working directory and arguments. The job runs in
a forked child, in a session (and process group) of its own, as `MODULE.main()` under `__main__`'s rules,
with PR_SET_PDEATHSIG so that it dies with us; its group id is recorded in its working directory
(`pgid-warm-<pid>`), where `pictl stop` and the cleanup sweeps find it. The client stays as the job's
stand-in: a signal it gets is forwarded to the job's group, the job's exit status comes back to it, and if
the client goes away (killed, its torchrun gone) the job's group is stopped.

Only this login is served: the directory is 0700 and every peer's credentials are checked (SO_PEERCRED).
One warm process serves one key (`server_key`): the interpreter and its packages, the pushed code's
manifest, the network namespace and the cgroup, so a child runs exactly where a cold process would. It ends
after `PICTL_WARM_IDLE` seconds without a job (default 600), when the code it loaded is replaced (a push
changed it: it finishes its jobs and goes), on `--stop` (`pictl stop`), and on SIGTERM.

Stdlib only at import: the client imports this module for the socket's path and the message format.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import sysconfig
from typing import Any

EXIT_WARM_LOST = 75
"""A client's status when the warm process ended under its job (EX_TEMPFAIL: a next job starts a fresh one)."""
IDLE_S = 600.0
GRACE_S = 5.0
MIN_AVAILABLE_MB = 600
"""Below this much available memory the warm process does not start (its jobs run cold): a Pi with 1 GB."""
ENTRY_MODULES = ("remote.runtime.pipeline", "remote.runtime.serial", "remote.runtime.plan",
                 "remote.profiling.costs", "remote.profiling.linktest", "remote.training.train",
                 "remote.pruning.prune", "torch.distributed.run")
"""What a job may be: the programs pictl starts on a host (torchrun's agent included)."""
PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.distributed.pipelining", "timm",
           "safetensors.torch", "remote.runtime.pipeline", "remote.runtime.serial", "remote.runtime.plan",
           "remote.profiling.costs", "remote.profiling.linktest", "remote.training.train")
"""Imported before the first job. Every `remote` module is imported too (a job never reads pictl's code from
disk: the code directory it came from may be gone by then); torch-pruning is left to the jobs that prune."""


# -- where, and the messages (client and server) ---------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 16).decode(errors="replace")
    except OSError:
        return ""


def code_manifest() -> str:
    """The pushed code's manifest (what `pictl push` wrote beside `remote/`): which code a job runs."""
    import remote

    root = os.path.dirname(os.path.dirname(os.path.abspath(remote.__file__)))
    return _read(os.path.join(root, ".pictl-manifest.json"))


def packages_stamp() -> int:
    """When this interpreter's installed packages last changed (an install or removal touches the directory)."""
    try:
        return os.stat(sysconfig.get_paths()["purelib"]).st_mtime_ns
    except OSError:
        return 0


def server_key() -> str:
    """Which warm process may serve this process: one that would run its job exactly as this one would."""
    packages = packages_stamp()
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    parts = [str(os.getuid()), sys.prefix, sys.executable, str(packages), code_manifest(), netns,
             _read("/proc/self/cgroup")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def warm_dir() -> str:
    """This login's directory for warm sockets: 0700, ours, or refused."""
    base = os.environ.get("PICTL_WARM_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "pictl", "warm")
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.stat(base)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{base} belongs to another user: warm processes need a directory of their own")
    if st.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def socket_path() -> str:
    return os.path.join(warm_dir(), f"{server_key()}.sock")


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


def last_line(path: str) -> str:
    lines = _read(f"{path}.log").strip().splitlines()
    return lines[-1] if lines else "no output"


def available_mb() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return None
