"""The one lifecycle of a job on hosts (a run, a training job, a pruning job, a sweep's planning): every
connection a job opens, the leases it holds, the files it stages, the processes it starts, and the
clean-up that follows on every path (success, failure, Ctrl-C).

    job = HostJob(hosts, job_id)
    try:
        leases = await job.hold(wait=..., on_wait=...)    # connected and leased, or one error naming each host
        sent = await job.push(tree)                       # the code, once
        swept = await job.stage({SPEC_FILE: spec, ...})   # orphans swept, files in each host's run directory
        rc = await job.run_module(host, module, args, stream, threads=...)   # one process, read to its end
        proc = await job.start(host, argv, cwd=..., env=...)                  # or one that runs on (ranks)
        ...
    finally:
        await to_the_end(job.close())                     # stopped, confirmed, tidied, released, closed

A job that holds its hosts for several runs (a sweep's, a tune's) lends each run its share (`lend`: a
`LentJob`, under the run's own id, over the same connections, leases and pushed code); closing a lent job stops
the run's processes and removes its run directories, and leaves the hosts held. After a run that failed, the
owner finds the hosts whose connection was lost (`lost`) and opens them again (`reopen`).

Launching ranks over it (torchrun argv, streams, the culprit of a failure) is `pictl.cluster.ranks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from pictl.cluster.commands import cleanup_host, python_module, supervised, worker_env
from pictl.cluster.fleet import Fleet
from pictl.cluster.leases import Lease, controller_name, release_all, take_leases
from pictl.cluster.push import push_to
from pictl.cluster.stream import ProcessStream
from pictl.cluster.transport import RemoteProcess, Transport
from pictl.inventory import Host
from remote.floor import protocol as P


async def to_the_end(work: Awaitable[None]) -> None:
    """Await `work` to completion even if we are cancelled again meanwhile (a second Ctrl-C): the
    hosts must confirm their processes are gone before the record closes."""
    task = asyncio.ensure_future(work)
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
    task.result()


Tidy = Callable[[Transport], Awaitable[Any]]
"""What closing leaves undone on a host the job used (default: its processes and run directory gone)."""


async def no_tidy(_t: Transport) -> None:
    """For a job that leaves no run directory of its own on the hosts (host commands; a sweep's or tune's
    hold, whose runs removed their own): closing only stops, releases and disconnects."""


class HostJob:
    """One job's hold on its hosts; `close()` undoes whatever of it happened, once, whatever happened."""

    def __init__(self, hosts: Iterable[Host], job_id: str, *, kind: str = "run") -> None:
        self.job_id = job_id
        self.kind = kind
        """What the job is, as its leases name it to another run that finds the hosts busy ("run", "sweep")."""
        self.fleet = Fleet(hosts)
        self.leases: list[Lease] = []
        self.live: list[RemoteProcess] = []

    def transport(self, host: Host | str) -> Transport:
        return self.fleet[host if isinstance(host, str) else host.name]

    def run_dir(self, host: Host) -> str:
        return host.run_dir(self.job_id)

    # -- opening ---------------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Every host connected; one error naming every host that failed, not just the first."""
        await self.fleet.connect()

    async def hold(self, *, wait: bool = False, on_wait: Callable[[str], None] = lambda _message: None,
                   check_python: bool = True) -> list[Lease]:
        """Connected, and every host's workdir held (shared Pis) before anything is pushed or measured there
        (`check_python`: a host without its run interpreter is refused; provisioning makes that interpreter)."""
        await self.connect()
        self.leases = await take_leases(list(self.fleet), self.job_id, wait=wait, on_wait=on_wait,
                                        check_python=check_python, kind=self.kind)
        return list(self.leases)

    async def push(self, tree: dict[str, bytes] | None = None) -> int:
        """The code on every host; how many files were sent."""
        pushed = await self.fleet.each(lambda t: push_to(t, tree), "push failed")
        return sum(r.sent for r in pushed.values())

    async def keep_only(self, names: Iterable[str]) -> list[Lease]:
        """Give the other hosts' leases back (to other runs); the leases kept."""
        chosen = set(names)
        unused = [lease for lease in self.leases if lease.transport.host.name not in chosen]
        self.leases = [lease for lease in self.leases if lease.transport.host.name in chosen]
        await release_all(unused)
        return list(self.leases)

    async def stage(self, files: Mapping[str, bytes], what: str, names: Iterable[str] | None = None,
                    ) -> dict[str, dict[str, Any]]:
        """`files` (and the owner file) in the run directory of every host (or the named ones), orphans a
        vanished controller left swept (best effort: only files that cannot be placed fail). What each
        host's sweep found, per host."""
        placed = {**files, P.OWNER_FILE: controller_name().encode()}

        async def sweep_and_place(t: Transport) -> dict[str, Any]:
            run_dir = self.run_dir(t.host)
            cleaned, *put = await asyncio.gather(
                cleanup_host(t, orphans_only=True, keep=self.job_id),
                *(t.put_bytes(data, f"{run_dir}/{name}") for name, data in placed.items()), return_exceptions=True)
            for result in put:
                if isinstance(result, BaseException):
                    raise result
            return cleaned if isinstance(cleaned, dict) else {}

        return await self.fleet.each(sweep_and_place, what, names)

    def lend(self, job_id: str, names: Iterable[str]) -> HostJob:
        """The named hosts of this held job as a run's own job (`LentJob`), under the run's id `job_id`."""
        return LentJob(self, job_id, names)

    async def lost(self) -> list[str]:
        """The hosts whose connection (and with it the lease it held) is gone: a lease holder that ended, or a
        host that no longer answers a command."""
        ended = {lease.transport.host.name for lease in self.leases if lease.process.returncode is not None}
        answers = await self.fleet.results(lambda t: t.run(["true"], timeout_s=PROBE_TIMEOUT_S))
        ended |= {name for name, r in answers.items() if isinstance(r, BaseException) or r.returncode != 0}
        return [name for name in self.fleet.transports if name in ended]

    async def reopen(self, names: Iterable[str], *, wait: bool = False,
                     on_wait: Callable[[str], None] = lambda _message: None, tree: dict[str, bytes] | None = None,
                     ) -> None:
        """The named hosts over new connections (their old ones closed), leased and holding the code again; one
        error naming each host that cannot be (HostBusy: another run took the lease meanwhile)."""
        old = self.fleet.only(dict.fromkeys(names))
        gone = [lease for lease in self.leases if lease.transport in old]
        self.leases = [lease for lease in self.leases if lease not in gone]
        await release_all(gone)
        await asyncio.gather(*(t.close() for t in old), return_exceptions=True)
        fresh = Fleet(t.host for t in old)
        self.fleet.transports.update(fresh.transports)  # (closed with the others, whatever happens next)
        await fresh.connect()
        self.leases += await take_leases(list(fresh), self.job_id, wait=wait, on_wait=on_wait, kind=self.kind)
        await fresh.each(lambda t: push_to(t, tree), "push failed")

    async def drop(self, name: str) -> None:
        """`name` out of the job for good (a host lost mid-run that the job goes on without): its lease given back
        (over a connection already gone, the lease ended with it) and its connection closed; never reconnected,
        so a host that comes back is not taken again by this job (a later one may take it)."""
        gone = [lease for lease in self.leases if lease.transport.host.name == name]
        self.leases = [lease for lease in self.leases if lease not in gone]
        await release_all(gone)
        transport = self.fleet.transports.pop(name, None)
        if transport is not None:
            await asyncio.gather(transport.close(), return_exceptions=True)

    # -- processes -------------------------------------------------------------------------------------

    async def start(self, host: Host, argv: list[str], *, cwd: str, env: Mapping[str, str]) -> RemoteProcess:
        """Start a long-running command that the job stops, whatever happens."""
        proc = await self.transport(host).start(argv, cwd=cwd, env=env)
        self.live.append(proc)
        return proc

    async def run_module(self, host: Host, module: str, args: Sequence[str], stream: ProcessStream, *, threads: int,
                         pgid_file: str, cwd: str | None = None) -> int:
        """`python -m module args` on `host` under the supervisor (it dies with our connection; `pgid_file`
        names its process group for `pictl stop`), with `threads` torch threads, in the job's run directory
        (or `cwd`); its lines read to the end through `stream`. Its exit status; the job stops it whatever
        happens meanwhile."""
        argv, env = supervised(host, python_module(host, module, *args), pgid_file), worker_env(host, threads)
        proc = await self.fleet[host.name].start(argv, cwd=cwd or host.run_dir(self.job_id), env=env)
        self.live.append(proc)
        rc = await stream.consume(proc)
        self.live.remove(proc)  # read to its end: nothing left to stop
        return rc

    async def stop_all(self) -> None:
        live, self.live = self.live, []
        await asyncio.gather(*(p.stop() for p in live), return_exceptions=True)

    # -- closing ---------------------------------------------------------------------------------------

    async def close(self, used: Iterable[str] | None = None, *, tidy: Tidy | None = None) -> None:
        """Stop every process, wait for each host to confirm, tidy the hosts used (every host by default; by
        default only once the code that does it was pushed, i.e. the leases were taken), free and close them."""
        await self.stop_all()
        if self.leases or tidy is not None:  # (a lease-less job says what to tidy)
            chosen = self.fleet.only(used) if used is not None else list(self.fleet)
            finish = tidy or (lambda t: cleanup_host(t, orphans_only=False, finish=self.job_id))
            await asyncio.gather(*(finish(t) for t in chosen), return_exceptions=True)
        leases, self.leases = self.leases, []
        await release_all(leases)
        await self.fleet.close()


