"""The `balanced` policy's core: exact minimum-bottleneck split points over a cost table (the loop that
corrects the table from what a run measures is `remote.floor.refinement`).

Pure Python over numbers, no torch: the controller solves the first split, and the
pipeline's ranks solve again during the run (every rank the same way), from the
same table.

A pipeline in steady state delivers one microbatch per bottleneck: its slowest
resource's time per microbatch. The resources are the stages (a stage's pieces on
its host, plus the CPU its host spends sending its output and receiving its input:
gloo's socket copies share a capped host's quota with the compute, and a slow link's
trickle of packets costs the receiver more than a fast link's bursts) and the links
(latency + bytes / bandwidth of the cut's state, on the wire while the stages
compute: sends are asynchronous, so a link overlaps the stages and only bounds the
pipeline when it is the slowest part). Dynamic programming over (stages placed,
pieces covered) finds the split with the smallest bottleneck exactly, in
O(stages x pieces^2): 8 x 75^2 steps for DeiT-S cut inside blocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Link:
    """The connection a stage's output crosses to reach the next stage."""

    latency_s: float = 0.0
    bytes_per_s: float = math.inf
    send_s_per_byte: float = 0.0
    """Seconds of the sending host's compute a byte sent over this link takes (measured; 0: not measured)."""
    recv_s_per_byte: float = 0.0
    """... and of the receiving host's: on a slow link the bytes arrive a few packets at a time, each a wake-up and
    a system call, which a quota-bound host pays out of the stage's compute (`remote/profiling/linktest.py`)."""


@dataclass(frozen=True)
class CostTable:
    compute_s: Sequence[Sequence[float]]
    """compute_s[s][p]: seconds piece p takes per microbatch on the host of stage s."""
    cut_bytes: Sequence[float]
    """cut_bytes[p]: bytes sent when a stage ends just before piece p (index 0 unused)."""
    links: Sequence[Link]
    """links[s]: from stage s to stage s + 1 (len = stages - 1)."""
    comm_s_per_byte: Sequence[float] = ()
    """comm_s_per_byte[s]: seconds the host of stage s spends per byte it copies (empty: free); a link's own
    measured cost per byte (`Link.send_s_per_byte`, `Link.recv_s_per_byte`) counts where it is dearer."""
    piece_bytes: Sequence[float] = ()
    """Weights of each piece, for the memory limit (empty: no limit applies)."""
    memory_limit: Sequence[float] = ()
    """memory_limit[s]: bytes of weights the host of stage s can hold for it (empty: unlimited)."""

    @property
    def stages(self) -> int:
        return len(self.compute_s)

    @property
    def pieces(self) -> int:
        return len(self.cut_bytes)

    def corrected(self, factors: Sequence[float]) -> CostTable:
        """The table with stage s's host `factors[s]` times slower than profiled (compute and copies)."""
        comm = self.comm_s_per_byte or [0.0] * self.stages
        links = [replace(k, send_s_per_byte=k.send_s_per_byte * factors[s], recv_s_per_byte=k.recv_s_per_byte *
                         factors[s + 1]) for s, k in enumerate(self.links)]
        return replace(self, compute_s=[[t * f for t in row] for row, f in zip(self.compute_s, factors, strict=True)],
                       comm_s_per_byte=[c * f for c, f in zip(comm, factors, strict=True)], links=links)


@dataclass(frozen=True)
class Split:
    starts: tuple[int, ...]
    """First piece of stages 2..N."""
    stage_s: tuple[float, ...]
    """Predicted seconds per microbatch of each stage: its compute plus its host's copies in and out."""
    link_s: tuple[float, ...] = ()
    """Predicted seconds per microbatch on each link (stage s to s + 1)."""

    @property
    def bottleneck_s(self) -> float:
        return max((*self.stage_s, *self.link_s))


class NoFeasibleSplit(ValueError):
    """Every way to cut breaks a memory limit (or there are more stages than pieces)."""


