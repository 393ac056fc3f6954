"""`pictl tune`'s decision: the finalists measured in rounds against one serial reference, and who wins.

Screening (`pictl.jobs.tune`) measures each candidate once; that only chooses the finalists (the kept
candidates screening ranked best, at most `FINALISTS`). They are then measured in rounds. Each round measures
the reference first (the fp32 serial run on the named host at the base's threads and chunk: a run of its own,
never a cached baseline), then every finalist, in the opposite order to the round before (reference, A, B;
reference, B, A; ...), so that drift and other teams' load reach every finalist alike. A finalist's figure in
a round is its img/s over that round's reference; its speedup is the median over its rounds, with an interval.

`decide` ranks by those medians and compares the top with every other finalist and with the reference, pair by
pair over the rounds both were measured in: "faster by X % (interval)" only when the interval of the paired
ratios leaves 1 behind, else a tie within noise. A tie is settled by the simpler configuration
(`Candidate.simplicity`); the serial run is the simplest of all, so a candidate tied with it does not win and
nothing is saved. While the top is tied with anything, rounds of the top and those tied with it are added,
up to `MAX_ROUNDS` and within the budget.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pictl.events import EventSink, Phase
from pictl.jobs.tune_verdicts import Measured, RoundRun
from pictl.planning.options import RunOptions

MIN_ROUNDS = 3
"""Rounds every finalist is measured in before anything is decided (three paired ratios: the least that has
a median between two other values)."""
MAX_ROUNDS = 9
"""Rounds at most, where the top two stay too close to call (the budget may stop them sooner)."""
FINALISTS = 4
"""Candidates measured in rounds at most, besides the reference."""

T = TypeVar("T")


def round_order(members: Sequence[T], round_no: int) -> list[T]:
    """The order a round measures its members in after the reference: as given in odd rounds, reversed in even
    ones (reference, A, B; reference, B, A), so no member always runs right after the reference."""
    return list(members) if round_no % 2 else list(reversed(members))


@dataclass(frozen=True)
class Comparison:
    """`a` against `b` over the rounds both were measured in: the median of a's speedup over b's, its interval,
    and whether the interval separates them."""

    a: Measured
    b: Measured
    median: float | None
    low: float | None
    high: float | None
    rounds: int

    @property
    def faster(self) -> bool:
        """`a` is faster beyond the noise: the whole interval is above 1."""
        return self.low is not None and self.low > 1.0

    @property
    def slower(self) -> bool:
        return self.high is not None and self.high < 1.0

    @property
    def tie(self) -> bool:
        return not (self.faster or self.slower)

    def text(self) -> str:
        a, b = _name(self.a), _name(self.b)
        if self.median is None or self.low is None or self.high is None:
            return f"{a} and {b}: too few rounds to tell ({self.rounds}): a tie within noise"
        span = f"{_pct(self.low)} to {_pct(self.high)}"
        if self.faster:
            return f"{a} is faster than {b} by {abs(self.median - 1) * 100:.0f} % ({span}, {self.rounds} rounds)"
        if self.slower:
            return f"{a} is slower than {b} by {abs(self.median - 1) * 100:.0f} % ({span}, {self.rounds} rounds)"
        return f"{a} and {b}: a tie within noise ({span}, {self.rounds} rounds)"


def _name(m: Measured) -> str:
    return "the serial run" if m.reference else m.candidate.label


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f} %"


def paired(a: Measured, b: Measured) -> list[float]:
    """a's speedup over b's in every round both were measured in (each against that round's reference)."""
    theirs = {r.round: r.speedup for r in b.rounds}
    return [r.speedup / theirs[r.round] for r in a.rounds if theirs.get(r.round)]


def compare(a: Measured, b: Measured) -> Comparison:
    ratios = paired(a, b)
    spread = median_interval(ratios)
    if spread is None:
        return Comparison(a, b, statistics.median(ratios) if ratios else None, None, None, len(ratios))
    return Comparison(a, b, *spread, len(ratios))


def median_interval(values: list[float]) -> tuple[float, float, float] | None:
    """The median of `values` and a distribution-free interval around it (order statistics of the binomial at
    about 90 %: the whole range up to 5 values); None under 2 values."""
    if len(values) < 2:
        return None
    xs = sorted(values)
    n, k = len(xs), 0
    # The largest k with P(Binomial(n, 1/2) < k) <= 5 %: [x_k, x_(n-1-k)] holds the median at >= 90 %.
    while _below(n, k + 1) <= 0.05:
        k += 1
    return statistics.median(xs), xs[k], xs[n - 1 - k]


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) < k)."""
    from math import comb

    return sum(comb(n, i) for i in range(k)) / 2 ** n


def settle(m: Measured) -> None:
    """`m`'s figures from its rounds: the median img/s, the median speedup over the reference and its interval."""
    if not m.rounds:
        return
    m.throughput_ips = round(statistics.median(r.ips for r in m.rounds), 4)
    spread = median_interval([r.speedup for r in m.rounds])
    m.speedup_vs_fp32 = round(spread[0] if spread else m.rounds[0].speedup, 4)
    m.interval = [round(spread[1], 4), round(spread[2], 4)] if spread else None


