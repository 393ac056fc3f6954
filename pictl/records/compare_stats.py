"""Comparing configurations measured in interleaved rounds: a figure's spread, and a winner only beyond the noise.

Who uses it: `pictl sweep` (its rows and ranking), `pictl tune` (its winner), `pictl runs compare` (two runs of
one sweep) and the dashboard. No torch, no numpy: a handful of rounds needs neither.

The measurements are rounds (`Rounds`). In each round the serial reference and every candidate ran once, one
after another, so that what slows the machine in that minute (other teams' work, a busy core, heat) slows them
alike. A round's figures are therefore compared only with the same round's: a candidate's speedup in round k is
its img/s over the reference's img/s in round k, and candidate A against candidate B is A's img/s over B's in
round k. Nothing is divided by a figure from another minute.

A figure over rounds (`Spread`): the median of its per-round values, the range over rounds, and an interval for
its typical value: the `FIGURE_CONFIDENCE` (95 %) Student-t interval of the mean of the values' logarithms (a
geometric interval: ratios scatter by factors, not by amounts). With 3 rounds that interval is wide
(t = 4.30); it narrows as rounds are added, as it should.

A verdict between two candidates (`compare`): A is faster than B when the interval of the paired per-round
ratio A/B lies above 1 and its median above 1 + `MIN_EFFECT`; slower likewise; otherwise a tie. The paired
ratio is what "the intervals separate" means here: each candidate's own interval against the reference still
carries the reference's noise, which pairing A with B in the same round cancels (the rows' intervals may
overlap while the paired one does not, and the verdict says so). The decision is stricter than a row's
interval: `DECISION_CONFIDENCE` (99 %), split evenly (Bonferroni) over the looks that adding rounds takes
(`looks`), so that looking again after every added round does not raise the rate at which two configurations
that are really the same are called different: at most 1 in 100, looks included (checked by simulation in
tests/unit/test_compare_stats.py). A difference under `MIN_EFFECT` (2 %) is never a winner: pictl's own figures
agree with a plain-torch reference to about that (docs/benchmarks.md), so less is not a difference it can vouch
for (as pyperf's compare_to --min-speed). A tie is "equivalent" when the whole interval lies within that band,
and "too close to call" otherwise: more rounds might decide it.

Why this and not another rule, for 3 to 10 rounds:
- pyperf (`is_significant`) runs a two-sample Student t-test at 95 % on its values and calls the rest "not
  significant"; hyperfine prints mean +- sd and leaves significance to a Welch t-test script. Both take many
  values from a quiet machine. Here a round costs minutes and the machine is shared, so the rounds are few and
  paired: the t-interval is taken over the paired log-ratios (a paired t-test), which removes the between-round
  drift the unpaired tests would count as noise.
- Rank-based intervals (a sign test, order statistics of the median) are distribution-free but cannot reach
  95 % below 6 rounds (with 3 rounds, all three agreeing in sign happens 1 time in 4 by chance); a bootstrap of
  3 values has 10 distinct resamples. The t quantile's width for few rounds is the honest price instead.
- A t-test assumes roughly normal log-ratios. Load switched on and off makes them lumpy, which widens the
  interval (a round hit by load inflates the spread more than it moves the mean): the rule then says "too close
  to call" and adds rounds, rather than calling a winner.

How long to measure (`more_rounds`): pyperf fixes its processes and values up front and calibrates loops to a
time; hyperfine runs at least 10 runs and 3 seconds. A comparison here measures `rounds` rounds (3 by default),
then adds one round at a time while two configurations next to each other in the ranking are too close to call,
until `max_rounds` or the time budget (a further round is started only if the budget leaves room for a round as
long as the longest so far). Two configurations that are really the same stay "too close to call" (no finite
number of rounds proves them exactly equal), so a comparison of ties runs to its limit: give `max_rounds` equal
to `rounds` for a fixed count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

__all__ = ["DECISION_CONFIDENCE", "FIGURE_CONFIDENCE", "MIN_EFFECT", "Ranked", "Ranking", "Rounds", "Spread",
           "Verdict", "compare", "looks_for", "more_rounds", "rank", "ratio_spread", "spread", "t_quantile"]

FIGURE_CONFIDENCE = 0.95
"""The interval a figure over rounds carries (a row's img/s, its speedup over the reference)."""
DECISION_CONFIDENCE = 0.99
"""How sure a verdict is before it names a winner, over all its looks together."""
MIN_EFFECT = 0.02
"""A paired median ratio within 2 % of 1 is never a winner, however narrow its interval."""
WIDE = 100.0
"""An interval whose ends are further apart than this factor is said to be that wide, not written out."""


# -- Student's t, exactly, for whole degrees of freedom (Abramowitz & Stegun 26.7.3-4) ------------------------

def _t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom (a finite series in cos(theta))."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 1:
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return (2 / math.pi) * (theta + (s * math.cos(theta) * total if df > 1 else 0.0))
    term = total = 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return s * total


@lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """The t such that P(|T| <= t) = `confidence` (a two-sided interval's multiplier), for `df` >= 1."""
    if not 0 < confidence < 1 or df < 1:
        raise ValueError(f"t_quantile: confidence in (0, 1) and df >= 1 (got {confidence}, {df})")
    low, high = 0.0, 1.0
    while _t_within(high, df) < confidence:
        high *= 2
    for _ in range(200):  # bisection: the series is monotone in t
        mid = (low + high) / 2
        low, high = (mid, high) if _t_within(mid, df) < confidence else (low, mid)
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


# -- one figure over rounds ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """A figure measured once per round: its median, its interval, and the range of what the rounds measured."""

    median: float
    low: float | None
    """The interval of its typical value (geometric mean) at `confidence`; None with fewer than 2 rounds."""
    high: float | None
    least: float
    most: float
    rounds: int
    confidence: float

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    def overlaps(self, other: Spread) -> bool:
        """Whether the two intervals share a value (unknown intervals overlap everything)."""
        if self.low is None or self.high is None or other.low is None or other.high is None:
            return True
        return self.low <= other.high and other.low <= self.high

    def to_json(self, digits: int = 4) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, digits)  # noqa: E731
        return {"median": r(self.median), "low": r(self.low), "high": r(self.high), "least": r(self.least),
                "most": r(self.most), "rounds": self.rounds, "confidence": self.confidence}

    def text(self, spec: str = ".2f", unit: str = "") -> str:
        """`1.84x (1.71-1.98)`: the median and the interval (the range when there is no interval yet)."""
        low, high = (self.low, self.high) if self.known else (self.least, self.most)
        return f"{self.median:{spec}}{unit} ({low:{spec}}-{high:{spec}})"


