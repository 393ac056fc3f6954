"""`balanced` closes the loop inside the run: measure each stage, correct the cost table, split again.

Rank 0 holds a `remote.floor.refinement.Refiner` over the table the controller solved the
first split from (`RunSpec.refine`). After each untimed pass, every rank's compute time
of each microbatch reaches rank 0, which corrects the table and decides, knowing the
noise of what it measured, whether another split (or the same one again) is worth a
calibration pass; every rank learns the decision through a broadcast, so all of them
rebuild the same split. Only the split changes, so the outputs stay bit-identical.

Between timed passes the decision is the controller's (a re-cut ends one segment of the run and opens the next,
`pictl.run.segments`): rank 0 reports each pass's measure (`watch_pass`) and the ranks carry out the answer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from remote.floor import protocol as P
from remote.floor.emit import Emitter
from remote.floor.recut import read_decision, to_ms
from remote.floor.refinement import Refiner, table_of
from remote.floor.run_records import PassWatched, Refine, Refined
from remote.floor.spec import RefineSpec


def refiner_for(refine: RefineSpec, starts: Sequence[int]) -> Refiner:
    return Refiner(table_of(refine), tuple(starts), max_rounds=refine.max_rounds, min_gain=refine.min_gain,
                   max_repeats=refine.max_repeats, pass_noise=refine.pass_noise)


def measured_compute_s(times: list[float]) -> float:
    """One stage's compute per microbatch in one pass."""
    return statistics.median(times) if times else 0.0


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
                                     predicted_ms=to_ms(last.predicted_s), measured_ms=to_ms(last.measured_s),
                                     low_ms=to_ms([s.low for s in last.measured]),
                                     high_ms=to_ms([s.high for s in last.measured]),
                                     first_round=last.first_round, passes=last.passes,
                                     link_ms=to_ms(last.link_s), factors=[round(f, 4) for f in last.factors],
                                     next_split=self._named(decision[0]) if decision[0] is not None else None,
                                     adopted_round=last.adopted_round, reason=last.reason))
        dist.broadcast_object_list(decision, src=0)
        return decision[0]  # type: ignore[return-value]

    def final(self) -> tuple[int, ...]:
        """The split the timed passes run: the one refinement adopted (every rank learns it)."""
        chosen: list[object] = [self.refiner.chosen if self.refiner is not None else None]
        dist.broadcast_object_list(chosen, src=0)
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
                                  predicted_ms=to_ms(prediction.stage_s), link_ms=to_ms(prediction.link_s),
                                  factors=[round(f, 4) for f in r.factors], chosen_round=r.chosen_round,
                                  measured_ms=to_ms([s.median for s in stages]) if stages else None,
                                  low_ms=to_ms([s.low for s in stages]) if stages else None,
                                  high_ms=to_ms([s.high for s in stages]) if stages else None,
                                  passes=len(trial.passes) if trial is not None else None,
                                  calibration_passes=calibration_passes,
                                  calibration_s=round(time.perf_counter() - self.started, 3),
                                  reason=r.rounds[-1].reason if r.rounds else None))

    def watch_pass(self, my_compute_s: float, after_pass: int, run_dir: Path,
                   timeout_s: float) -> tuple[int, ...] | None:
        """After a timed pass (every rank, when re-cutting is on): the split to re-cut to, or None. Rank 0 hands
        every stage's compute per microbatch to the controller, whose watch decides (`pictl.run.segments`), and
        waits for its answer; every rank learns it through a broadcast. The host keeps only the mechanism."""
        measured: list[float] | None = [0.0] * self.world if self.rank == 0 else None
        dist.gather_object(my_compute_s, measured, dst=0)
        decision: list[object] = [None]
        if self.rank == 0:
            assert measured is not None
            self.emitter.emit(PassWatched(after_pass=after_pass, measured_ms=to_ms(measured)))
            named = _await_decision(run_dir / P.recut_decision_file(after_pass), timeout_s)
            decision[0] = tuple(self.names.index(n) for n in named) if named is not None else None
        dist.broadcast_object_list(decision, src=0)
        return decision[0]  # type: ignore[return-value]

    def _named(self, starts: Sequence[int]) -> list[str]:
        return [self.names[i] for i in starts]


def _await_decision(path: Path, timeout_s: float, poll_s: float = 0.005) -> list[str] | None:
    """The controller's answer for one pass (its file, written atomically, then removed): the split points of the
    next pass, or None to keep this one. No answer in `timeout_s` fails the run: going on with a split the
    controller does not know would make its figures wrong."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no re-cut decision from the controller within {timeout_s:.0f} s ({path.name})")
        time.sleep(poll_s)
    body = path.read_text()
    path.unlink(missing_ok=True)
    return read_decision(body)
