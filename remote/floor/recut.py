"""Keeping the balance during a run: every timed pass is watched, and the pipeline is re-cut between passes
when a host has slowed down (throttling, a neighbour's load) or recovered enough that another split wins.

Pure Python over numbers, no torch: the controller runs it over what rank 0 reports after each timed pass, once
`balanced` has refined its split (`pictl.run.segments`; the ranks carry out its decision, `remote.runtime.refine`),
and tests drive it directly. Only the split changes, so a re-cut run's outputs
stay bit-identical to the serial run's.

The rules, with hysteresis so that noise never moves the cut:

- A pass drifts when some stage's measured compute per microbatch is off what the corrected cost table
  expects for the current split by more than `threshold` (15 %: a pass's median microbatch moves a few
  percent from pass to pass on an unchanged host).
- The first timed pass sets the expectation (its measure corrects the factors, nothing is decided): the
  refinement measured cold passes, and a warm pass can sit 25 % off them with nothing changed.
- `patience` drifting passes in a row (2) before anything is done; the pass right after a re-cut is not
  judged (a rebuilt stage's first calls are cold).
- Then each stage's host factor is corrected by measured / expected (the mean over the drifting passes),
  the table is solved again, and the pipeline is re-cut only if the new split's predicted bottleneck beats
  the current split's, under the same corrected table, by more than `margin` (10 %: a re-cut costs a
  rebuild and a cold pass, and two stages sharing a busy machine were seen to drift 12 % apart for two
  passes on their own). Either way the corrected factors become the expectation, so a slowdown that no
  split can help stops drifting.
- At most `max_recuts` re-cuts per run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from remote.floor.balance import CostTable, balanced_split, evaluate
from remote.floor.refinement import table_of
from remote.floor.spec import RefineSpec


@dataclass(frozen=True)
class RecutDecision:
    """One decision of the watch: the host factors were corrected, and the split moved (or not)."""

    after_pass: int
    """The timed pass (0-based) after which it was decided; the next pass runs `new_starts`."""
    reason: str
    old_starts: tuple[int, ...]
    new_starts: tuple[int, ...]
    """== old_starts when the correction found no split better by the margin."""
    measured_s: tuple[float, ...]
    expected_s: tuple[float, ...]
    """What the table expected for the old split before this correction."""
    old_predicted_s: tuple[float, ...]
    """The old split under the corrected table (stages, then links)."""
    new_predicted_s: tuple[float, ...]
    factors: tuple[float, ...]

    @property
    def moved(self) -> bool:
        return self.new_starts != self.old_starts


@dataclass
class Watch:
    table: CostTable
    starts: tuple[int, ...]
    factors: list[float]
    threshold: float = 0.15
    patience: int = 2
    margin: float = 0.10
    max_recuts: int = 2
    decisions: list[RecutDecision] = field(default_factory=list)
    _drifting: list[tuple[float, ...]] = field(default_factory=list)
    _skip: int = 0
    _calibrated: bool = False

    @property
    def recuts(self) -> int:
        return sum(d.moved for d in self.decisions)

    def expected(self) -> tuple[float, ...]:
        return evaluate(self.table.corrected(self.factors), self.starts).stage_s

    def observe(self, measured_s: Sequence[float], after_pass: int) -> RecutDecision | None:
        """One timed pass measured `measured_s` per stage: a correction (and maybe a new split), or None."""
        if self._skip:
            self._skip -= 1
            return None
        expected = self.expected()
        if not self._calibrated:  # the first timed pass is the expectation, not a drift from it
            self._calibrated = True
            self.factors = [f * (m / e if m > 0 and e > 0 else 1.0)
                            for f, m, e in zip(self.factors, measured_s, expected, strict=True)]
            return None
        off = [m / e - 1.0 for m, e in zip(measured_s, expected, strict=True) if m > 0 and e > 0]
        if not off or max(abs(x) for x in off) <= self.threshold:
            self._drifting.clear()
            return None
        self._drifting.append(tuple(measured_s))
        if len(self._drifting) < self.patience:
            return None
        mean = tuple(sum(p[s] for p in self._drifting) / len(self._drifting) for s in range(len(expected)))
        self._drifting.clear()
        worst = max(range(len(expected)), key=lambda s: abs(mean[s] / expected[s] - 1.0) if expected[s] else 0.0)
        change = mean[worst] / expected[worst] - 1.0
        reason = (f"stage {worst} measured {abs(change):.0%} {'slower' if change > 0 else 'faster'} than expected "
                  f"for {self.patience} passes")
        self.factors = [f * (m / e if m > 0 and e > 0 else 1.0) for f, m, e in zip(self.factors, mean, expected,
                                                                                   strict=True)]
        corrected = self.table.corrected(self.factors)
        now = evaluate(corrected, self.starts)
        candidate = balanced_split(corrected)
        old = self.starts
        if self.recuts < self.max_recuts and candidate.starts != old \
                and candidate.bottleneck_s < now.bottleneck_s * (1.0 - self.margin):
            self.starts, self._skip = candidate.starts, 1
        else:
            candidate = now
        decision = RecutDecision(after_pass, reason, old, self.starts, mean, expected, (*now.stage_s, *now.link_s),
                         (*candidate.stage_s, *candidate.link_s), tuple(self.factors))
        self.decisions.append(decision)
        return decision


def watch_of(refine: RefineSpec, starts: Sequence[int], factors: Sequence[float]) -> Watch:
    """The watch over a run's timed passes, from its refinement's table and what refinement ended on: the split
    the timed passes begin with and the hosts' corrected factors."""
    return Watch(table_of(refine), tuple(starts), list(factors), threshold=refine.recut_threshold,
                 patience=refine.recut_patience, margin=refine.recut_margin, max_recuts=refine.max_recuts)


def to_ms(seconds: Sequence[float]) -> list[float]:
    """Seconds as the records write them: milliseconds to the microsecond."""
    return [round(v * 1000, 3) for v in seconds]


def decision_body(after_pass: int, split: Sequence[str] | None) -> bytes:
    """The controller's answer for timed pass `after_pass` (`protocol.recut_decision_file`): the split points the
    next pass runs, or null to run this split again."""
    return json.dumps({"after_pass": after_pass, "next_split": list(split) if split is not None else None}).encode()


def read_decision(body: str) -> list[str] | None:
    """`decision_body` read back on rank 0: the next pass's split points, or None to keep this split."""
    answer = json.loads(body)
    split = answer.get("next_split") if isinstance(answer, dict) else None
    return [str(n) for n in split] if isinstance(split, list) else None
