"""Shared hosts: a run holds a lease on every host's workdir, and knows which runs are its controller's.

Several teams use the same Pis. Before anything is pushed, a run starts
`remote/host/lease.py` on each host (its text sent on stdin to a one-line loader, `BOOT`,
so it needs no pushed code and `ps` shows a short command); that process holds the
workdir's lease while our connection lasts. All hosts or none:
when one is busy the leases already taken are given back, so two runs that each
got half the cluster never wait on each other. A busy host is refused with one
line naming the run, user, controller and start time that hold it (`HostBusy`,
exit 8), or, with `wait`, tried again until it is free. A sweep or a tune holds its hosts
for all of its runs, under its own name: the line then names the sweep (`kind`).

`controller_name()` is how the hosts know whose run a process group belongs to
(`pictl stop` stops only this controller's runs unless `--all`).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import remote
from pictl import errors as E
from pictl.cluster.transport import RemoteProcess, Transport
from pictl.summary_figures import Open

LEASE_SOURCE = remote.source("host/lease.py")
BOOT = "import json,sys;exec(compile(json.loads(sys.stdin.buffer.raw.readline()),'remote.host.lease','exec'))"
"""The lease holder's whole program on its command line: it runs the first line of its stdin, `LEASE_SOURCE` as
one JSON string. The raw (unbuffered) read takes that line and nothing more: the rest of stdin is the lease's
own channel, whose end is the release."""
RETRY_S = (2.0, 5.0)
"""A waiting run looks again after a random pause in this range (two waiters do not retry in step)."""
ANSWER_TIMEOUT_S = 60.0


class LeaseRecord(Open):
    """A lease's record, as the host's lease file holds it (`remote/host/lease.py`): what the holding controller
    sent (`_take`), and the host's login, the holder's pid and when it took the lease. Read as written (another
    team's pictl may have written it); each default is what a line says for a field the record lacks."""

    run_id: Any = "?"
    user: Any = "?"
    controller: Any = "?"
    """The controller's host name."""
    owner: Any = None
    """`controller_name()`: whose runs `pictl stop` stops."""
    kind: Any = "run"
    """What `run_id` names: a run (not written), or a sweep or tune holding its hosts for all of its runs."""
    login: Any = None
    pid: Any = None
    started_at: Any = None
    """When the lease was taken (seconds since the epoch, the host's clock)."""


class LeaseAnswer(Open):
    """The one JSON line `remote/host/lease.py` prints: its state, and the lease's record or why it is not ready."""

    state: Any = None
    """held | busy | not_ready"""
    lease: Any = None
    error: Any = None


def controller_name() -> str:
    """Who starts runs from here: $PICTL_CONTROLLER (e.g. a team name on a shared lab PC), else user@host."""
    name = os.environ.get("PICTL_CONTROLLER") or f"{getpass.getuser()}@{socket.gethostname()}"
    if not name.isprintable() or not 0 < len(name) <= 128:
        raise E.ConfigError("PICTL_CONTROLLER: at most 128 printable characters")
    return name


@dataclass
class Lease:
    """A held lease: the process on the host that holds it, and what it recorded."""

    transport: Transport
    process: RemoteProcess
    record: dict[str, Any]

    async def release(self) -> None:
        await self.process.stop(grace_s=5.0)  # closing its stdin is the release


def describe(record: LeaseRecord) -> str:
    started = record.started_at
    since = time.strftime("%H:%M:%S", time.localtime(started)) if isinstance(started, int | float) else "?"
    return f"{record.kind} {record.run_id} of {record.user} on {record.controller} (since {since})"


def _busy_message(busy: list[tuple[str, LeaseRecord]]) -> str:
    """One clause per holder: "hosts 'h0', 'h1' busy: held by run X of alice on laptop (since 10:02:03)". A run
    takes its hosts' leases one by one, maybe a second apart: grouped by run, since its first lease."""
    holders: dict[tuple[Any, ...], list[tuple[str, LeaseRecord]]] = {}
    for host, record in busy:
        who = (record.kind, record.run_id, record.user, record.controller)
        holders.setdefault(who, []).append((host, record))
    clauses = []
    for held in holders.values():
        names = [f"'{host}'" for host, _ in held]
        starts = [r.started_at for _, r in held if isinstance(r.started_at, int | float)]
        first = held[0][1].model_copy(update={"started_at": min(starts)}) if starts else held[0][1]
        clauses.append(f"host{'s' if len(names) > 1 else ''} {', '.join(names)} busy: held by {describe(first)}")
    return "; ".join(clauses)


@dataclass
class _Answer:
    """One host's answer to one attempt."""

    state: str
    """held | busy | not_ready"""
    lease: Lease | None = None
    holder: LeaseRecord | None = None
    why: str = ""


async def _take(t: Transport, run_id: str, check_python: bool, kind: str = "run") -> _Answer:
    h = t.host
    record = LeaseRecord(run_id=run_id, user=getpass.getuser(), controller=socket.gethostname(),
                         owner=controller_name(), **({"kind": kind} if kind != "run" else {}))
    argv = [h.base_python(), "-c", BOOT, "hold", "--workdir", h.workdir, "--record", json.dumps(record.written())]
    proc = await t.start([*argv, "--python", h.python_path()] if check_python else argv)
    answer: dict[str, Any] = {}
    errors: list[str] = []

    async def first_answer() -> None:
        async for stream, line in proc.lines():
            if stream == "stdout":
                try:
                    answer.update(json.loads(line))
                    return
                except (ValueError, TypeError):
                    pass
            errors.append(line)

    try:
        try:
            await proc.send_line(json.dumps(LEASE_SOURCE))
        except E.TransportError:
            pass  # it did not start (no python there): its exit status says why, below
        await asyncio.wait_for(first_answer(), ANSWER_TIMEOUT_S)
    except TimeoutError:
        await proc.stop(grace_s=1.0)
        raise E.TransportError(f"host '{h.name}': no answer when taking the lease") from None
    except BaseException:
        await asyncio.shield(proc.stop(grace_s=1.0))
        raise
    said = LeaseAnswer.view(answer)
    if said.state == "held":
        return _Answer("held", lease=Lease(t, proc, said.lease or {}))
    rc = await proc.wait()
    if said.state == "busy":
        return _Answer("busy", holder=LeaseRecord.view(said.lease) if isinstance(said.lease, dict) else LeaseRecord())
    if said.state == "not_ready":
        return _Answer("not_ready", why=f"host '{h.name}': {said.error}")
    why = "not found" if rc == 127 else (errors or [f"exit status {rc}"])[-1]
    return _Answer("not_ready", why=f"host '{h.name}': python '{h.base_python()}' {why} (set `python` in the "
                                    "inventory)")


async def release_all(leases: list[Lease]) -> None:
    await asyncio.gather(*(lease.release() for lease in leases), return_exceptions=True)


async def take_leases(transports: list[Transport], run_id: str, *, wait: bool = False, check_python: bool = True,
                      on_wait: Callable[[str], None] = lambda message: None, kind: str = "run") -> list[Lease]:
    """Every host's lease, or none: HostBusy names who holds a busy one (with `wait`, try until free).
    `check_python`: also refuse (NotReady) a host whose run interpreter (its venv) is missing. `kind`: what
    `run_id` names ("run"; "sweep" or "tune" for one that holds the hosts for all of its runs)."""
    last = ""
    while True:
        results = await asyncio.gather(*(_take(t, run_id, check_python, kind) for t in transports),
                                       return_exceptions=True)
        answers = [r for r in results if isinstance(r, _Answer)]
        held = [a.lease for a in answers if a.lease is not None]
        if len(held) == len(transports):
            return held
        await release_all(held)  # all or none
        for r in results:
            if isinstance(r, BaseException):
                raise r
        if not_ready := [a.why for a in answers if a.state == "not_ready"]:
            raise E.NotReady("; ".join(not_ready))
        busy = _busy_message([(t.host.name, a.holder or LeaseRecord())
                              for t, a in zip(transports, answers, strict=True) if a.state == "busy"])
        if not wait:
            raise E.HostBusy(f"{busy} (--wait queues behind it)")
        if busy != last:  # say it when the holder changes, not at every look
            on_wait(f"waiting: {busy}")
            last = busy
        await asyncio.sleep(random.uniform(*RETRY_S))
