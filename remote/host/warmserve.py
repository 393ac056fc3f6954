"""The warm processes' loop (`remote.host.warm`), what the root (`remote.host.warmroot`: preloads, forks one
workdir server per workdir) and a workdir server (`remote.host.warmworkdir`: forks that workdir's jobs) share:
the socket, this login's clients and their requests, status, children and their ends, and ending when idle,
replaced, stopped or signalled.

One thread, one selector per process: the listening socket, every client's socket, and a self-pipe that
SIGCHLD and SIGTERM write to. A fork happens from this one thread, with no other thread alive (the preloaded
modules start none), which is what makes forking a process that imported torch safe: the root forks its
workdir servers, and they fork their jobs, the same way.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from remote.host import warm as W
from remote.host.warmjob import Job, signal_group

CODE_CHECK_S = 2.0


@dataclass
class Client:
    sock: socket.socket
    buffer: bytes = b""
    fds: list[int] = field(default_factory=list)
    child: int | None = None
    kill_at: float | None = None
    record: str | None = None
    """The child's `pgid-warm-*` file, removed when it ends."""
    owner: str | None = None
    """The controller the job belongs to (`W.OWNER_ENV` in its environment): what `pictl stop` matches."""
    module: str = ""


@dataclass
class Origin:
    """What a workdir server keeps of the root it was forked from (what it preloaded, and when)."""

    pid: int
    started: float
    preloaded: list[str]
    import_s: float


