"""The root warm process (`remote.host.warm`; `python -m remote.host.warmroot --socket PATH`, started by
`remote.host.warmclient`): imports what every job needs once, then forks one workdir server
per workdir that asks (`remote.host.warmworkdir.WorkdirServer`), and runs no job itself. It ends when it has had
no workdir server for its idle time, when its code or packages are replaced (after its servers end), on a
`pictl stop` that finds it serving nobody, and on SIGTERM (which its servers get too).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import selectors
import sys
import time
from typing import Any

from remote.host import warm as W
from remote.host.warmjob import Job, finish, name_process
from remote.host.warmserve import Client, Origin, Server
from remote.host.warmworkdir import WorkdirServer


class Root(Server):
    def _prepare(self) -> bool:
        available = W.available_mb()
        if available is not None and available < W.MIN_AVAILABLE_MB:
            print(f"warm: only {available:.0f} MB available (it needs {W.MIN_AVAILABLE_MB}): jobs run cold",
                  flush=True)
            return False
        self._preload()
        return True

    def _serving(self) -> str:
        return f"as the root (imports {self.import_s:.1f} s)"

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

    def _request(self, client: Client, op: str, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        if op == "spawn":
            return self._spawn(client, message, sel)
        if op == "run":
            W.send_message(client.sock, {"error": "the root runs no job: ask the workdir's server"})
        return None

    def _stop(self, message: dict[str, Any]) -> dict[str, Any]:
        """`pictl stop`: the root ends only when it serves no workdir (another team's server is never ended)."""
        if self.servers:
            return {**self.status(), "ended": False}
        self.stopping = True
        return {**self.status(), "ended": True}

    def _spawn(self, client: Client, message: dict[str, Any], sel: selectors.BaseSelector) -> Job | None:
        """The root forks the workdir server for the code at `message["code"]` (one per workdir), or names the
        one already running; the client then connects to it."""
        code = message.get("code")
        if not isinstance(code, str) or not os.path.isabs(code):
            W.send_message(client.sock, {"error": f"not a code directory: {code!r}"})
            return None
        path = W.workdir_socket_path(self.path, os.path.realpath(code))
        running = [pid for pid, p in self.servers.items() if p == path]
        if running and W.is_socket_or_absent(path) and os.path.exists(path):  # (not one that is ending)
            W.send_message(client.sock, {"pid": running[0], "socket": path})
            return None
        for f in (sys.stdout, sys.stderr):
            f.flush()
        pid = os.fork()
        if pid == 0:  # the workdir server: a session of its own; it outlives a root killed under it
            os.setsid()
            name_process("pictl-warm-wd")
            self._forget_in_child(sel)
            origin = Origin(self.pid, self.started, self.preloaded, self.import_s)
            own = os.path.realpath(code)
            server = WorkdirServer(path, own, origin)
            # Modules a job imports later (pruning) come from this workdir's code, not the root's.
            sys.path[:] = [own if p and os.path.realpath(p) == W.code_root() else p for p in sys.path]
            job = server.serve()
            if job is None:
                os._exit(0)
            return job  # (in the server's job child: main() runs it)
        self.servers[pid] = path
        self.last_busy = time.monotonic()
        W.send_message(client.sock, {"pid": pid, "socket": path})
        return None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    job = Root(args.socket).serve()
    if job is None:  # the warm process ended
        return 0
    finish(job.run())  # a forked child: the job, then its exit
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main())
