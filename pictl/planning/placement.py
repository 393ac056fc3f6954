"""Where each stage runs: stages in order over the inventory's hosts, within their slots."""

from __future__ import annotations

from pictl.cluster.ranks import NodePlan
from pictl.errors import ConfigError
from pictl.inventory import Cluster

__all__ = ["NodePlan", "place_stages", "sharing_hosts"]


def place_stages(cluster: Cluster, stages: int) -> list[NodePlan]:
    """Stages in order over hosts in order: one per host while they last, then up to each host's slots.

    Adjacent stages share a host, so an extra hop stays local.
    """
    if stages > cluster.slots:
        raise ConfigError(f"{stages} stages do not fit {cluster.source}: {len(cluster.hosts)} hosts with "
                          f"{cluster.slots} stage slot(s) in all (raise a host's `slots` to run more)")
    counts = [0] * len(cluster.hosts)
    remaining = stages
    while remaining:  # round-robin one extra stage per host, never past its slots
        for i, host in enumerate(cluster.hosts):
            if remaining and counts[i] < host.slots:
                counts[i] += 1
                remaining -= 1
    nodes: list[NodePlan] = []
    rank = 0
    for host, n in zip(cluster.hosts, counts, strict=True):
        if n:
            nodes.append(NodePlan(host, len(nodes), rank, n))
            rank += n
    return nodes


def sharing_hosts(cluster: Cluster, stages: int, slots: int | None) -> Cluster:
    """`cluster` itself when `stages` fit its slots; else, given `slots` (a sweep's `[sweep] slots`), the same
    hosts each taking up to that many stages: the course's 6 stages on 4 Pis put 2 on some. What fits the
    inventory is placed as the inventory says (a larger slot count would move stages between hosts)."""
    if stages <= cluster.slots or slots is None:
        return cluster
    hosts = tuple(h.model_copy(update={"slots": max(h.slots, slots)}) for h in cluster.hosts)
    return cluster.model_copy(update={"hosts": hosts})
