"""Phase 2, placement: which host runs which stages, and with how many torch threads; announced once
(`Placed`), so no reader (headless, the dashboard, the summary) works it out again.

Stages go over the inventory's hosts in order, within their slots (`planning.placement`). Under
`balanced` with fewer stages than hosts, they go to the hosts whose measured pieces add up to the
least time; the others' leases are given back (the leases kept are the placement's). `--threads 0`
divides each host's cores among the stages it runs; the serial run, alone on the first host, gets all
of them. Stages are placed once per run (`candidates`), unless `balanced` must choose hosts first.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pictl.cluster.jobs import HostJob
from pictl.cluster.leases import Lease
from pictl.errors import ConfigError
from pictl.events import Phase, Placed, StagePlacement
from pictl.inventory import Cluster
from pictl.planning.costs import host_profiles
from pictl.planning.placement import NodePlan, place_stages
from pictl.run.context import RunContext
from pictl.run.timeline import StartupTimeline
from pictl.text import ascii_count


@dataclass(frozen=True)
class Placement:
    nodes: tuple[NodePlan, ...]
    threads: dict[str, int]
    """Torch threads of each rank, per host."""
    serial_threads: int
    leases: tuple[Lease, ...] = ()
    """The leases the run kept: those of the hosts it runs on."""

    @property
    def stage_hosts(self) -> list[str]:
        """The host of every stage, in stage order."""
        return [n.host.name for n in self.nodes for _ in n.ranks]

    @property
    def first(self) -> NodePlan:
        return self.nodes[0]

    def node_of(self, rank: int) -> NodePlan:
        return next(n for n in self.nodes if rank in n.ranks)

    def announced(self) -> Placed:
        return Placed(tuple(StagePlacement(n.host.name, tuple(n.ranks), self.threads[n.host.name])
                            for n in self.nodes), self.nodes[0].host.name, self.serial_threads)


@dataclass(frozen=True)
class Candidates:
    """The hosts a run may use before it has measured anything, and its stages on them when that is
    already decided (None: `balanced` chooses the fastest hosts from their profiles)."""

    cluster: Cluster
    nodes: tuple[NodePlan, ...] | None


def candidates(cluster: Cluster, stages: int, policy: str, replicas: int = 1) -> Candidates:
    """Every replica's stages (`stages` is their product) placed once, over the inventory (ConfigError if they
    do not fit)."""
    if replicas > 1 and stages > cluster.slots:
        raise ConfigError(f"{replicas} replicas x {stages // replicas} stages = {stages} ranks do not fit "
                          f"{cluster.source}: {len(cluster.hosts)} hosts with {cluster.slots} stage slot(s) in all")
    nodes = tuple(place_stages(cluster, stages))
    if policy == "balanced" and 1 < stages < len(cluster.hosts):
        return Candidates(cluster, None)  # every host: the fastest are chosen from their profiles
    used = {n.host.name for n in nodes}
    return Candidates(cluster.model_copy(update={"hosts": tuple(h for h in cluster.hosts if h.name in used)}), nodes)


async def place(ctx: RunContext, job: HostJob, usable: Candidates, timeline: StartupTimeline) -> Placement:
    """Where each stage runs, with how many threads; announced (`Placed`)."""
    nodes = usable.nodes
    if nodes is None:
        chosen = await _fastest(ctx, job, usable.cluster, ctx.options.ranks, timeline)
        nodes = tuple(place_stages(chosen, ctx.options.ranks))
    kept = await job.keep_only(n.host.name for n in nodes)
    threads, serial_threads = await _divide_threads(ctx, job, nodes)
    placement = Placement(nodes, threads, serial_threads, tuple(kept))
    ctx.sink(placement.announced())
    return placement


async def _fastest(ctx: RunContext, job: HostJob, cluster: Cluster, stages: int, timeline: StartupTimeline) -> Cluster:
    """The `stages` hosts whose measured (and corrected) pieces add up to the least time; inventory order
    kept among the chosen. The hosts left out are given back to other runs."""
    o = ctx.options
    ctx.sink(Phase("balance", f"{stages} stage(s) on {len(cluster.hosts)} hosts: choosing the fastest"))
    profiles = await host_profiles(list(job.fleet), ctx.caches.costs, model=o.model, num_classes=o.num_classes,
                                   chunk=o.chunk, threads=o.threads or 1, code=ctx.code, artifact=ctx.artifact,
                                   tokens=o.tokens,
                                   use_corrections=o.refine, announce=lambda line: ctx.sink(Phase("balance", line)))
    if profiles.measured:
        timeline.launched("profile", {job.transport(h).host: 1 for h in profiles.measured})
    for group in profiles.shared:
        ctx.sink(Phase("balance", f"{', '.join(group)} share one machine: profiled one at a time"))
    hosts = list(cluster.hosts)
    total = {h.name: sum(profiles.profile(h.name).compute_s) * profiles.correction(h.name) for h in hosts}
    chosen = set(sorted(total, key=total.__getitem__)[:stages])
    ctx.sink(Phase("balance", "fastest hosts: " + ", ".join(
        f"{h.name} ({total[h.name] * 1000:.0f} ms)" for h in hosts if h.name in chosen)
        + "; left out: " + ", ".join(f"{h.name} ({total[h.name] * 1000:.0f} ms)" for h in hosts
                                          if h.name not in chosen)))
    return cluster.model_copy(update={"hosts": tuple(h for h in hosts if h.name in chosen)})


async def _divide_threads(ctx: RunContext, job: HostJob, nodes: tuple[NodePlan, ...]) -> tuple[dict[str, int], int]:
    if ctx.options.threads > 0:
        return {n.host.name: ctx.options.threads for n in nodes}, ctx.options.threads

    async def cores(n: NodePlan) -> int:
        result = await job.transport(n.host).run(["nproc"], timeout_s=30)
        found = ascii_count(result.stdout, most=4096) if result.returncode == 0 else None
        return found or 1

    counts = await asyncio.gather(*(cores(n) for n in nodes))
    threads = {n.host.name: max(1, c // len(n.ranks)) for n, c in zip(nodes, counts, strict=True)}
    ctx.sink(Phase("threads", ", ".join(f"{n.host.name}: {len(n.ranks)} stage(s) x {threads[n.host.name]} "
                                        f"thread(s) of {c} core(s)" for n, c in zip(nodes, counts, strict=True))))
    return threads, counts[0]