def spread(values: Sequence[float], *, confidence: float = FIGURE_CONFIDENCE) -> Spread:
    """`values` (positive, one per round) as a Spread: median, t-interval of their geometric mean, range."""
    vals = [float(v) for v in values]
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):
        raise ValueError(f"spread: needs positive finite values, one per round (got {vals})")
    logs = [math.log(v) for v in vals]
    low = high = None
    if len(vals) >= 2:
        mean, sd = statistics.fmean(logs), statistics.stdev(logs)
        half = t_quantile(confidence, len(vals) - 1) * sd / math.sqrt(len(vals))
        low, high = math.exp(mean - half), math.exp(mean + half)
    return Spread(statistics.median(vals), low, high, min(vals), max(vals), len(vals), confidence)


def ratio_spread(numerators: Sequence[float | None], denominators: Sequence[float | None], *,
                 confidence: float = FIGURE_CONFIDENCE) -> Spread | None:
    """The per-round ratio numerator/denominator (rounds where either is missing left out) as a Spread; None
    when no round has both."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True)
              if n is not None and d is not None and n > 0 and d > 0]
    return spread(ratios, confidence=confidence) if ratios else None


# -- two candidates --------------------------------------------------------------------------------------------

Outcome = Literal["faster", "slower", "equivalent", "too close to call"]


@dataclass(frozen=True)
class Verdict:
    """A against B over their paired rounds: `outcome` is A's ("faster": A is faster than B)."""

    a: str
    b: str
    outcome: Outcome
    ratio: Spread | None
    """A's img/s over B's, round by round, its interval at the decision's per-look level (None: no paired round)."""
    min_effect: float = MIN_EFFECT

    @property
    def tie(self) -> bool:
        return self.outcome in ("equivalent", "too close to call")

    @property
    def winner(self) -> str | None:
        return self.a if self.outcome == "faster" else self.b if self.outcome == "slower" else None

    def text(self) -> str:
        """`A is faster than B by 12.3 % (interval 5.1-19.9 %, 5 rounds)`, or `A and B: a tie within noise (...)`."""
        r = self.ratio
        if r is None:
            return f"{self.a} and {self.b}: no round measured both"
        rounds = f"{r.rounds} round{'s' if r.rounds != 1 else ''}"
        if self.outcome in ("faster", "slower"):
            fast, slow = (self.a, self.b) if self.outcome == "faster" else (self.b, self.a)
            flip = (lambda v: v) if self.outcome == "faster" else (lambda v: 1 / v)
            lo, hi = sorted((flip(r.low or r.least), flip(r.high or r.most)))
            return (f"{fast} is faster than {slow} by {(flip(r.median) - 1) * 100:.1f} % "
                    f"(interval {(lo - 1) * 100:.1f}-{(hi - 1) * 100:.1f} %, {rounds})")
        if r.low is None or r.high is None:
            spread = ""
        elif r.high / r.low > WIDE:  # (t with 1 degree of freedom at 99 %: 63.7; the bounds would read 0.000-26465)
            spread = f", interval wider than {WIDE:.0f}x"
        else:
            spread = f", interval {r.low:.3f}-{r.high:.3f}"
        between = f"{self.a}/{self.b} {r.median:.3f}{spread}"
        why = f"equivalent within {self.min_effect:.0%}" if self.outcome == "equivalent" else "too close to call"
        return f"{self.a} and {self.b}: a tie within noise ({why}; {between}, {rounds})"

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "outcome": self.outcome, "winner": self.winner,
                "ratio": self.ratio.to_json() if self.ratio else None, "text": self.text()}


