"""The hosts' warm processes seen from the controller: start one (`pictl warm`), read its state (`pictl check`,
a run's start-up record), end it (`pictl stop`). Each is one small stdlib process on the host
(`remote.host.warmclient --ensure | --status | --stop`), over the pushed code.

Each workdir has a warm server of its own, never shared with another workdir (another team's); the servers
of one login on one machine are forks of one root that imported torch once (the four hosts of the shipped
local cluster: one torch import, one copy in memory). What they are keyed by, and why, is
`remote.host.warm`'s. `pictl stop` ends this controller's jobs in this workdir's server, and the server and
the root only when nothing else is left in them.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from pictl.cluster.commands import WARM_CLIENT, worker_env
from pictl.cluster.transport import Transport
from pictl.errors import TransportError
from pictl.summary_figures import Open


class WarmAnswer(Open):
    """The line `remote.host.warmclient` prints (`--ensure`, `--status`, `--stop`), each value as the host wrote it:
    `WarmState.of` checks each one it keeps."""

    running: Any = None
    pid: Any = None
    started_at: Any = None
    age_s: Any = None
    rss_mb: Any = None
    import_s: Any = None
    preloaded: Any = None
    """The modules the warm process imported ahead (torch first)."""
    jobs_running: Any = None
    jobs_served: Any = None
    idle_s: Any = None
    key: Any = None
    root_pid: Any = None
    root_started_at: Any = None
    answering: Any = None
    error: Any = None
    stopped_jobs: Any = None
    kept_jobs: Any = None
    """`--stop`: the jobs ended and those of other controllers kept, each a `WarmJobAnswer`."""
    root_ended: Any = None


class WarmJobAnswer(Open):
    """One job of a warm server as the host lists it (`remote.host.warmserve`)."""

    pid: Any = None
    owner: Any = None
    """The controller whose job it is (`pictl.cluster.leases.controller_name`)."""
    module: Any = None


@dataclass(frozen=True)
class WarmJob:
    """A job `pictl stop` ended or kept in a warm server."""

    pid: Any
    owner: str
    module: str

    @classmethod
    def of(cls, found: WarmJobAnswer) -> WarmJob:
        return cls(found.pid, str(found.owner), str(found.module))


@dataclass(frozen=True)
class WarmState:
    """One host's warm process (`running` False: none; `enabled` False: the host is cold by choice)."""

    host: str
    enabled: bool
    running: bool
    pid: int | None = None
    started_at: float | None = None
    age_s: float | None = None
    rss_mb: int | None = None
    import_s: float | None = None
    preloaded: tuple[str, ...] = ()
    jobs_running: int = 0
    jobs_served: int = 0
    idle_s: float | None = None
    key: str | None = None
    root_pid: int | None = None
    """The root this workdir's server was forked from (one per login and code: it imported torch)."""
    root_started_at: float | None = None
    answering: bool = True
    """False: the warm process is there but does not answer (stopped, or stuck): `error` says which."""
    error: str | None = None
    stopped_jobs: tuple[WarmJob, ...] = ()
    kept_jobs: tuple[WarmJob, ...] = ()
    """`pictl stop`: the jobs it ended, and other controllers' jobs it kept (pid, owner, module)."""
    root_ended: bool = False

    @classmethod
    def of(cls, host: str, found: WarmAnswer) -> WarmState:
        def num(value: Any) -> Any:
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        def jobs(listed: Any) -> tuple[WarmJob, ...]:
            return tuple(WarmJob.of(WarmJobAnswer.model_validate(j))
                         for j in listed if isinstance(j, dict)) if isinstance(listed, list) else ()

        def text(value: Any) -> str | None:
            return value[:300] if isinstance(value, str) else None

        preloaded = found.preloaded
        return cls(host, True, found.running is True, num(found.pid), num(found.started_at), num(found.age_s),
                   num(found.rss_mb), num(found.import_s),
                   tuple(str(m) for m in preloaded) if isinstance(preloaded, list) else (),
                   num(found.jobs_running) or 0, num(found.jobs_served) or 0, num(found.idle_s), text(found.key),
                   num(found.root_pid), num(found.root_started_at), found.answering is not False, text(found.error),
                   jobs(found.stopped_jobs), jobs(found.kept_jobs), found.root_ended is True)

    def as_dict(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "running": self.running, "pid": self.pid, "started_at": self.started_at,
                "age_s": self.age_s, "rss_mb": self.rss_mb, "import_s": self.import_s,
                "preloaded": list(self.preloaded), "jobs_running": self.jobs_running,
                "jobs_served": self.jobs_served, "idle_s": self.idle_s, "key": self.key, "root_pid": self.root_pid,
                "answering": self.answering, "error": self.error}

    def text(self) -> str:
        if not self.enabled:
            return "cold (warm = false)"
        if not self.running:
            return "none (the next job starts one)"
        if not self.answering:
            return f"not answering: {self.error}"
        return (f"pid {self.pid}, up {self.age_s:.0f} s, {self.rss_mb} MB, torch and {len(self.preloaded) - 1} "
                f"more preloaded in {self.import_s:.1f} s, {self.jobs_served} job(s) served")


async def _control(t: Transport, op: str, timeout_s: float, *args: str) -> WarmState:
    h = t.host
    if not h.warm:
        return WarmState(h.name, False, False)
    # (in the workdir: `python -m` puts its working directory first on the path, and the code is the pushed one)
    result = await t.run([h.python_path(), "-m", WARM_CLIENT, f"--{op}", *args], cwd=h.workdir,
                         env=worker_env(h, 1), timeout_s=timeout_s)
    lines = result.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        why = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        raise TransportError(f"host '{h.name}': warm process ({op}): {why[:300]}")
    return WarmState.of(h.name, WarmAnswer.model_validate(found))


async def started_since(transports: list[Transport], since: float) -> int:
    """How many roots serving these hosts started at `since` or later (each imported torch once); hosts sharing
    one count it once. A host that cannot say counts none."""
    found = await asyncio.gather(*(warm_status(t) for t in transports if t.host.warm), return_exceptions=True)
    return len({s.root_pid for s in found if isinstance(s, WarmState) and s.running
                and s.root_started_at is not None and s.root_started_at >= since})


async def warm_status(t: Transport) -> WarmState:
    return await _control(t, "status", 30)


async def warm_up(t: Transport) -> WarmState:
    """The host's warm process, started if none runs (importing torch there: seconds, a minute on a Pi)."""
    return await _control(t, "ensure", 600)


async def warm_stop(t: Transport, owner: str | None) -> WarmState:
    """End `owner`'s jobs in this workdir's warm server (every job if None), then the server and the root if
    nothing else is left in them."""
    return await _control(t, "stop", 60, *(("--owner", owner) if owner is not None else ("--all",)))
