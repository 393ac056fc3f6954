"""Phase 1, the hosts: connect once, hold every host's lease, push the code (and a pruned model) once.

Every later phase works over the job this returns (`HostJob`: its connections, leases and processes);
nothing connects or pushes again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pictl.cluster.artifacts import ship
from pictl.cluster.jobs import HostJob, to_the_end
from pictl.cluster.leases import Lease
from pictl.events import Phase
from pictl.inventory import Host
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


async def open_hosts(ctx: RunContext, hosts: list[Host], timeline: StartupTimeline) -> HostsReady:
    """The run's hosts, held; on a failure here, whatever was opened is closed again before the error."""
    job = HostJob(hosts, ctx.run_id)
    try:
        leases = await job.hold(wait=ctx.wait_for_hosts, on_wait=lambda message: ctx.sink(Phase("lease", message)))
        timeline.mark("connected")
        sent = await job.push(ctx.tree)
        if ctx.artifact is not None:
            artifact = ctx.artifact
            shipped = await job.fleet.each(lambda t: ship(t, artifact), "cannot send the model artifact")
            count = sum(1 for s in shipped.values() if s)
            size_mb = artifact.path.stat().st_size / 1e6
            ctx.sink(Phase("push", f"model artifact {artifact.path.name} ({size_mb:.0f} MB) sent to {count} host(s)"
                           if count else f"model artifact {artifact.path.name} already on every host"))
    except BaseException:
        await to_the_end(job.close(used=[]))
        raise
    timeline.mark("pushed")
    ctx.sink(Phase("push", f"{sent} changed file(s) pushed to {len(hosts)} host(s)" if sent
                   else f"code up to date on {len(hosts)} host(s)"))
    return HostsReady(job, tuple(leases), sent)
