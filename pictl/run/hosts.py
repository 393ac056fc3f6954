"""Phase 1, the hosts: connect once, hold every host's lease, push the code (and a pruned model) once.

Every later phase works over these connections; nothing connects or pushes again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pictl.cluster.artifacts import ship
from pictl.cluster.fleet import Fleet
from pictl.cluster.leases import take_leases
from pictl.cluster.push import push_to
from pictl.inventory import Host
from pictl.run.context import RunContext


@dataclass(frozen=True)
class HostsReady:
    """The hosts this run may use: connected, leased, holding the code."""

    names: tuple[str, ...]
    files_sent: int


async def open_hosts(ctx: RunContext, hosts: list[Host]) -> HostsReady:
    ctx.fleet = Fleet(hosts)
    await ctx.fleet.connect()  # one error naming every host that failed, not just the first
    # Shared Pis: hold every host's workdir before anything is pushed or measured there.
    ctx.leases = await take_leases(list(ctx.fleet), ctx.run_id, wait=ctx.wait_for_hosts,
                                   on_wait=lambda message: ctx.phase("lease", message))
    ctx.timeline.mark("connected")
    pushed = await ctx.fleet.each(lambda t: push_to(t, ctx.tree), "push failed")
    sent = sum(r.sent for r in pushed.values())
    if ctx.artifact is not None:
        artifact = ctx.artifact
        shipped = await ctx.fleet.each(lambda t: ship(t, artifact), "cannot send the model artifact")
        count = sum(1 for s in shipped.values() if s)
        size_mb = artifact.path.stat().st_size / 1e6
        ctx.phase("push", f"model artifact {artifact.path.name} ({size_mb:.0f} MB) sent to {count} host(s)"
                  if count else f"model artifact {artifact.path.name} already on every host")
    ctx.timeline.mark("pushed")
    ctx.phase("push", f"{sent} changed file(s) pushed to {len(hosts)} host(s)" if sent
              else f"code up to date on {len(hosts)} host(s)")
    return HostsReady(tuple(h.name for h in hosts), sent)