def stage_time(table: CostTable, stage: int, first: int, end: int) -> float:
    """Seconds per microbatch of `stage` running pieces [first, end); inf if it breaks its memory limit."""
    if end <= first:
        return math.inf
    if table.memory_limit and sum(table.piece_bytes[first:end]) > table.memory_limit[stage]:
        return math.inf
    seconds = sum(table.compute_s[stage][first:end])
    # A byte in or out costs the host the dearer of a local copy (profiled) and what its link measured.
    copy = table.comm_s_per_byte[stage] if table.comm_s_per_byte else 0.0
    if stage > 0:
        seconds += table.cut_bytes[first] * max(copy, table.links[stage - 1].recv_s_per_byte)
    if stage < table.stages - 1:
        seconds += table.cut_bytes[end] * max(copy, table.links[stage].send_s_per_byte)
    return seconds


def link_time(table: CostTable, stage: int, end: int) -> float:
    """Seconds per microbatch on the link after `stage` when that stage ends before piece `end`."""
    if stage >= table.stages - 1:
        return 0.0
    link = table.links[stage]
    return link.latency_s + table.cut_bytes[end] / link.bytes_per_s


def evaluate(table: CostTable, starts: Sequence[int]) -> Split:
    bounds = [0, *starts, table.pieces]
    return Split(tuple(starts), tuple(stage_time(table, s, bounds[s], bounds[s + 1]) for s in range(table.stages)),
                 tuple(link_time(table, s, bounds[s + 1]) for s in range(table.stages - 1)))


def balanced_split(table: CostTable, *others: CostTable) -> Split:
    """The split with the smallest bottleneck (among those that tie, the shortest way through). With
    `others` (replicas that share the split, each on its own hosts), the smallest bottleneck of the slowest
    of them: each stage and link costs its worst over the tables, which is exact, since the slowest replica's
    bottleneck is the largest of every replica's every stage. The result is evaluated on the table whose
    bottleneck it is."""
    tables = (table, *others)
    k, n = table.stages, table.pieces
    if k > n:
        raise NoFeasibleSplit(f"{k} stages but only {n} pieces to share")
    bottleneck, _ = _solve(tables, lambda before, stage, wire: max(before, stage, wire))
    if bottleneck == math.inf:
        raise NoFeasibleSplit("no split fits every stage's memory limit")
    # Many splits tie on the bottleneck when one piece bounds the pipeline (VGG-16's first fully-connected
    # layer). Each pass still waits for its first microbatch to cross every stage and link before the last stage
    # starts (and for its last to drain): of the ties, the split whose stages and links add up to the least
    # fills and drains soonest, and moves the fewest bytes.
    bound = bottleneck * (1 + TIE)
    _, starts = _solve(tables, lambda before, stage, wire: before + stage + wire
                       if stage <= bound and wire <= bound else math.inf)
    return max((evaluate(t, starts) for t in tables), key=lambda sp: sp.bottleneck_s)


TIE = 1e-9
"""Bottlenecks this close (relative) are one: float sums of the same times in another order."""


def _solve(tables: Sequence[CostTable], step: Callable[[float, float, float], float]) -> tuple[float, list[int]]:
    """The split whose value is least, where a split's value is built stage by stage: `step(value of the stages
    before, this stage's time, its outgoing link's time)`, every stage and link costing its worst over `tables`.
    Dynamic programming over (stages placed, pieces covered); the value and the first piece of stages 2..N."""
    k, n = tables[0].stages, tables[0].pieces
    # best[s][j]: the least value of stages 0..s-1 covering pieces [0, j); cut[s][j]: where stage s-1 began.
    best = [[math.inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        # Stage s-1 needs one piece at least, and the stages after it one each.
        for j in range(s, n - (k - s) + 1):
            wire = max(link_time(t, s - 1, j) for t in tables) if j < n else 0.0
            for i in range(s - 1, j):
                if best[s - 1][i] == math.inf:
                    continue
                value = step(best[s - 1][i], max(stage_time(t, s - 1, i, j) for t in tables), wire)
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    starts, j = [], n
    for s in range(k, 1, -1):
        j = cut[s][j]
        starts.append(j)
    return best[k][n], sorted(starts)


def brute_force_split(table: CostTable) -> Split:
    """Every split, for testing the dynamic programme on small tables."""
    splits = (evaluate(table, starts) for starts in itertools.combinations(range(1, table.pieces), table.stages - 1))
    found = min(splits, key=lambda sp: sp.bottleneck_s, default=None)
    if found is None or found.bottleneck_s == math.inf:
        raise NoFeasibleSplit("no split fits every stage's memory limit")
    return found
