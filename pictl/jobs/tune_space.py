"""What `pictl tune` searches: a configuration (`Candidate`: replicas x stages, threads per rank, chunk, numerics,
wire) and every one a cluster allows (`candidates`).

Threads and chunk are searched only where neither the preset nor a flag fixes them (the lab's protocol fixes
chunk 1 and 4 threads): `Axes` holds the values tried, the base's first. A chunk other than the base's changes
the arithmetic (a batch of 4 through DeiT-S's matmuls rounds differently from 4 batches of 1), so such a
candidate's outputs are compared with the tune's reference serial run, not only with its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from remote.floor.wire import parse_wire

LOSSY_WIRES = ("fp16", "int8")
"""The compressing formats a lossy tune tries (lowrank loses far more for its bytes on DeiT-S's links)."""
CHUNKS = (1, 2, 4, 8)
"""Microbatch sizes a tune tries when the chunk is not fixed (those that divide the images)."""


@dataclass(frozen=True)
class Candidate:
    replicas: int
    stages: int
    numerics: str = "fp32"
    wire: str = "fp32"
    threads: int = 1
    """torch threads per rank (and for its serial run)."""
    chunk: int = 1

    @property
    def lossy(self) -> bool:
        """Lossy by construction (int8 numerics, a compressing wire); a chunk may turn out inexact when measured."""
        return self.numerics != "fp32" or not parse_wire(self.wire).lossless

    @property
    def label(self) -> str:
        shape = f"{self.replicas}x{self.stages}"
        extra = [x for x in (f"{self.threads} threads" if self.threads != 1 else "",
                             f"chunk {self.chunk}" if self.chunk != 1 else "",
                             self.numerics if self.numerics != "fp32" else "",
                             f"wire {self.wire}" if self.wire != "fp32" else "") if x]
        return " ".join([shape, *extra])

    def short(self, base: RunOptions | None = None) -> str:
        """At most 13 characters for the table: threads and chunk where they differ from `base`'s."""
        threads, chunk = (base.threads, base.chunk) if base else (1, 1)
        return (f"{self.replicas}x{self.stages}" + (f"t{self.threads}" if self.threads != threads else "")
                + (f"c{self.chunk}" if self.chunk != chunk else "")
                + ("+i8" if self.numerics != "fp32" else "") + (f"+w{self.wire}" if self.wire != "fp32" else ""))

    def options(self, base: RunOptions, split: list[str] | None = None) -> RunOptions:
        """The run that measures this candidate: `balanced` cuts a pipeline (or, given, the `split` its screening
        run measured: a round measures the same configuration again); the base's images and passes."""
        split = list(split or []) if self.stages > 1 else []
        fields = {**base.model_dump(exclude={"artifact"}), "stages": self.stages, "replicas": self.replicas,
                  "numerics": self.numerics, "wire": self.wire, "threads": self.threads, "chunk": self.chunk,
                  "split": split, "policy": "explicit" if split else "balanced" if self.stages > 1 else "equal"}
        if base.artifact:
            fields["model"] = base.artifact
        return RunOptions(**fields)

    def changes_arithmetic(self, base: RunOptions) -> bool:
        """A chunk (or thread count) other than the base's: its outputs may differ from the reference serial
        run's by rounding even when they equal its own serial run's."""
        return self.chunk != base.chunk or self.threads != base.threads

    def simplicity(self, base: RunOptions) -> tuple[int, ...]:
        """What a tie within noise is settled by, smaller first (docs/tuning.md, "simpler"): exact before lossy,
        then fewer ranks (the hosts and processes it takes), fewer stages (a pipeline adds links, fill and drain
        that copies do not), fewer threads per rank, and the base's chunk before another."""
        return (int(self.lossy), self.replicas * self.stages, self.stages, self.threads,
                int(self.chunk != base.chunk))


@dataclass(frozen=True)
class Axes:
    """The threads and chunks a tune tries, the base's first (one value each: that axis is fixed)."""

    threads: tuple[int, ...] = (1,)
    chunks: tuple[int, ...] = (1,)

    @classmethod
    def of(cls, base: RunOptions, *, search_threads: bool, search_chunk: bool, cores: float = 1.0) -> Axes:
        """`cores`: the most any host may use (its CPUs, or its quota); threads go 1, 2, 4 ... up to it."""
        threads = [base.threads]
        if search_threads:
            top = max(1, int(cores))
            threads += [t for t in sorted({*(2 ** i for i in range(9) if 2 ** i <= top), top}) if t != base.threads]
        chunks = [base.chunk]
        if search_chunk:
            chunks += [c for c in CHUNKS if c != base.chunk and base.images % c == 0]
        return cls(tuple(threads), tuple(chunks))


def candidates(cluster: Cluster, base: RunOptions, *, allow_loss: bool, axes: Axes | None = None) -> list[Candidate]:
    """Every shape that fits the slots and deals the pass's microbatches evenly, in each numerics and wire,
    at every thread count and chunk of `axes` (default: the base's)."""
    axes = axes or Axes((base.threads,), (base.chunk,))
    out = []
    for threads in axes.threads:
        for chunk in axes.chunks:
            microbatches = -(-base.images // chunk)
            for ranks in range(1, cluster.slots + 1):
                for replicas in (r for r in range(1, ranks + 1) if ranks % r == 0 and microbatches % r == 0):
                    stages = ranks // replicas
                    out.append(Candidate(replicas, stages, threads=threads, chunk=chunk))
                    if allow_loss:
                        out.append(Candidate(replicas, stages, "int8-dynamic", threads=threads, chunk=chunk))
                        out += [Candidate(replicas, stages, wire=w, threads=threads, chunk=chunk)
                                for w in LOSSY_WIRES if stages > 1]
    return out
