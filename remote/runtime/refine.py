"""`balanced` closes the loop inside the run: measure each stage, correct the cost table, split again.

Rank 0 holds a `remote.balance.Refiner` over the table the controller solved the
first split from (`RunSpec.refine`). After a pass, every rank's measured compute
per microbatch (the median over the pass's microbatches: a rebuilt stage's first
calls are slower) reaches rank 0, which corrects the table and decides whether
another split is worth a calibration pass; every rank learns the decision through
a broadcast, so all of them rebuild the same split. Only the split changes, so the
outputs stay bit-identical.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch.distributed as dist

from remote.balance import CostTable, Link, Refiner, evaluate
from remote.emit import Emitter
from remote.recut import Watch
from remote.run_records import Recut, Refine, Refined
from remote.spec import RefineSpec


def refiner_for(refine: RefineSpec, starts: Sequence[int]) -> Refiner:
    table = CostTable(compute_s=refine.compute_s, cut_bytes=refine.cut_bytes,
                      links=[Link(lat, bw) for lat, bw in refine.links], comm_s_per_byte=refine.comm_s_per_byte)
    return Refiner(table, tuple(starts), max_rounds=refine.max_rounds, min_gain=refine.min_gain)


def measured_compute_s(times: list[float]) -> float:
    """One stage's compute per microbatch in one pass."""
    return statistics.median(times) if times else 0.0


def _ms(values: Sequence[float]) -> list[float]:
    return [round(v * 1000, 3) for v in values]


class RefineLoop:
    """The ranks' side of refinement: one `step` per measured pass."""

    def __init__(self, refine: RefineSpec, starts: Sequence[int], rank: int, world: int,
                 names: Sequence[str], emitter: Emitter) -> None:
        self.rank, self.world = rank, world
        self.names = list(names)  # split-point name of every piece index
        self.emitter = emitter
        self.refiner = refiner_for(refine, starts) if rank == 0 else None
        self.spec = refine
        self.watch: Watch | None = None
        """After refinement, rank 0's watch over the timed passes (`remote.recut`); None: not re-cutting."""

    def step(self, my_compute_s: float) -> tuple[int, ...] | None:
        """After a measured pass: the next split to calibrate, or None when refinement is over."""
        measured: list[float] | None = [0.0] * self.world if self.rank == 0 else None
        dist.gather_object(my_compute_s, measured, dst=0)
        decision: list[object] = [None]
        if self.refiner is not None:
            assert measured is not None
            tried = self.refiner.starts
            decision[0] = self.refiner.observe(measured)
            last = self.refiner.rounds[-1]
            self.emitter.emit(Refine(round=len(self.refiner.rounds), split_points=self._named(tried),
                                     predicted_ms=_ms(last.predicted_s), measured_ms=_ms(last.measured_s),
                                     link_ms=_ms(last.link_s), factors=[round(f, 4) for f in last.factors],
                                     next_split=self._named(decision[0]) if decision[0] is not None else None))
        dist.broadcast_object_list(decision, src=0)
        return decision[0]  # type: ignore[return-value]

    def final(self) -> tuple[int, ...]:
        """The split the timed passes run: the one that measured best. Rank 0 announces it."""
        chosen: list[object] = [None]
        if self.refiner is not None:
            chosen[0] = self.refiner.chosen
            prediction = self.refiner.predicted(self.refiner.chosen)
            self.emitter.emit(Refined(rounds=len(self.refiner.rounds), split_points=self._named(chosen[0]),
                                      predicted_ms=_ms(prediction.stage_s), link_ms=_ms(prediction.link_s),
                                      factors=[round(f, 4) for f in self.refiner.factors]))
        dist.broadcast_object_list(chosen, src=0)
        if self.refiner is not None and self.spec.recut:
            self.watch = Watch(self.refiner.table, tuple(chosen[0]), list(self.refiner.factors),  # type: ignore[arg-type]
                               threshold=self.spec.recut_threshold, patience=self.spec.recut_patience,
                               margin=self.spec.recut_margin, max_recuts=self.spec.max_recuts)
        return tuple(chosen[0])  # type: ignore[arg-type]

    def watch_pass(self, my_compute_s: float, after_pass: int) -> tuple[int, ...] | None:
        """After a timed pass (every rank, when re-cutting is on): the split to re-cut to, or None."""
        measured: list[float] | None = [0.0] * self.world if self.rank == 0 else None
        dist.gather_object(my_compute_s, measured, dst=0)
        decision: list[object] = [None]
        if self.watch is not None:
            assert measured is not None
            found = self.watch.observe(measured, after_pass)
            if found is not None:
                self.emitter.emit(Recut(after_pass=after_pass, reason=found.reason,
                                        split_points=self._named(found.old_starts),
                                        next_split=self._named(found.new_starts), moved=found.moved,
                                        measured_ms=_ms(found.measured_s), expected_ms=_ms(found.expected_s),
                                        predicted_ms=_ms(found.old_predicted_s),
                                        next_predicted_ms=_ms(found.new_predicted_s),
                                        factors=[round(x, 4) for x in found.factors]))
                # The corrected factors and the prediction of the split that runs now: the controller keeps
                # the corrections with each host's profile, as after refinement.
                now = evaluate(self.watch.table.corrected(self.watch.factors), found.new_starts)
                rounds = len(self.refiner.rounds) if self.refiner is not None else 0
                self.emitter.emit(Refined(rounds=rounds, split_points=self._named(found.new_starts),
                                          predicted_ms=_ms(now.stage_s), link_ms=_ms(now.link_s),
                                          factors=[round(f, 4) for f in self.watch.factors]))
                decision[0] = found.new_starts if found.moved else None
        dist.broadcast_object_list(decision, src=0)
        return decision[0]  # type: ignore[return-value]

    def _named(self, starts: Sequence[int]) -> list[str]:
        return [self.names[i] for i in starts]
