"""`balanced`'s refinement: which split the timed passes run, decided from measurements that know their noise.

Pure Python over numbers, no torch: rank 0 of the pipeline runs it between the untimed passes before the
timed ones (`remote.runtime.refine`), and tests drive it directly. The split solver is `remote.floor.balance`.

**What a round measures.** A round is one untimed pass of one split (the first split's is the last warm-up
pass). Every stage reports the compute time of each of its microbatches. A stage of a split is summed up over
every pass that measured that split, pooled: its median, and an interval around the median that holds the
noise seen two ways:

- within passes: the median's notch, median +- 1.57 x IQR / sqrt(n) over the n microbatches (McGill, Tukey
  and Larsen's notched box plot: two medians whose notches do not overlap differ at about 95 %);
- between passes: half the range of the split's per-pass medians, and at least `pass_noise` x median /
  sqrt(passes), an allowance for the passes not yet seen. At 4 threads on shared memory one pass's median
  moved 14.3 -> 9.3 -> 15.2 ms for neighbouring cuts (the field notes, section 12), and a warm pass sits
  up to 25 % off a cold one (`remote.floor.recut`): one pass cannot show that, so a split measured once is
  trusted to +-`pass_noise` (10 %) at best, twice to +-7 %.

The half-width is the larger of the two. A split's measured bottleneck is the largest of its stages (and of
its links, which are predicted): median the largest median, interval from the largest low to the largest high.

**The rules.**

1. Correct: each stage's host factor is everything measured on it over everything the profile predicts for
   the same pieces, pooled over every split measured (one noisy pass moves a factor by its share, not all
   the way, and the next candidate with it). A stage that feeds a link slower than itself (its link's
   predicted time above its own) is left out of its host's factor: its sends back up, and the network's
   work for them (the kernel's, on the stage's CPU) lands in its compute time, which then says nothing of
   the host's speed. (Counted, it made MobileNetV2's first stage, 1.9 ms profiled and feeding 0.8 MB a
   microbatch into a 1 Gbit/s link, look 5.8x slower than profiled; the factor, cached, then priced every
   split that gave that host more work above a cut where 0.8 MB crossed a 100 Mbit/s link, and `balanced`
   ran 0.48x `equal`.)
2. Try: a new split is calibrated only when, under the corrected table, its predicted bottleneck beats the
   adopted split's by more than `min_gain` (3 %) and by more than the noise the adopted split's passes
   showed (`Spread.seen`: a gain the corrected factors owe to that noise is no gain), and only if it was
   never measured before.
3. Adopt: the candidate replaces the adopted split (at first, the controller's) only when the intervals of
   their measured bottlenecks separate (the candidate's high below the adopted split's low) and its median
   is lower by `min_gain` at least. Its median no lower by `min_gain`: it is dropped. Lower, but the
   intervals overlap: both are measured again, interleaved (the adopted split first, then whichever has
   fewer passes), at most `max_repeats` extra passes in the whole refinement; still overlapping then, it is
   a tie within the noise and the adopted split stays. A gain inside the noise is never adopted.
4. Budget: at most `max_rounds` distinct splits (the first included) and `max_repeats` repeats, so
   refinement adds at most (max_rounds - 1) + max_repeats untimed passes, each with a stage rebuild, to the
   run's start-up (4 with the defaults; one more pass under --warmup 0, which has no warm-up to measure the
   first split, and one more rebuild when the adopted split is not the last one measured). Refinement
   passes are never timed passes; the `refined` record says how many there were and how long they took.
5. The timed passes run the adopted split, and every round's record says which round's split that is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from remote.floor.balance import CostTable, Link, Split, balanced_split, evaluate
from remote.floor.spec import RefineSpec


def table_of(refine: RefineSpec) -> CostTable:
    """The cost table the controller solved the first split from, as the ranks get it (`RunSpec.refine`)."""
    return CostTable(compute_s=refine.compute_s, cut_bytes=refine.cut_bytes,
                     links=[Link(*link) for link in refine.links], comm_s_per_byte=refine.comm_s_per_byte)

NOTCH = 1.57
"""McGill, Tukey and Larsen (1978): median +- 1.57 x IQR / sqrt(n) is a notch whose overlap means no clear
difference."""


@dataclass(frozen=True)
class Spread:
    """A figure measured with its noise: the median and the interval the noise leaves around it (seconds)."""

    median: float
    low: float
    high: float
    seen: float = 0.0
    """The noise the passes showed (notch or range of pass medians), relative to the median: the interval
    without the allowance for passes not yet seen."""


def stage_spread(passes: Sequence[Sequence[float]], pass_noise: float) -> Spread:
    """One stage of one split over every pass that measured it (each pass: its microbatches' seconds)."""
    times = sorted(t for p in passes for t in p)
    if not times:
        return Spread(0.0, 0.0, 0.0)
    median = statistics.median(times)
    n = len(times)
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if n > 1 else (times[0],) * 3
    notch = NOTCH * (q3 - q1) / math.sqrt(n)
    medians = [statistics.median(p) for p in passes if p]
    seen = max(notch, (max(medians) - min(medians)) / 2)
    half = max(seen, pass_noise * median / math.sqrt(len(medians)))
    return Spread(median, max(0.0, median - half), median + half, seen / median if median > 0 else 0.0)


def bottleneck(stages: Sequence[Spread], links_s: Sequence[float] = ()) -> Spread:
    """A split's measured bottleneck: its slowest stage (or a link, predicted exactly), with the noise."""
    slowest = max(stages, key=lambda s: s.median, default=Spread(0.0, 0.0, 0.0))
    median = max((slowest.median, *links_s))
    return Spread(median, max((*(s.low for s in stages), *links_s)), max((*(s.high for s in stages), *links_s)),
                  slowest.seen if median == slowest.median else 0.0)


@dataclass
class Trial:
    """One split as measured so far: every pass of it, per stage, every microbatch's seconds."""

    starts: tuple[int, ...]
    first_round: int
    passes: list[list[list[float]]] = field(default_factory=list)

    def stages(self, pass_noise: float) -> list[Spread]:
        return [stage_spread([p[s] for p in self.passes], pass_noise) for s in range(len(self.passes[0]))]


@dataclass(frozen=True)
class Round:
    """One calibration pass: the split it measured, what that split measures so far, and what was decided."""

    starts: tuple[int, ...]
    first_round: int
    """The round in which this split was first measured (its name: "round 2's split")."""
    passes: int
    """Passes of this split so far, this one included."""
    predicted_s: tuple[float, ...]
    """Per stage, under the correction factors in force before this pass."""
    measured: tuple[Spread, ...]
    """Per stage, over every pass of this split so far."""
    link_s: tuple[float, ...]
    factors: tuple[float, ...]
    """The correction factors after this pass (pooled measured / profiled, per stage)."""
    next_starts: tuple[int, ...] | None
    """The split the next calibration pass measures; None: refinement is over."""
    adopted_round: int
    """The round whose split is adopted after this decision: what the timed passes run if none follows."""
    reason: str

    @property
    def measured_s(self) -> tuple[float, ...]:
        return tuple(s.median for s in self.measured)

    @property
    def measured_bottleneck(self) -> Spread:
        return bottleneck(self.measured, self.link_s)


@dataclass
class Refiner:
    """Rank 0's side of refinement (the module's rules): `observe` each calibration pass, run `chosen`."""

    table: CostTable
    starts: tuple[int, ...]
    """The split the pass being measured runs."""
    max_rounds: int = 3
    min_gain: float = 0.03
    max_repeats: int = 2
    pass_noise: float = 0.10
    factors: list[float] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    trials: dict[tuple[int, ...], Trial] = field(default_factory=dict)
    adopted: tuple[int, ...] = ()
    challenger: tuple[int, ...] | None = None
    repeats: int = 0

    def __post_init__(self) -> None:
        self.starts = tuple(self.starts)
        self.adopted = self.adopted or self.starts
        self.factors = list(self.factors) or [1.0] * self.table.stages

    def predicted(self, starts: Sequence[int] | None = None) -> Split:
        return evaluate(self.table.corrected(self.factors), self.starts if starts is None else starts)

    def measured(self, starts: tuple[int, ...]) -> Spread:
        """A measured split's bottleneck with its noise."""
        trial = self.trials[starts]
        return bottleneck(trial.stages(self.pass_noise), self.predicted(starts).link_s)

    def observe(self, times: Sequence[Sequence[float]]) -> tuple[int, ...] | None:
        """The current split measured `times[s]` (each microbatch's seconds) on stage s: the split the next
        calibration pass measures, or None when refinement is over."""
        before = self.predicted()
        trial = self.trials.setdefault(self.starts, Trial(self.starts, len(self.rounds) + 1))
        trial.passes.append([list(t) for t in times])
        self._correct()
        nxt, reason = self._decide()
        stages = tuple(trial.stages(self.pass_noise))
        self.rounds.append(Round(self.starts, trial.first_round, len(trial.passes), before.stage_s, stages,
                                 self.predicted().link_s, tuple(self.factors), nxt,
                                 self.trials[self.adopted].first_round, reason))
        if nxt is not None:
            self.starts = nxt
        return nxt

    @property
    def chosen(self) -> tuple[int, ...]:
        """The split the timed passes run: the adopted one."""
        return self.adopted

    @property
    def chosen_round(self) -> int:
        return self.trials[self.adopted].first_round if self.adopted in self.trials else 0

    def _correct(self) -> None:
        """Rule 1: each stage's factor is its pooled measured time over its pooled profiled time."""
        measured = [0.0] * self.table.stages
        profiled = [0.0] * self.table.stages
        for trial in self.trials.values():
            profiled_split = evaluate(self.table, trial.starts)
            base, links = profiled_split.stage_s, profiled_split.link_s
            for s, spread in enumerate(trial.stages(self.pass_noise)):
                link_bound = s < len(links) and links[s] > base[s]
                if spread.median > 0 and base[s] > 0 and not link_bound:
                    measured[s] += spread.median
                    profiled[s] += base[s]
        self.factors = [m / p if p > 0 else f for m, p, f in zip(measured, profiled, self.factors, strict=True)]

    def _name(self, starts: tuple[int, ...]) -> str:
        return f"round {self.trials[starts].first_round}'s split"

    def _decide(self) -> tuple[tuple[int, ...] | None, str]:
        if self.challenger is None:
            return self._next_candidate("")
        held, new = self.measured(self.adopted), self.measured(self.challenger)
        gain = 1.0 - new.median / held.median if held.median > 0 else 0.0
        versus = (f"{self._name(self.challenger)} {ms(new)} against {self._name(self.adopted)} {ms(held)}")
        if gain < self.min_gain:
            self.challenger = None
            return self._next_candidate(f"{versus}: {'slower' if gain < 0 else f'not faster by {self.min_gain:.0%}'}, "
                                        "dropped; ")
        if new.high < held.low:
            self.adopted, self.challenger = self.challenger, None
            return self._next_candidate(f"{versus}: {gain:.1%} faster beyond the noise, adopted; ")
        if self.repeats < self.max_repeats:
            self.repeats += 1
            held_passes, new_passes = (len(self.trials[s].passes) for s in (self.adopted, self.challenger))
            again = self.adopted if held_passes <= new_passes else self.challenger
            return again, f"{versus}: the intervals overlap, measure {self._name(again)} again"
        self.challenger = None
        return None, (f"{versus}: a tie within the noise after {self.repeats} repeat(s); "
                      f"the timed passes run {self._name(self.adopted)}")

    def _next_candidate(self, verdict: str) -> tuple[tuple[int, ...] | None, str]:
        """Rule 2: the split worth a calibration pass next, or None (and why)."""
        keep = f"the timed passes run {self._name(self.adopted)}"
        corrected = self.table.corrected(self.factors)
        now = evaluate(corrected, self.adopted).bottleneck_s
        candidate = balanced_split(corrected)
        if candidate.starts == self.adopted or now <= 0:
            return None, f"{verdict}no other split predicted faster; {keep}"
        gain = 1.0 - candidate.bottleneck_s / now
        if candidate.starts in self.trials:
            return None, f"{verdict}the split predicted best is {self._name(candidate.starts)}, measured; {keep}"
        noise = max(self.min_gain, self.measured(self.adopted).seen)
        if gain <= noise:
            return None, (f"{verdict}the best other split is predicted {gain:.1%} faster, inside the noise "
                          f"({noise:.1%}); {keep}")
        if len(self.trials) >= self.max_rounds:
            return None, f"{verdict}{len(self.trials)} splits measured, the most; {keep}"
        self.challenger = candidate.starts
        return candidate.starts, f"{verdict}try a split predicted {gain:.1%} faster"


def ms(spread: Spread) -> str:
    """ "14.3 ms (13.6-15.0)": a measured figure with its interval."""
    return f"{spread.median * 1000:.1f} ms ({spread.low * 1000:.1f}-{spread.high * 1000:.1f})"