def compare(a: str, a_ips: Sequence[float | None], b: str, b_ips: Sequence[float | None], *,
            confidence: float = DECISION_CONFIDENCE, looks: int = 1, min_effect: float = MIN_EFFECT) -> Verdict:
    """A against B from their img/s in the same rounds (None: that round's run failed, the round is left out).
    `looks`: how many times the caller may decide as rounds are added (the confidence is split over them)."""
    per_look = 1 - (1 - confidence) / max(1, looks)
    ratio = ratio_spread(a_ips, b_ips, confidence=per_look)
    if ratio is None or not ratio.known:
        return Verdict(a, b, "too close to call", ratio, min_effect)
    assert ratio.low is not None and ratio.high is not None
    band = 1 + min_effect
    if ratio.low > 1 and ratio.median > band:
        outcome: Outcome = "faster"
    elif ratio.high < 1 and ratio.median < 1 / band:
        outcome = "slower"
    elif ratio.low >= 1 / band and ratio.high <= band:
        outcome = "equivalent"
    else:
        outcome = "too close to call"
    return Verdict(a, b, outcome, ratio, min_effect)


# -- many candidates against one reference ---------------------------------------------------------------------

@dataclass
class Rounds:
    """What a comparison measured: per round, the reference's img/s and each candidate's (None: that round's run
    failed or has not run). Every list has one entry per round, in round order."""

    reference: list[float | None] = field(default_factory=list)
    candidates: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.reference)

    def add(self, reference: float | None, candidates: Mapping[str, float | None]) -> None:
        """One round's figures (a candidate missing from `candidates` did not run in it)."""
        self.reference.append(reference)
        for name in {*self.candidates, *candidates}:
            self.candidates.setdefault(name, [None] * (self.count - 1)).append(candidates.get(name))


@dataclass(frozen=True)
class Ranked:
    """One candidate in the ranking."""

    name: str
    place: int
    """1 + how many candidates are decidedly faster than it: candidates that tie share a place."""
    throughput: Spread | None
    speedup: Spread | None
    """Its img/s over the same round's reference."""
    tied_with: tuple[str, ...]
    """The candidates it could not be told apart from."""