PROBE_TIMEOUT_S = 30.0
"""How long a held host has to answer `true` after a run that failed (`HostJob.lost`)."""


class LentJob(HostJob):
    """A run's share of a job that holds the hosts for several runs (`HostJob.lend`): the owner's connections,
    leases and pushed code, on the hosts the run uses, under the run's own id (its run directories, its process
    groups, its owner file: `pictl stop` finds it as it finds any run). Closing it stops the run's processes and
    removes its run directories; the hosts stay connected and leased, for the owner's next run and its close."""

    def __init__(self, owner: HostJob, job_id: str, names: Iterable[str]) -> None:
        chosen = list(dict.fromkeys(names))
        self.job_id, self.kind, self.owner = job_id, owner.kind, owner
        self.fleet = Fleet(())
        self.fleet.transports = {name: owner.fleet[name] for name in chosen}
        self.leases = [lease for lease in owner.leases if lease.transport.host.name in chosen]
        self.live = []

    async def keep_only(self, names: Iterable[str]) -> list[Lease]:
        """The leases of the hosts the run keeps; the others are not given back: the owner holds them on."""
        chosen = set(names)
        self.leases = [lease for lease in self.leases if lease.transport.host.name in chosen]
        return list(self.leases)

    async def close(self, used: Iterable[str] | None = None, *, tidy: Tidy | None = None) -> None:
        """Stop the run's processes, wait for each host to confirm, remove its run directory on the hosts used
        (every host by default); the connections and leases are the owner's."""
        await self.stop_all()
        chosen = self.fleet.only(used) if used is not None else list(self.fleet)
        finish = tidy or (lambda t: cleanup_host(t, orphans_only=False, finish=self.job_id))
        await asyncio.gather(*(finish(t) for t in chosen), return_exceptions=True)
        self.leases = []