@dataclass(frozen=True)
class Decision:
    winner: Measured | None
    close: list[Measured]
    """Tied with the top (the reference among them when it is): what another round measures."""
    lines: list[str]
    """What the decision says, a line each: the top against the rest, then why this winner."""


def decide(rows: list[Measured], base: RunOptions) -> Decision:
    """Who wins among the rows measured in rounds (the reference's row among them): the top by median speedup
    if it is faster than everything else beyond the noise, else the simplest of those tied with it that beat
    the reference beyond the noise; none when the reference is among them. Marks `won` and each row's
    `compared` (against the row under it)."""
    pool = sorted((m for m in rows if m.rounds and (m.kept or m.reference)),
                  key=lambda m: -(m.speedup_vs_fp32 or 0.0))
    for m in rows:
        m.won = False
    reference = next((m for m in pool if m.reference), None)
    if not pool or reference is None:
        return Decision(None, [], ["no candidate was measured in rounds against the reference: nothing decided"])
    for above, below in zip(pool, pool[1:], strict=False):
        below.compared = compare(above, below).text()
    top = pool[0]
    versus = [compare(top, m) for m in pool[1:]]
    lines = [c.text() for c in versus]
    if versus:
        top.compared = versus[0].text()
    group = [top, *(c.b for c in versus if c.tie)]
    close = group if len(group) > 1 else []
    if top.reference:
        return Decision(None, close, [*lines, "no candidate beat the serial run: nothing is saved"])
    if reference in group:
        return Decision(None, close, [*lines, f"{top.candidate.label} is not faster than the serial run beyond "
                                              "the noise: the simpler wins a tie, and nothing is saved"])
    beat = [m for m in group if compare(m, reference).faster]
    found = min(beat, key=lambda m: (m.candidate.simplicity(base), -(m.speedup_vs_fp32 or 0.0)), default=None)
    if found is None:
        return Decision(None, close, [*lines, "no candidate beat the serial run beyond the noise: nothing is saved"])
    found.won = True
    if found is top and len(group) == 1:
        why = f"winner: {top.candidate.label}, faster than every other finalist beyond the noise"
    else:
        others = ", ".join(m.candidate.label for m in group if m is not found)
        why = f"winner: {found.candidate.label}, tied within noise with {others}, and the simpler"
    return Decision(found, close, [*lines, why])


Measure = Callable[[Measured, int], Awaitable[tuple[str | None, float] | None]]
"""Run one member (or the reference) in round N: its run id and img/s, or None when the run failed."""


async def interleave(finalists: list[Measured], reference: Measured, base: RunOptions, measure: Measure,
                     spent: Callable[[], bool], say: EventSink,
                     plan_round: Callable[[int], object] | None = None) -> Decision:
    """The rounds: the reference, then every member in alternating order; `MIN_ROUNDS` of every finalist, then
    rounds of those still too close to call, until `MAX_ROUNDS` or the budget. A finalist whose run fails
    leaves the rounds (and is not kept); a reference that fails ends them. `plan_round(runs)`: the runs the
    next added round will make."""
    members, round_no = list(finalists), 0
    decision = decide([reference, *finalists], base)
    while members and round_no < MAX_ROUNDS:
        round_no += 1
        if spent():
            say(Phase("tune", f"budget spent: round {round_no} not started"))
            break
        ref = await measure(reference, round_no)
        if ref is None:
            say(Phase("tune", f"round {round_no}: the reference serial run failed; the rounds stop"))
            break
        reference.rounds.append(RoundRun.of(round_no, ref[0], ref[1], ref[1]))
        for m in round_order(members, round_no):
            if spent():
                say(Phase("tune", f"budget spent in round {round_no}: {m.candidate.label} not measured"))
                break
            got = await measure(m, round_no)
            if got is None:
                continue  # (`measure` said why and took it out of the kept)
            m.rounds.append(RoundRun.of(round_no, got[0], got[1], ref[1]))
        for m in [reference, *finalists]:
            settle(m)
        decision = decide([reference, *finalists], base)
        members = [m for m in members if m.kept]
        if round_no < MIN_ROUNDS:
            continue
        if not decision.close:
            break
        members = [m for m in decision.close if not m.reference]
        if round_no < MAX_ROUNDS and not spent():
            say(Phase("tune", f"too close to call after {round_no} rounds: another round of "
                              f"{', '.join(_name(m) for m in decision.close)}"))
            if plan_round:
                plan_round(1 + len(members))
    return decision
