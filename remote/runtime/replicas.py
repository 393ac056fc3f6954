"""Replicas of one pipeline: R copies of an S-stage pipeline over R x S ranks (`RunSpec.replicas`).

Rank g runs stage g % S of replica g // S; each replica's stages talk over a process group of their own, so
the pipelines never exchange a byte. The pass's microbatches are dealt round-robin (microbatch j to replica
j % R), every pass starts on one barrier over all ranks, and a pass lasts until its slowest replica is done:
the aggregate throughput is every image over that time, never a sum of the replicas' own rates. The last
rank of all gathers every replica's logits back into image order, so the outputs are checked as one run's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Replicas:
    """Where one rank sits: its replica, its stage in that replica, and the replica's process group."""

    count: int
    stages: int
    rank: int
    group: dist.ProcessGroup | None
    """The replica's stages (None: one replica, the whole world)."""

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def gathers(self) -> bool:
        """The last rank of all: it reports the run's throughput and outputs."""
        return self.rank == self.count * self.stages - 1

    def microbatches(self, total: int) -> int:
        """How many of a pass's `total` microbatches this rank's replica runs."""
        return len(range(self.replica, total, self.count))

    def deal(self, mbs: list[torch.Tensor]) -> list[torch.Tensor]:
        return mbs[self.replica::self.count]

    def pass_times(self, seconds: float) -> list[float]:
        """Every replica's pass time: the longest of its ranks' (every rank calls this after every pass)."""
        if self.count == 1:
            return [seconds]
        t = torch.zeros(self.count * self.stages, dtype=torch.float64)
        t[self.rank] = seconds
        dist.all_reduce(t)  # each rank fills its own slot: the sum is every rank's time
        return [float(t[r * self.stages:(r + 1) * self.stages].max()) for r in range(self.count)]

    def gather_outputs(self, out: torch.Tensor | None, total: int, chunk: int) -> torch.Tensor | None:
        """Every replica's logits in image order, on the gathering rank (None elsewhere); every rank calls
        this once. `out`: this rank's replica's logits when it is a last stage."""
        if self.count == 1:
            return out
        world = self.count * self.stages
        mine = out if self.last else None
        got: list[torch.Tensor | None] | None = [None] * world if self.gathers else None
        dist.gather_object(mine, got, dst=world - 1)
        if got is None:
            return None
        parts = [got[r * self.stages + self.stages - 1] for r in range(self.count)]
        if any(p is None for p in parts):
            raise RuntimeError("a replica's last stage sent no logits")
        rows = []
        for j in range(total):  # microbatch j is replica j % R's (j // R)-th
            part = parts[j % self.count]
            assert part is not None
            k = j // self.count
            rows.append(part[k * chunk:(k + 1) * chunk])
        return torch.cat(rows)


def replicas_of(rank: int, world: int, stages: int, count: int) -> Replicas:
    """This rank's place; every rank creates every replica's group, in the same order (torch requires it)."""
    if world != stages * count:
        raise RuntimeError(f"world size {world} != {count} replica(s) x {stages} stage(s)")
    if count == 1:
        return Replicas(1, stages, rank, None)
    groups = [dist.new_group(list(range(r * stages, (r + 1) * stages))) for r in range(count)]
    return Replicas(count, stages, rank, groups[rank // stages])
