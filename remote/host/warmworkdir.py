"""A workdir's warm server (`remote.host.warm`), forked from the root: it forks that workdir's jobs (each in a
session of its own, with the client's streams, environment and directory), reports their ends, and stops the
jobs of the controller a `pictl stop` names, ending when none is left.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from remote.host import warm as W
from remote.host.warmjob import Job, die_with_parent, record_group, signal_group
from remote.host.warmserve import Client, Server


class WorkdirServer(Server):
    """One workdir's warm server, forked from the root: forks that workdir's jobs, and stops those of the
    controller a `pictl stop` names."""

    def _request(self, client: Client, op: str, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        if op == "run":
            return self._fork(client, message, sel)
        if op == "signal" and client.child is not None:
            signal_group(client.child, int(message.get("signal", signal.SIGTERM)))
        return None

    def _stop(self, message: dict[str, Any]) -> dict[str, Any]:
        """`pictl stop`: the jobs of `owner` (every job if it is None) are stopped; this server ends if none is
        left (another controller's job is never ended without being asked for by name or --all)."""
        owner = message.get("owner")
        stopped, kept = [], []
        for pid, job in list(self.children.items()):
            if owner is None or job.owner == owner:
                signal_group(pid, signal.SIGTERM)
                job.kill_at = time.monotonic() + W.GRACE_S
                stopped.append(self._job_entry(pid, job))
            else:
                kept.append(self._job_entry(pid, job))
        if not kept and self.listener is not None and self.sel is not None:
            self._stop_listening(self.listener, self.sel)  # (a job asked for from now on gets a fresh server)
        return {**self.status(), "stopped_jobs": stopped, "kept_jobs": kept, "ended": not kept}

    def _fork(self, client: Client, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        argv = message.get("argv") or []
        if not argv or argv[0] not in W.ENTRY_MODULES or len(client.fds) != 3:
            W.send_message(client.sock, {"error": f"not a job this process runs: {argv[:1]}"})
            return None
        deadline = message.get("deadline")
        if isinstance(deadline, int | float) and time.time() > deadline or _hung_up(client.sock):
            # The client gave up waiting (this process was stopped or slow) and runs the job cold: never twice.
            W.send_message(client.sock, {"error": "the request came too late; the client runs it cold"})
            return None
        cpus, nice = message.get("cpus"), message.get("nice")
        env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
        job = Job([str(a) for a in argv], env, str(message.get("cwd") or "/"), int(message.get("umask", 0o022)),
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
            self._forget_in_child(sel)
            record_group(job.cwd)
            return job
        for fd in fds:
            os.close(fd)
        client.child = pid
        client.record = os.path.join(job.cwd, f"pgid-warm-{pid}")
        client.owner = env.get(W.OWNER_ENV)
        client.module = job.argv[0]
        self.children[pid] = client
        self.served += 1
        W.send_message(client.sock, {"pid": pid, "server": self.pid})
        return None


def _hung_up(sock: socket.socket) -> bool:
    """Whether the client closed its end (it read nothing more from us and went: an end of file is waiting)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True