class Server:
    """What the root (`remote.host.warmroot.Root`: `code_dir` None) and a workdir server (`WorkdirServer`:
    the jobs of the workdir whose pushed code is at `code_dir`) share: the socket, the loop, this login's
    clients, status, children and how they end."""

    def __init__(self, path: str, code_dir: str | None = None, origin: Origin | None = None) -> None:
        self.path = path
        self.code_dir = code_dir
        self.pid = os.getpid()
        self.started = time.time()
        self.origin = origin
        self.idle_s = float(os.environ.get("PICTL_WARM_IDLE") or W.IDLE_S)
        self.clients: dict[int, Client] = {}  # by socket fd
        self.children: dict[int, Client] = {}  # a workdir server's jobs, by pid
        self.servers: dict[int, str] = {}  # the root's workdir servers: pid -> socket path
        self.preloaded: list[str] = list(origin.preloaded) if origin else []
        self.import_s = origin.import_s if origin else 0.0
        self.served = 0
        self.last_busy = time.monotonic()
        self.stopping = False
        self.manifest = W.code_manifest(code_dir)
        self.packages = W.packages_stamp()
        self.inode = 0
        self.own_fds: list[int] = []
        """The listener and the wake pipe: closed in every child."""
        self.listener: socket.socket | None = None
        self.sel: selectors.BaseSelector | None = None

    @property
    def role(self) -> str:
        return "root" if self.code_dir is None else "workdir"

    @staticmethod
    def _job_entry(pid: int, job: Client) -> dict[str, Any]:
        return {"pid": pid, "owner": job.owner, "module": job.module}

    # -- start --------------------------------------------------------------------------------------

    def _listen(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        directory, name = os.path.split(self.path)
        os.chdir(directory)  # bind by a short relative name (a socket address holds 108 bytes)
        tmp = f".{name}.{os.getpid()}"
        try:
            sock.bind(tmp)
            os.chmod(tmp, 0o600)
            sock.listen(64)  # (here, in this process: a client's SO_PEERCRED names the process that listens)
            os.replace(tmp, name)  # clients see it only once it accepts
        except OSError:
            sock.close()
            try:
                os.unlink(tmp)  # (a directory where the socket goes: nothing of ours left behind)
            except OSError:
                pass
            raise
        finally:
            os.chdir("/")
        self.inode = os.stat(self.path).st_ino
        return sock

    # -- the loop -------------------------------------------------------------------------------------

    def serve(self) -> Job | None:
        if not self._prepare():
            return None
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        listener = self.listener = self._listen()
        self.own_fds = [listener.fileno(), wake_r, wake_w]
        print(f"warm: pid {self.pid} serving {self._serving()} at {self.path}", flush=True)
        sel = self.sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        next_check = time.monotonic() + CODE_CHECK_S
        try:
            while not (self.stopping and not self.children and not self.servers):
                for key, _ in sel.select(timeout=0.5):
                    if key.data == "listen":
                        self._accept(listener, sel)
                    elif key.data == "wake":
                        os.read(wake_r, 4096)
                    else:
                        job = self._serve_client(key.data, sel)
                        if job is not None:
                            return job  # in a job's child (or a workdir server's, with its job)
                self._reap()
                self._enforce()
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CODE_CHECK_S
                    replaced = ("code" if W.code_manifest(self.code_dir) != self.manifest else
                                "packages" if W.packages_stamp() != self.packages else None)
                    if replaced and not self.stopping:
                        print(f"warm: the {replaced} were replaced: ending after the running jobs", flush=True)
                        self._stop_listening(listener, sel)
                if not self.children and not self.servers and not self.clients \
                        and now - self.last_busy > self.idle_s:
                    print(f"warm: idle for {self.idle_s:.0f} s: ending", flush=True)
                    break
        except BaseException as exc:
            if os.getpid() == self.pid:
                print(f"warm: ending on {type(exc).__name__}: {exc}", flush=True)
            raise
        finally:
            if os.getpid() == self.pid:  # (a child returns from the loop with its job: nothing to undo)
                self._stop_listening(listener, sel)
                for pid in list(self.children):
                    signal_group(pid, signal.SIGKILL)
        return None

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.stopping = True
            for pid in [*self.children, *self.servers]:
                signal_group(pid, signal.SIGTERM)

    def _stop_listening(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        self.stopping = True
        try:
            sel.unregister(listener)
        except (KeyError, ValueError):
            pass
        listener.close()
        try:
            if os.stat(self.path).st_ino == self.inode:  # (a newer warm process may own the name by now)
                os.unlink(self.path)
        except OSError:
            pass

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        try:
            sock, _ = listener.accept()
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        except OSError:
            return
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid != os.getuid():  # only this login's jobs: never another user's
            print(f"warm: refused a client of uid {uid}", flush=True)
            sock.close()
            return
        self.clients[sock.fileno()] = Client(sock)
        sel.register(sock, selectors.EVENT_READ, sock.fileno())
        self.last_busy = time.monotonic()

    def _serve_client(self, fd: int, sel: selectors.BaseSelector) -> Job | None:
        """One client's bytes; a client that breaks the protocol or vanishes mid-answer is dropped (and its job,
        if it has one, stopped), never the warm process with every other job."""
        try:
            return self._readable(fd, sel)
        except Exception as exc:  # noqa: BLE001 - one client's fault is that client's
            if os.getpid() != self.pid:
                raise  # (a child: its job's own error)
            print(f"warm: dropped a client: {type(exc).__name__}: {exc}", flush=True)
            client = self.clients.get(fd)
            if client is not None:
                self._gone(client, sel)
            return None

    def _readable(self, fd: int, sel: selectors.BaseSelector) -> Job | None:
        client = self.clients[fd]
        try:
            data, fds, _flags, _addr = socket.recv_fds(client.sock, 1 << 20, 3)
        except OSError:
            data, fds = b"", []
        client.fds += fds
        if not data:
            self._gone(client, sel)
            return None
        client.buffer += data
        while len(client.buffer) >= 4:
            (size,) = struct.unpack("!I", client.buffer[:4])
            if len(client.buffer) < 4 + size:
                break
            body, client.buffer = client.buffer[4:4 + size], client.buffer[4 + size:]
            job = self._handle(client, json.loads(body), sel)
            if job is not None:
                return job
        return None

    def _handle(self, client: Client, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        op = message.get("op")
        if op in ("status", "ensure"):
            W.send_message(client.sock, self.status())
        elif op == "stop":
            W.send_message(client.sock, self._stop(message))
        else:
            return self._request(client, str(op), message, sel)
        return None

    # -- what the root and a workdir server each do ----------------------------------------------------

    def _prepare(self) -> bool:
        """Before listening; False: do not serve."""
        return True

    def _serving(self) -> str:
        return "the workdir of " + str(self.code_dir)

    def _request(self, client: Client, op: str, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        raise NotImplementedError

    def _stop(self, message: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        rss = 0
        for line in W._read("/proc/self/status").splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
        root = self.origin or Origin(self.pid, self.started, self.preloaded, self.import_s)
        return {"pid": self.pid, "role": self.role, "root_pid": root.pid, "root_started_at": round(root.started, 3),
                "started_at": round(self.started, 3), "age_s": round(time.time() - self.started, 1),
                "rss_mb": rss, "import_s": round(self.import_s, 2), "preloaded": self.preloaded,
                "jobs_running": len(self.children), "jobs_served": self.served, "idle_s": self.idle_s,
                "workdirs": len(self.servers), "jobs": [self._job_entry(p, j) for p, j in self.children.items()],
                "key": os.path.basename(self.path).removesuffix(".sock")}

    def _forget_in_child(self, sel: selectors.BaseSelector) -> None:
        """In a freshly forked child: nothing of this process's sockets, pipes or signal handling."""
        signal.set_wakeup_fd(-1)
        sel.close()
        for c in self.clients.values():
            c.sock.close()
        for fd in self.own_fds:
            os.close(fd)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)

    def _gone(self, client: Client, sel: selectors.BaseSelector) -> None:
        """The client closed its socket: if its job still runs, nobody waits for it any more."""
        try:
            sel.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        self.clients.pop(client.sock.fileno(), None)
        for fd in client.fds:
            os.close(fd)
        client.fds = []
        if client.child is not None and client.child in self.children:
            signal_group(client.child, signal.SIGTERM)
            client.kill_at = time.monotonic() + W.GRACE_S
        else:
            client.sock.close()
        self.last_busy = time.monotonic()

    def _reap(self) -> None:
        while self.children or self.servers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.servers.pop(pid, None) is not None:
                self.last_busy = time.monotonic()
                continue
            client = self.children.pop(pid, None)
            if client is None:
                continue
            signal_group(pid, signal.SIGKILL)  # whatever the job left in its group
            if client.record:
                try:
                    os.unlink(client.record)
                except OSError:
                    pass
            code = os.waitstatus_to_exitcode(status)
            try:
                W.send_message(client.sock, {"status": code})
            except OSError:
                pass
            client.child = None
            self.last_busy = time.monotonic()

    def _enforce(self) -> None:
        now = time.monotonic()
        for pid, client in list(self.children.items()):
            if client.kill_at is not None and now >= client.kill_at:
                signal_group(pid, signal.SIGKILL)

