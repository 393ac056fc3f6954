"""`pictl tune`'s decision: the finalists measured in rounds against one serial reference, and who wins.

Screening (`pictl.jobs.tune`) measures each candidate once; that only chooses the finalists (the kept
candidates screening ranked best, at most `FINALISTS`). They are then measured in rounds. Each round measures
the reference first (the fp32 serial run on the named host at the base's threads and chunk: a run of its own,
never a cached baseline), then every finalist, in the opposite order to the round before (reference, A, B;
reference, B, A; ...), so that drift and other teams' load reach every finalist alike.

The statistics are `pictl.records.compare_stats`' (the sweep's too): a finalist's speedup is its img/s over the
same round's reference, its median and interval over rounds; two configurations are compared by their paired
per-round ratio, "faster" only when that ratio's interval leaves 1 (and the 2 % a figure can vouch for)
behind, else a tie within noise. The reference takes part as one more configuration (`SERIAL`), so a candidate
is compared with the serial run the same way. `decide`: the top by median speedup wins if it is faster than
every other finalist and the serial run; in a tie, the simplest of those tied with it that are faster than the
serial run (`Candidate.simplicity`); none when the serial run itself is among them (it is the simplest of all).
While the top is too close to call with anything, rounds of the reference, the top and those tied with it are
added, up to `max_rounds` (`MAX_ROUNDS` unless the tune says) and while the budget leaves room for a round as long
as the longest so far.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pictl.events import EventSink, Phase
from pictl.jobs.tune_verdicts import Measured, RoundRun
from pictl.planning.options import RunOptions
from pictl.records.compare_stats import Ranking, Rounds, looks_for, more_rounds, rank, ratio_spread, spread

MIN_ROUNDS = 3
"""Rounds every finalist is measured in before anything is decided."""
MAX_ROUNDS = 9
"""Rounds at most by default, where the top stays too close to call (the budget may stop them sooner)."""
FINALISTS = 4
"""Candidates measured in rounds at most, besides the reference."""
SERIAL = "the serial run"
"""The reference's name among the configurations compared."""

T = TypeVar("T")


def round_order(members: Sequence[T], round_no: int) -> list[T]:
    """The order a round measures its members in after the reference: as given in odd rounds, reversed in even
    ones (reference, A, B; reference, B, A), so no member always runs right after the reference."""
    return list(members) if round_no % 2 else list(reversed(members))


def name(m: Measured) -> str:
    return SERIAL if m.reference else m.candidate.label


def rounds_of(reference: Measured, members: Sequence[Measured]) -> Rounds:
    """The rows' rounds as the statistics take them: per round, the reference's img/s, and every member's (the
    reference among them, as `SERIAL`; None where it did not run that round)."""
    count = max((r.round for m in [reference, *members] for r in m.rounds), default=0)
    by_round = {name(m): {r.round: r.ips for r in m.rounds} for m in [reference, *members]}
    found = Rounds()
    for k in range(1, count + 1):
        found.add(by_round[SERIAL].get(k), {n: ips.get(k) for n, ips in by_round.items()})
    return found


def settle(m: Measured, reference: Measured) -> None:
    """`m`'s figures from its rounds: its median img/s, and its median speedup over the same round's reference
    with the interval (None under 2 rounds)."""
    if not m.rounds:
        return
    mine = {r.round: r.ips for r in m.rounds}
    theirs = {r.round: r.ips for r in reference.rounds}
    both = sorted(set(mine) & set(theirs))
    m.throughput_ips = round(spread([r.ips for r in m.rounds]).median, 4)
    ratio = ratio_spread([mine[k] for k in both], [theirs[k] for k in both])
    if ratio is None:
        return
    m.speedup_vs_fp32 = round(ratio.median, 4)
    m.interval = [round(ratio.low, 4), round(ratio.high, 4)] if ratio.low and ratio.high else None


@dataclass(frozen=True)
class Decision:
    winner: Measured | None
    close: list[Measured]
    """Too close to call with the top (the reference among them when it is): what another round measures."""
    lines: list[str]
    """What the decision says, a line each: the top against the rest, then who wins and why."""


