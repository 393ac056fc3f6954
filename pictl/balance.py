"""The `balanced` policy's core: exact minimum-bottleneck split points over a cost table.

Pure Python over numbers, no torch: the cost table (per-piece compute time on each
stage's host, bytes crossing each cut, link speeds, memory) comes from profiling.

A pipeline in steady state delivers one microbatch per bottleneck: the slowest
stage's time per microbatch. A stage's time is its pieces' compute on its host
plus the send of its output that it cannot overlap (latency + bytes / bandwidth
of the link to the next stage's host). Dynamic programming over (stages placed,
pieces covered) finds the split with the smallest bottleneck exactly, in
O(stages x pieces^2): 8 x 75^2 steps for DeiT-S cut inside blocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """The connection a stage's output crosses to reach the next stage."""

    latency_s: float = 0.0
    bytes_per_s: float = math.inf


@dataclass(frozen=True)
class CostTable:
    compute_s: Sequence[Sequence[float]]
    """compute_s[s][p]: seconds piece p takes per microbatch on the host of stage s."""
    cut_bytes: Sequence[float]
    """cut_bytes[p]: bytes sent when a stage ends just before piece p (index 0 unused)."""
    links: Sequence[Link]
    """links[s]: from stage s to stage s + 1 (len = stages - 1)."""
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


@dataclass(frozen=True)
class Split:
    starts: tuple[int, ...]
    """First piece of stages 2..N."""
    stage_s: tuple[float, ...]
    """Predicted seconds per microbatch of each stage (compute plus unhidden send)."""

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)


class NoFeasibleSplit(ValueError):
    """Every way to cut breaks a memory limit (or there are more stages than pieces)."""


def stage_time(table: CostTable, stage: int, first: int, end: int) -> float:
    """Seconds per microbatch of `stage` running pieces [first, end); inf if it breaks its memory limit."""
    if end <= first:
        return math.inf
    if table.memory_limit and sum(table.piece_bytes[first:end]) > table.memory_limit[stage]:
        return math.inf
    seconds = sum(table.compute_s[stage][first:end])
    if stage < table.stages - 1:
        link = table.links[stage]
        seconds += link.latency_s + table.cut_bytes[end] / link.bytes_per_s
    return seconds


def evaluate(table: CostTable, starts: Sequence[int]) -> Split:
    bounds = [0, *starts, table.pieces]
    return Split(tuple(starts), tuple(stage_time(table, s, bounds[s], bounds[s + 1]) for s in range(table.stages)))


def balanced_split(table: CostTable) -> Split:
    """The split with the smallest bottleneck (ties: the first found, scanning cuts left to right)."""
    k, n = table.stages, table.pieces
    if k > n:
        raise NoFeasibleSplit(f"{k} stages but only {n} pieces to share")
    # best[s][j]: smallest bottleneck for stages 0..s-1 covering pieces [0, j); cut[s][j]: where stage s-1 began.
    best = [[math.inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for s in range(1, k + 1):
        # Stage s-1 needs one piece at least, and the stages after it one each.
        for j in range(s, n - (k - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == math.inf:
                    continue
                value = max(best[s - 1][i], stage_time(table, s - 1, i, j))
                if value < best[s][j]:
                    best[s][j], cut[s][j] = value, i
    if best[k][n] == math.inf:
        raise NoFeasibleSplit("no split fits every stage's memory limit")
    starts, j = [], n
    for s in range(k, 1, -1):
        j = cut[s][j]
        starts.append(j)
    return evaluate(table, sorted(starts))


def brute_force_split(table: CostTable) -> Split:
    """Every split, for testing the dynamic programme on small tables."""
    splits = (evaluate(table, starts) for starts in itertools.combinations(range(1, table.pieces), table.stages - 1))
    found = min(splits, key=lambda sp: sp.bottleneck_s, default=None)
    if found is None or found.bottleneck_s == math.inf:
        raise NoFeasibleSplit("no split fits every stage's memory limit")
    return found
