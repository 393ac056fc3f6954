"""`pictl tune`'s cost model: every candidate's img/s predicted from the hosts' cost profiles (the ones
`balanced` measures, `pictl.planning.costs`) and corrected by what the tune measured (`Calibration`).

Each replica's split is the balanced one for the slowest replica's hosts; a pass takes (M / R + S - 1)
bottleneck steps for M microbatches, R replicas and S stages; hosts that share one machine share its CPUs.
What the profiles cannot know is measured by one serial run per machine and applied as a gain over the base
configuration: int8 numerics, each thread count, each chunk. Gains multiply (int8 at 2 threads and chunk 4 is
predicted as the three gains' product); the measured candidates correct what that leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pictl.cluster.artifacts import Artifact
from pictl.inventory import Cluster
from pictl.jobs.tune_space import Candidate
from pictl.planning.costs import Profiles, cost_table, profile_key, usable_profile
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages
from pictl.records.cache import JsonCache
from remote.floor.balance import NoFeasibleSplit, balanced_split
from remote.floor.wire import byte_ratio, parse_wire

Machines = dict[str, tuple[str, float, float]]
"""Host -> [machine (boot id), its CPUs, the host's own cap], from a run's host records."""


def cached_profiles(cluster: Cluster, base: RunOptions, cache_root: Path, code: str,
                    artifact: Artifact | None = None) -> Profiles | None:
    """The hosts' cost profiles from the cache the runs fill (None while any host has none); `code`: the digest
    of the tree the runs pushed, `artifact`: the model file they ran (its digest keys the profiles too)."""
    costs = JsonCache(cache_root / "costs")
    by_host = {}
    for host in cluster.hosts:
        found = costs.get(profile_key(host, base.model, base.num_classes, base.chunk, base.threads or 1, code=code,
                                      artifact=artifact, tokens=base.tokens))
        if not usable_profile(found):  # the rule `balanced` reads its cache by: a damaged profile is none
            return None
        by_host[host.name] = found
    return Profiles(by_host, [], [])


@dataclass(frozen=True)
class Calibration:
    """What the tune's first measurements correct in the cost model: `serial`, the measured serial run over the
    profiles' serial prediction (the profiles time pieces inside passes, a little slower than the whole model);
    `pipeline`, the measured pipeline over every host against its (serial-corrected) prediction: what the
    model leaves out of a pipeline (links, the schedule's own time), applied to every candidate with stages.
    `machines`: from the first run's host records: hosts that share one machine share its CPUs, so a candidate
    running more threads on it than it has is slowed by the ratio (the shipped local cluster's four "hosts" on
    one machine; Pis never share)."""

    serial: float = 1.0
    pipeline: float = 1.0
    int8_gain: float | None = None
    """int8's gain over fp32 on a host whose machine has none of its own in `int8_gains`."""
    machines: Machines = field(default_factory=dict)
    int8_gains: dict[str, float] = field(default_factory=dict)
    """Host -> int8's gain measured on its machine (one serial run per machine: an ARM core gains less)."""
    thread_gains: dict[int, dict[str, float]] = field(default_factory=dict)
    """Threads -> host -> the serial run's gain at that many threads over the base's, measured on its machine."""
    chunk_gains: dict[int, dict[str, float]] = field(default_factory=dict)
    """Chunk -> host -> the serial run's gain per image at that chunk over the base's."""

    def int8_on(self, hosts: list[str]) -> float | None:
        """int8's gain for a candidate on `hosts`: its least-gaining host's (the pipeline waits for it)."""
        gains = [self.int8_gains.get(h, self.int8_gain) for h in hosts]
        return None if not gains or None in gains else min(g for g in gains if g is not None)

    def gain_on(self, c: Candidate, base: RunOptions, hosts: list[str]) -> float | None:
        """Everything `c` changes from the base, as one gain on its least-gaining host; None while a part of it
        is unmeasured."""
        parts = [self.int8_on(hosts) if c.numerics != "fp32" else 1.0]
        if c.threads != base.threads:
            parts.append(_least(self.thread_gains.get(c.threads, {}), hosts))
        if c.chunk != base.chunk:
            parts.append(_least(self.chunk_gains.get(c.chunk, {}), hosts))
        gain = 1.0
        for part in parts:
            if part is None:
                return None
            gain *= part
        return gain

    def crowding(self, hosts: list[str], threads: int) -> float | None:
        """The share of its CPU time the most crowded machine gives each of `hosts`' ranks (1: enough CPUs);
        None when ranks of several threads ask a machine for more CPUs than it has: torch's threads then wait
        on each other rather than share (2 ranks x 2 threads on 2 CPUs ran 2.0 img/s here where a fair share
        predicted 15.8), so the model cannot say."""
        demand: dict[str, float] = {}
        cpus: dict[str, float] = {}
        for h in hosts:
            machine, n, cap = self.machines.get(h, (h, float("inf"), float("inf")))
            demand[machine] = demand.get(machine, 0.0) + min(float(threads), cap)
            cpus[machine] = n
        if threads > 1 and any(d > cpus[m] for m, d in demand.items()):
            return None
        return min([1.0, *(cpus[m] / d for m, d in demand.items() if d > 0)])


def _least(gains: dict[str, float], hosts: list[str]) -> float | None:
    found = [gains.get(h) for h in hosts]
    return None if not found or None in found else min(g for g in found if g is not None)


def predict(c: Candidate, cluster: Cluster, base: RunOptions, profiles: Profiles,
            calibration: Calibration | None = None) -> float | None:
    """Predicted img/s of `c`, or None when nothing can be said (a gain not measured yet, no feasible split)."""
    cal = calibration or Calibration()
    hosts = [n.host.name for n in place_stages(cluster, c.replicas * c.stages) for _ in n.ranks]
    gain = cal.gain_on(c, base, hosts)
    if gain is None:
        return None
    tables = [cost_table(hosts[r * c.stages:(r + 1) * c.stages], profiles,
                         wire_ratio=byte_ratio(parse_wire(c.wire).default)) for r in range(c.replicas)]
    try:
        step_s = balanced_split(*tables).bottleneck_s  # replicas share the split: the slowest one's
    except NoFeasibleSplit:
        return None
    step_s *= c.chunk / base.chunk  # the profiles time the base's microbatch; the chunk's gain is in `gain`
    crowding = cal.crowding(hosts, c.threads or 1)
    if crowding is None:
        return None
    per_replica = -(-base.images // c.chunk) // c.replicas
    ips = base.images / ((per_replica + c.stages - 1) * step_s) * cal.serial * crowding
    ips *= cal.pipeline if c.stages > 1 else 1.0
    return ips * gain


def by_machine(cluster: Cluster, machines: Machines) -> list[list[str]]:
    """The cluster's hosts grouped by the machine they run on (the first run's boot ids; a host it did not
    record is a machine of its own), in the inventory's order; all of them as one when it recorded none (it
    failed: one run stands for every host, as the tune cannot tell them apart)."""
    if not machines:
        return [[h.name for h in cluster.hosts]]
    groups: dict[str, list[str]] = {}
    for h in cluster.hosts:
        groups.setdefault(machines.get(h.name, (f"host:{h.name}", 0.0, 0.0))[0], []).append(h.name)
    return list(groups.values())


def usable_cores(machines: Machines) -> float:
    """The most cores any host may use (its machine's CPUs, or fewer under its quota): the threads searched."""
    return max((min(cpus, cap) for _, cpus, cap in machines.values()), default=1.0)
