"""`balanced` closes the loop inside the run: measure each stage, correct the cost table, split again.

Rank 0 holds a `remote.floor.refinement.Refiner` over the table the controller solved the
first split from (`RunSpec.refine`). After each untimed pass, every rank's compute time
of each microbatch reaches rank 0, which corrects the table and decides, knowing the
noise of what it measured, whether another split (or the same one again) is worth a
calibration pass; every rank learns the decision through a broadcast, so all of them
rebuild the same split. Only the split changes, so the outputs stay bit-identical.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch.distributed as dist

from remote.floor.balance import CostTable, Link, evaluate
from remote.floor.emit import Emitter
from remote.floor.recut import Watch
from remote.floor.refinement import Refiner
from remote.floor.run_records import Recut, Refine, Refined
from remote.floor.spec import RefineSpec


def refiner_for(refine: RefineSpec, starts: Sequence[int]) -> Refiner:
    table = CostTable(compute_s=refine.compute_s, cut_bytes=refine.cut_bytes,
                      links=[Link(lat, bw) for lat, bw in refine.links], comm_s_per_byte=refine.comm_s_per_byte)
    return Refiner(table, tuple(starts), max_rounds=refine.max_rounds, min_gain=refine.min_gain,
                   max_repeats=refine.max_repeats, pass_noise=refine.pass_noise)


def measured_compute_s(times: list[float]) -> float:
    """One stage's compute per microbatch in one pass."""
    return statistics.median(times) if times else 0.0


def _ms(values: Sequence[float]) -> list[float]:
    return [round(v * 1000, 3) for v in values]


class RefineLoop:
    """The ranks' side of refinement: one `step` per measured pass, `final`, then `announce`."""

    def __init__(self, refine: RefineSpec, starts: Sequence[int], rank: int, world: int,
                 names: Sequence[str], emitter: Emitter) -> None:
        self.rank, self.world = rank, world
        self.names = list(names)  # split-point name of every piece index
        self.emitter = emitter
        self.refiner = refiner_for(refine, starts) if rank == 0 else None
        self.spec = refine
        self.started = time.perf_counter()
        self.watch: Watch | None = None
        """After refinement, rank 0's watch over the timed passes (`remote.floor.recut`); None: not re-cutting."""

    def step(self, my_times: Sequence[float]) -> tuple[int, ...] | None:
        """After a measured pass (this rank's compute seconds of each microbatch): the next split to calibrate
        (maybe the one just measured, to measure it again), or None when refinement is over."""
        measured: list[list[float]] | None = [[] for _ in range(self.world)] if self.rank == 0 else None
        dist.gather_object(list(my_times), measured, dst=0)
        decision: list[object] = [None]
        if self.refiner is not None:
            assert measured is not None
            tried = self.refiner.starts
            decision[0] = self.refiner.observe(measured)
            last = self.refiner.rounds[-1]
            self.emitter.emit(Refine(round=len(self.refiner.rounds), split_points=self._named(tried),
                                     predicted_ms=_ms(last.predicted_s), measured_ms=_ms(last.measured_s),
                                     low_ms=_ms([s.low for s in last.measured]),
                                     high_ms=_ms([s.high for s in last.measured]),
                                     first_round=last.first_round, passes=last.passes,
                                     link_ms=_ms(last.link_s), factors=[round(f, 4) for f in last.factors],
                                     next_split=self._named(decision[0]) if decision[0] is not None else None,
                                     adopted_round=last.adopted_round, reason=last.reason))
        dist.broadcast_object_list(decision, src=0)
        return decision[0]  # type: ignore[return-value]

    def final(self) -> tuple[int, ...]:
        """The split the timed passes run: the one refinement adopted (every rank learns it)."""
        chosen: list[object] = [self.refiner.chosen if self.refiner is not None else None]
        dist.broadcast_object_list(chosen, src=0)
        if self.refiner is not None and self.spec.recut:
            self.watch = Watch(self.refiner.table, tuple(chosen[0]), list(self.refiner.factors),  # type: ignore[arg-type]
                               threshold=self.spec.recut_threshold, patience=self.spec.recut_patience,
                               margin=self.spec.recut_margin, max_recuts=self.spec.max_recuts)
        return tuple(chosen[0])  # type: ignore[arg-type]

    def announce(self, calibration_passes: int) -> None:
        """Rank 0, once the chosen split is built: which round's split the timed passes run, as measured and
        predicted, and what refinement added to start-up."""
        r = self.refiner
        if r is None:
            return
        prediction = r.predicted(r.chosen)
        trial = r.trials.get(r.chosen)
        stages = trial.stages(r.pass_noise) if trial is not None else []
        self.emitter.emit(Refined(rounds=len(r.rounds), split_points=self._named(r.chosen),
                                  predicted_ms=_ms(prediction.stage_s), link_ms=_ms(prediction.link_s),
                                  factors=[round(f, 4) for f in r.factors], chosen_round=r.chosen_round,
                                  measured_ms=_ms([s.median for s in stages]) if stages else None,
                                  low_ms=_ms([s.low for s in stages]) if stages else None,
                                  high_ms=_ms([s.high for s in stages]) if stages else None,
                                  passes=len(trial.passes) if trial is not None else None,
                                  calibration_passes=calibration_passes,
                                  calibration_s=round(time.perf_counter() - self.started, 3),
                                  reason=r.rounds[-1].reason if r.rounds else None))

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