def decide(reference: Measured, finalists: Sequence[Measured], base: RunOptions, *,
           max_rounds: int = MAX_ROUNDS) -> Decision:
    """Who wins among the finalists still kept after their rounds. The statistics split their confidence over
    the times the tune may decide (after round 3, and after each round added up to `max_rounds`), so looking
    again does not raise the chance of calling a tie a win. Marks `won` on the winner and each row's `compared`
    (against the row ranked above it; the top's, against the one under it)."""
    for m in [reference, *finalists]:
        m.won = False
        settle(m, reference)
    pool = {name(m): m for m in [reference, *finalists] if m.rounds and (m.kept or m.reference)}
    if SERIAL not in pool or len(pool) < 2:
        return Decision(None, [], ["no candidate was measured in rounds against the serial run: nothing is saved"])
    ranking = rank(rounds_of(reference, [m for m in pool.values() if not m.reference]),
                   looks=looks_for(MIN_ROUNDS, max_rounds))
    order = [e.name for e in ranking.entries]
    for above, below in zip(order, order[1:], strict=False):
        pool[below].compared = ranking.verdict(above, below).text()
    top = ranking.entries[0]
    lines = [ranking.verdict(top.name, other).text() for other in order[1:]]
    pool[top.name].compared = lines[0]
    group = [top.name, *top.tied_with]
    close = [pool[n] for n in group] if _undecided(ranking, top.name, group) else []
    if top.name == SERIAL:
        return Decision(None, close, [*lines, "no candidate beat the serial run: nothing is saved"])
    if SERIAL in group:
        return Decision(None, close, [*lines, f"{top.name} is not faster than the serial run beyond the noise: "
                                              "a tie goes to the simpler, and nothing is saved"])
    beat = [pool[n] for n in group if ranking.verdict(n, SERIAL).outcome == "faster"]
    slow = [f"{n} is not faster than the serial run beyond the noise" for n in group
            if pool[n] not in beat and n != top.name]
    found = min(beat, key=lambda m: (m.candidate.simplicity(base), -(m.speedup_vs_fp32 or 0.0)), default=None)
    if found is None:
        return Decision(None, close, [*lines, "no candidate beat the serial run beyond the noise: nothing is saved"])
    found.won = True
    if len(group) == 1:
        why = f"winner: {found.candidate.label}, faster than every other finalist beyond the noise"
    elif len(beat) == 1:
        why = (f"winner: {found.candidate.label}, tied within noise with {_listed(group, found)}, and the only one "
               "of them faster than the serial run beyond the noise")
    else:
        why = (f"winner: {found.candidate.label}, tied within noise with {_listed(group, found)}, and the simplest "
               "of those faster than the serial run beyond the noise")
    return Decision(found, close, [*lines, *slow, why])


def _listed(group: list[str], found: Measured) -> str:
    others = [n for n in group if n != found.candidate.label]
    return ", ".join(others[:-1]) + (" and " if len(others) > 1 else "") + others[-1]


def _undecided(ranking: Ranking, top: str, group: list[str]) -> bool:
    """The top is too close to call with one of those tied with it: more rounds might tell them apart (an
    equivalence within the 2 % band would not change with more)."""
    return any(ranking.verdict(top, n).outcome == "too close to call" for n in group if n != top)


Measure = Callable[[Measured, int], Awaitable[tuple[str | None, float] | None]]
"""Run one member (or the reference) in round N: its run id and img/s, or None when the run failed."""


@dataclass(frozen=True)
class Budget:
    """The tune's clock: seconds since it started, and how many it may spend (no run starts after)."""

    elapsed: Callable[[], float]
    seconds: float

    def spent(self) -> bool:
        return self.elapsed() > self.seconds


async def interleave(finalists: list[Measured], reference: Measured, base: RunOptions, measure: Measure,
                     budget: Budget, say: EventSink, *, max_rounds: int = MAX_ROUNDS,
                     plan_round: Callable[[int], object] | None = None) -> Decision:
    """The rounds: the reference, then every member in alternating order; `MIN_ROUNDS` of every finalist, then
    rounds of those still too close to call with the top, until `max_rounds` or the budget has no room for a
    round as long as the longest so far. A finalist whose run fails leaves the rounds (and is not kept); a
    reference that fails ends them. `plan_round(runs)`: the runs the next added round will make."""
    members, round_no, longest = list(finalists), 0, 0.0
    decision = decide(reference, finalists, base, max_rounds=max_rounds)
    while members and round_no < max_rounds:
        round_no += 1
        if budget.spent():
            say(Phase("tune", f"budget spent: round {round_no} not started"))
            break
        began = budget.elapsed()
        ref = await measure(reference, round_no)
        if ref is None:
            say(Phase("tune", f"round {round_no}: the reference serial run failed; the rounds stop"))
            break
        reference.rounds.append(RoundRun.of(round_no, ref[0], ref[1], ref[1]))
        for m in round_order(members, round_no):
            if budget.spent():
                say(Phase("tune", f"budget spent in round {round_no}: {m.candidate.label} not measured"))
                break
            got = await measure(m, round_no)
            if got is not None:  # (else `measure` said why and took it out of the kept)
                m.rounds.append(RoundRun.of(round_no, got[0], got[1], ref[1]))
        longest = max(longest, budget.elapsed() - began)
        decision = decide(reference, finalists, base, max_rounds=max_rounds)
        members = [m for m in members if m.kept]
        if round_no < MIN_ROUNDS:
            continue
        contenders = [m for m in decision.close if not m.reference]
        why = more_rounds(rank(rounds_of(reference, contenders), looks=looks_for(MIN_ROUNDS, max_rounds)), round_no,
                          max_rounds=max_rounds,
                          elapsed_s=budget.elapsed(), longest_round_s=longest, budget_s=budget.seconds) \
            if decision.close else None
        if why is None:
            break
        members = contenders
        say(Phase("tune", f"{why}: round {round_no + 1} measures the serial run and "
                          f"{', '.join(m.candidate.label for m in members)}"))
        if plan_round:
            plan_round(1 + len(members))
    return decision
