"""Phase 1, the hosts: connect once, hold every host's lease, push the code (and a pruned model) once.

Every later phase works over the job this returns (`HostJob`: its connections, leases and processes);
nothing connects or pushes again.

A sweep or a tune holds its hosts once for all of its runs (`held_hosts`: connected, leased under the sweep's
own name, the code pushed once, closed once however it ends): each of its runs borrows them (`open_hosts(held=)`:
a `LentJob` under the run's id, nothing connected, leased or pushed), and after a run that failed the holder
connects again whatever lost its connection (`HeldHosts.mend`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from pictl.cluster.artifacts import Artifact, ship
from pictl.cluster.jobs import HostJob, no_tidy, to_the_end
from pictl.cluster.leases import Lease
from pictl.cluster.push import local_tree
from pictl.errors import HostLost
from pictl.events import EventSink, HostDropped, Phase
from pictl.inventory import Cluster, Host
from pictl.run.context import RunContext
from pictl.run.timeline import StartupTimeline


@dataclass(frozen=True)
class HostsReady:
    """The hosts this run may use: connected, leased, holding the code."""

    job: HostJob
    leases: tuple[Lease, ...]
    files_sent: int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.job.fleet.transports)


class HeldHosts:
    """Every host of a sweep's (a tune's) inventory, held for all of its runs (`held_hosts`)."""

    def __init__(self, job: HostJob, tree: dict[str, bytes], *, wait: bool, sink: EventSink) -> None:
        self.job, self.tree, self.wait, self.sink = job, tree, wait, sink
        self.shipped: set[Path] = set()
        """The model artifacts on every host (shipped by the first run that runs one)."""

    @property
    def holder(self) -> str:
        """Who holds the hosts, as a run's summary says it: "sweep NAME"."""
        return f"{self.job.kind} {self.job.job_id}"

    def lend(self, run_id: str, hosts: list[Host]) -> HostJob:
        return self.job.lend(run_id, [h.name for h in hosts])

    async def ship(self, job: HostJob, artifact: Artifact) -> None:
        """The artifact on every host of the job, once for the holder."""
        if artifact.path in self.shipped:
            return
        await _ship(job, artifact, self.sink)
        self.shipped.add(artifact.path)

    async def mend(self) -> None:
        """After a run that failed: a host whose connection (and with it its lease) was lost is connected, leased
        and pushed again; an error naming it where it cannot be (the sweep or tune ends there)."""
        lost = await self.job.lost()
        if not lost:
            return
        self.sink(Phase("lease", f"{', '.join(lost)}: connection lost in the last run; connecting again"))
        self.shipped.clear()  # (shipping checks each host first: only the reopened ones are sent anything)
        await self.job.reopen(lost, wait=self.wait, on_wait=lambda message: self.sink(Phase("lease", message)),
                              tree=self.tree)


    async def without(self, cluster: Cluster, lost: HostLost) -> Cluster:
        """`cluster` less the host `lost` names, which is left out of the holder's later runs (`HostJob.drop`:
        its lease given back; `mend` never connects it again) and said lost (`HostDropped`); `lost` itself is
        raised where no host would be left, or the host is not in `cluster`."""
        left = tuple(h for h in cluster.hosts if h.name != lost.host)
        if not left or len(left) == len(cluster.hosts):
            raise lost
        await self.job.drop(lost.host)
        self.sink(Phase("lease", f"{lost.host}: lost; its lease is given back and the rest run without it"))
        self.sink(HostDropped(lost.host, lost.detail or str(lost)))
        return cluster.model_copy(update={"hosts": left})


@asynccontextmanager
async def held_hosts(cluster: Cluster, kind: str, name: str, *, wait: bool = False,
                     on_event: EventSink | None = None, model: str | None = None) -> AsyncIterator[HeldHosts]:
    """Every host of `cluster` connected, leased under `kind name` (another team's run is refused, or waits with
    its --wait, until this one ends) and holding the code (with `model`'s module, when it is a user's own), for
    the body's runs; whatever way the body ends (an error, Ctrl-C, a failing run), every host is released and
    closed once. A host that cannot be held is one error naming it before the body starts."""
    sink = on_event or (lambda _e: None)
    job, tree = HostJob(cluster.hosts, name, kind=kind), local_tree(model)
    try:
        await job.hold(wait=wait, on_wait=lambda message: sink(Phase("lease", message)))
        sent = await job.push(tree)
        sink(_pushed(sent, len(cluster.hosts)))
        yield HeldHosts(job, tree, wait=wait, sink=sink)
    finally:
        await to_the_end(job.close(tidy=no_tidy))  # (each run removed its own directories)


async def open_hosts(ctx: RunContext, hosts: list[Host], timeline: StartupTimeline,
                     held: HeldHosts | None = None) -> HostsReady:
    """The run's hosts, held (`held`: borrowed from the sweep or tune that holds them); on a failure here,
    whatever was opened is closed again before the error."""
    job = held.lend(ctx.run_id, hosts) if held is not None else HostJob(hosts, ctx.run_id)
    try:
        if held is not None:
            leases = list(job.leases)
            timeline.mark("connected")
            sent = 0
            if ctx.artifact is not None:
                await held.ship(job, ctx.artifact)
        else:
            leases = await job.hold(wait=ctx.wait_for_hosts,
                                    on_wait=lambda message: ctx.sink(Phase("lease", message)))
            timeline.mark("connected")
            sent = await job.push(ctx.tree)
            if ctx.artifact is not None:
                await _ship(job, ctx.artifact, ctx.sink)
    except BaseException:
        await to_the_end(job.close(used=[]))
        raise
    timeline.mark("pushed")
    if held is None:
        ctx.sink(_pushed(sent, len(hosts)))
    return HostsReady(job, tuple(leases), sent)


async def _ship(job: HostJob, artifact: Artifact, sink: EventSink) -> None:
    shipped = await job.fleet.each(lambda t: ship(t, artifact), "cannot send the model artifact")
    count = sum(1 for s in shipped.values() if s)
    size_mb = artifact.path.stat().st_size / 1e6
    sink(Phase("push", f"model artifact {artifact.path.name} ({size_mb:.0f} MB) sent to {count} host(s)"
               if count else f"model artifact {artifact.path.name} already on every host"))


def _pushed(sent: int, hosts: int) -> Phase:
    return Phase("push", f"{sent} changed file(s) pushed to {hosts} host(s)" if sent
                 else f"code up to date on {hosts} host(s)")
