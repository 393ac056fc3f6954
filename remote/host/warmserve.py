"""The warm process's loop (`remote.host.warm`): preload, accept this login's clients, fork their jobs,
supervise them, report their exit, and end when idle, replaced, stopped or signalled.

One thread, one selector: the listening socket, every client's socket, and a self-pipe that SIGCHLD and
SIGTERM write to. A fork happens from this one thread, with no other thread alive (the preloaded modules
start none), which is what makes forking a process that imported torch safe.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import selectors
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from remote.host import warm as W
from remote.host.warmjob import Job, die_with_parent, finish, record_group, signal_group

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


class Server:
    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        self.started = time.time()
        self.idle_s = float(os.environ.get("PICTL_WARM_IDLE") or W.IDLE_S)
        self.clients: dict[int, Client] = {}  # by socket fd
        self.children: dict[int, Client] = {}  # by child pid
        self.preloaded: list[str] = []
        self.import_s = 0.0
        self.served = 0
        self.last_busy = time.monotonic()
        self.stopping = False
        self.manifest = W.code_manifest()
        self.packages = W.packages_stamp()
        self.inode = 0
        self.own_fds: list[int] = []
        """The listener and the wake pipe: closed in every child."""

    # -- start --------------------------------------------------------------------------------------

    def _preload(self) -> None:
        t0 = time.perf_counter()
        for name in W.PRELOAD:
            importlib.import_module(name)
            self.preloaded.append(name)
        import remote

        for info in pkgutil.walk_packages(remote.__path__, "remote."):
            if info.name in sys.modules or info.name.startswith("remote.pruning"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001 - a module a job may not need; the job will say
                print(f"warm: not preloaded: {info.name}: {type(exc).__name__}: {exc}", flush=True)
        self.import_s = time.perf_counter() - t0

    def _listen(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        directory, name = os.path.split(self.path)
        os.chdir(directory)  # bind by a short relative name (a socket address holds 108 bytes)
        tmp = f".{name}.{os.getpid()}"
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(64)
        os.replace(tmp, name)  # clients see it only once it accepts
        self.inode = os.stat(name).st_ino
        os.chdir("/")
        return sock

    # -- the loop -------------------------------------------------------------------------------------

    def serve(self) -> Job | None:
        available = W.available_mb()
        if available is not None and available < W.MIN_AVAILABLE_MB:
            print(f"warm: only {available:.0f} MB available (it needs {W.MIN_AVAILABLE_MB}): jobs run cold",
                  flush=True)
            return None
        self._preload()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        listener = self._listen()
        self.own_fds = [listener.fileno(), wake_r, wake_w]
        print(f"warm: pid {self.pid} serving {self.path} (imports {self.import_s:.1f} s)", flush=True)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        next_check = time.monotonic() + CODE_CHECK_S
        try:
            while not (self.stopping and not self.children):
                for key, _ in sel.select(timeout=0.5):
                    if key.data == "listen":
                        self._accept(listener, sel)
                    elif key.data == "wake":
                        os.read(wake_r, 4096)
                    else:
                        job = self._serve_client(key.data, sel)
                        if job is not None:
                            return job  # in the child
                self._reap()
                self._enforce()
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CODE_CHECK_S
                    replaced = ("code" if W.code_manifest() != self.manifest else
                                "packages" if W.packages_stamp() != self.packages else None)
                    if replaced and not self.stopping:
                        print(f"warm: the {replaced} were replaced: ending after the running jobs", flush=True)
                        self._stop_listening(listener, sel)
                if not self.children and not self.clients and now - self.last_busy > self.idle_s:
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
            for pid in list(self.children):
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
        if op == "run":
            return self._fork(client, message, sel)
        if op == "signal" and client.child is not None:
            signal_group(client.child, int(message.get("signal", signal.SIGTERM)))
        elif op in ("status", "ensure"):
            W.send_message(client.sock, self.status())
        elif op == "stop":
            W.send_message(client.sock, self.status())
            self.stopping = True
            for pid in list(self.children):
                signal_group(pid, signal.SIGTERM)
        return None

    def status(self) -> dict[str, Any]:
        rss = 0
        for line in W._read("/proc/self/status").splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
        return {"pid": self.pid, "started_at": round(self.started, 3), "age_s": round(time.time() - self.started, 1),
                "rss_mb": rss, "import_s": round(self.import_s, 2), "preloaded": self.preloaded,
                "jobs_running": len(self.children), "jobs_served": self.served, "idle_s": self.idle_s,
                "key": os.path.basename(self.path).removesuffix(".sock")}

    def _fork(self, client: Client, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        argv = message.get("argv") or []
        if not argv or argv[0] not in W.ENTRY_MODULES or len(client.fds) != 3:
            W.send_message(client.sock, {"error": f"not a job this process runs: {argv[:1]}"})
            return None
        cpus, nice = message.get("cpus"), message.get("nice")
        job = Job([str(a) for a in argv], {str(k): str(v) for k, v in (message.get("env") or {}).items()},
                  str(message.get("cwd") or "/"), int(message.get("umask", 0o022)),
                  [int(c) for c in cpus] if isinstance(cpus, list) else None,
                  int(nice) if isinstance(nice, int) else None)
        fds, client.fds = client.fds, []
        for f in (sys.stdout, sys.stderr):
            f.flush()
        pid = os.fork()
        if pid == 0:  # the child: the job's own session, the client's streams, and nothing of the server's
            os.setsid()
            die_with_parent("pictl-" + job.argv[0].rsplit(".", 1)[-1])
            if os.getppid() != self.pid:
                os._exit(W.EXIT_WARM_LOST)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            signal.set_wakeup_fd(-1)
            sel.close()
            for c in self.clients.values():
                c.sock.close()
            for fd in self.own_fds:
                os.close(fd)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            record_group(job.cwd)
            return job
        for fd in fds:
            os.close(fd)
        client.child = pid
        client.record = os.path.join(job.cwd, f"pgid-warm-{pid}")
        self.children[pid] = client
        self.served += 1
        W.send_message(client.sock, {"pid": pid, "server": self.pid})
        return None

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
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    job = Server(args.socket).serve()
    if job is None:  # the warm process ended
        return 0
    finish(job.run())  # a forked child: the job, then its exit
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main())