@dataclass(frozen=True)
class Ranking:
    """Candidates fastest first (by median speedup over the reference, else median img/s) and every verdict."""

    entries: list[Ranked]
    verdicts: dict[tuple[str, str], Verdict]
    reference: Spread | None
    """The reference's own img/s over the rounds."""

    def verdict(self, a: str, b: str) -> Verdict:
        found = self.verdicts.get((a, b))
        if found is not None:
            return found
        v = self.verdicts[(b, a)]
        flipped: Outcome = {"faster": "slower", "slower": "faster"}.get(v.outcome, v.outcome)  # type: ignore[assignment]
        ratio = v.ratio
        if ratio is not None:
            inv = lambda x: None if x is None else 1 / x  # noqa: E731
            ratio = Spread(1 / ratio.median, inv(ratio.high), inv(ratio.low), 1 / ratio.most, 1 / ratio.least,
                           ratio.rounds, ratio.confidence)
        return Verdict(a, b, flipped, ratio, v.min_effect)

    @property
    def winners(self) -> list[str]:
        """The candidates no other is decidedly faster than (several: a tie at the top)."""
        return [e.name for e in self.entries if e.place == 1]

    def undecided(self) -> list[Verdict]:
        """Neighbours in the ranking that are too close to call (what more rounds might decide); a pair never
        measured in one round together (one of them failed every time) is not: more rounds would not help."""
        names = [e.name for e in self.entries]
        return [v for a, b in zip(names, names[1:], strict=False)
                if (v := self.verdict(a, b)).outcome == "too close to call" and v.ratio is not None]


def rank(rounds: Rounds, *, confidence: float = DECISION_CONFIDENCE, looks: int = 1,
         min_effect: float = MIN_EFFECT) -> Ranking:
    """Every candidate's spread and place, and a verdict for every pair (`compare`)."""
    figures = {name: (spread([v for v in ips if v is not None]) if any(v is not None for v in ips) else None,
                      ratio_spread(ips, rounds.reference))
               for name, ips in rounds.candidates.items()}

    def fastest_first(name: str) -> tuple[float, float]:
        throughput, speedup = figures[name]
        return (-(speedup.median if speedup else 0.0), -(throughput.median if throughput else 0.0))

    order = sorted(figures, key=fastest_first)
    verdicts = {(a, b): compare(a, rounds.candidates[a], b, rounds.candidates[b], confidence=confidence,
                                looks=looks, min_effect=min_effect)
                for i, a in enumerate(order) for b in order[i + 1:]}

    def beaten_by(name: str) -> list[str]:
        return [o for o in order if o != name and _outcome(verdicts, o, name) == "faster"]

    def tied_with(name: str) -> tuple[str, ...]:  # (a pair never measured together is no tie: nothing compared)
        return tuple(o for o in order if o != name and _paired(verdicts, o, name)
                     and _outcome(verdicts, o, name) in ("equivalent", "too close to call"))

    entries = [Ranked(n, 1 + len(beaten_by(n)), figures[n][0], figures[n][1], tied_with(n)) for n in order]
    present = [v for v in rounds.reference if v is not None]
    return Ranking(entries, verdicts, spread(present) if present else None)


def _paired(verdicts: dict[tuple[str, str], Verdict], a: str, b: str) -> bool:
    """Whether A and B were measured in one round together at least once."""
    return (verdicts.get((a, b)) or verdicts[(b, a)]).ratio is not None


def _outcome(verdicts: dict[tuple[str, str], Verdict], a: str, b: str) -> Outcome:
    """A's outcome against B, whichever way round the pair was judged."""
    if (a, b) in verdicts:
        return verdicts[(a, b)].outcome
    back = verdicts[(b, a)].outcome
    return "slower" if back == "faster" else "faster" if back == "slower" else back


def more_rounds(ranking: Ranking, done: int, *, max_rounds: int, elapsed_s: float = 0.0,
                longest_round_s: float = 0.0, budget_s: float | None = None) -> str | None:
    """Why one more round should run (the neighbours still too close to call), or None: decided, at
    `max_rounds`, or the budget has no room for a round as long as the longest so far."""
    undecided = ranking.undecided()
    if not undecided or done >= max_rounds:
        return None
    if budget_s is not None and elapsed_s + longest_round_s > budget_s:
        return None
    pairs = "; ".join(f"{v.a} and {v.b}" for v in undecided)
    return f"too close to call after {done} round(s): {pairs}"


def looks_for(rounds: int, max_rounds: int) -> int:
    """How many times a comparison of `rounds` rounds, added up to `max_rounds`, may decide."""
    return max(1, max_rounds - rounds + 1)
