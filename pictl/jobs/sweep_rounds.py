"""A sweep's measurements: every configuration against one serial reference, in interleaved rounds.

Each round measures the reference first (a serial run measured now, never a cached baseline: one named host,
the sweep's protocol and numerics) and then every configuration, in the order given in odd rounds and reversed
in even ones (reference, A, B; reference, B, A; ...), so that drift and other teams' load reach every
configuration alike. Each configuration's run is handed the round's reference as its serial baseline
(`RunSession(handed=...)`): its speedup divides by it and its outputs are checked against it, with no serial
run of its own. A configuration the reference cannot stand for (another chunk: other batches) measures or
reuses its own serial run for its outputs, and its speedup in the sweep's table is still over the round's
reference. A one-rank configuration (the serial run at another chunk) is measured anew every round.

After `rounds` rounds, one more is added while configurations next to each other in the ranking are too close
to call (`pictl.records.compare_stats.more_rounds`): the reference and those configurations only, until
`max_rounds` or the budget. Every run is a run of its own under the runs root, its summary naming the sweep
(`part_of`), and says a `[k/n]` line as it ends. The runs borrow the hosts the sweep holds (`hosts`:
`pictl.run.hosts.held_hosts`); after a run that failed, a host whose connection was lost is connected again, or
the sweep ends there with an error naming it.

A host lost mid-run (`errors.HostLost`: a rank that died without a word, a link gone) under `on_host_loss =
continue` (the default) is left out of the rest of the sweep instead (fail in place): its lease is given back,
every configuration is placed again on the hosts left (the reference on the first of them), the run it was lost in
is measured again there at once, in its round, and a configuration that no longer fits runs no more. Each such
loss is kept (`SweepHostLoss`) and said under the table. A configuration's rounds before and after a loss ran on
different hosts; each still divides by its own round's reference, measured on the same hosts as it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.events import EventSink, Phase
from pictl.figure_text import ips_text, speedup_text
from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages, sharing_hosts
from pictl.records.compare_stats import Ranking, Rounds, looks_for, more_rounds, rank
from pictl.run.baselines import BaselineCache
from pictl.run.context import Handed
from pictl.run.hosts import HeldHosts
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from pictl.validation import got

REFERENCE = "reference"
"""The reference's key among a round's runs."""


@dataclass(frozen=True)
class Entry:
    """One configuration of the comparison (or its reference)."""

    label: str
    options: RunOptions
    cluster: Cluster
    """The hosts its runs may use (the reference's: its one host)."""
    slots: int | None = None
    """Stages a host may take where they do not fit the inventory's slots (`sharing_hosts`)."""

    @property
    def one_rank(self) -> bool:
        return self.options.ranks == 1

    def on(self, cluster: Cluster) -> Entry:
        """The same configuration on `cluster` (the hosts a lost one left); ConfigError where it does not fit."""
        if self.label == REFERENCE:
            return dataclasses.replace(self, cluster=cluster.model_copy(update={"hosts": cluster.hosts[:1]}))
        hosts = sharing_hosts(cluster, self.options.stages, self.slots)
        place_stages(hosts, self.options.ranks)
        return dataclasses.replace(self, cluster=hosts)


@dataclass(frozen=True)
class SweepHostLoss:
    """A host the sweep lost, and what it did about it."""

    round: int
    host: str
    detail: str
    lost_in: str
    """The configuration (or the reference) whose run lost it: measured again on the hosts left, in the round."""
    run_id: str | None
    """That run's id (left out of the rounds: its passes ran on the hosts before)."""
    hosts_left: list[str]
    reference_host: str
    """Where the reference's serial run goes from then on."""
    retired: dict[str, str]
    """Configurations that no longer fit the hosts left, and why: they run no more."""

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "line": self.line()}

    def line(self) -> str:
        text = (f"{self.host} was lost in round {self.round} ({self.detail}): the runs after it ran on "
                f"{', '.join(self.hosts_left)}, the reference on {self.reference_host}; {self.lost_in}'s run was "
                f"measured again there")
        return text + "".join(f"; {label} ran no more ({why})" for label, why in self.retired.items())


@dataclass
class RoundRun:
    """One run of a round: its id, its img/s (None: it failed, or its outputs differed) and its summary."""

    round: int
    run_id: str | None
    ips: float | None
    summary: RunSummary | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"round": self.round, "run_id": self.run_id, "ips": self.ips, "error": self.error}


@dataclass
class Measurements:
    """What the rounds measured so far: per round, the reference's run and each configuration's."""

    labels: list[str]
    reference: list[RoundRun] = field(default_factory=list)
    runs: dict[str, list[RoundRun]] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)
    """Each round's order after the reference."""
    added: list[str] = field(default_factory=list)
    """Why each round past the first `rounds` was added."""
    losses: list[SweepHostLoss] = field(default_factory=list)
    """The hosts lost mid-run, in order (the sweep went on without each)."""

    def rounds(self, aliases: dict[str, str] | None = None) -> Rounds:
        """As the statistics take them; `aliases` (label -> REFERENCE): a configuration that is the reference
        itself takes the reference's figures."""
        found = Rounds()
        for k, ref in enumerate(self.reference, start=1):
            ips = {label: next((r.ips for r in self.runs.get(label, []) if r.round == k), None)
                   for label in self.labels}
            for label, same in (aliases or {}).items():
                ips[label] = ref.ips if same == REFERENCE else ips[label]
            found.add(ref.ips, ips)
        return found

    def to_json(self) -> dict[str, Any]:
        return {"rounds": [{"round": k, "order": order, "reference": ref.to_json(),
                            "runs": {label: run.to_json() for label in order
                                     for run in self.runs.get(label, []) if run.round == k}}
                           for k, (ref, order) in enumerate(zip(self.reference, self.order, strict=True), start=1)],
                "added": self.added, "host_lost": [loss.to_json() for loss in self.losses]}


ROUNDS, MAX_ROUNDS, MOST_ROUNDS = 3, 6, 20
"""Rounds by default, at most by default while too close to call, and at most that may be asked for."""


@dataclass(frozen=True)
class RoundsPlan:
    """How long the comparison measures: `rounds` rounds, then added ones up to `max_rounds` while neighbours
    are too close to call, none started once `budget_s` (seconds since the first round began) would be passed
    by a round as long as the longest so far."""

    rounds: int = ROUNDS
    max_rounds: int = MAX_ROUNDS
    budget_s: float | None = None

    @property
    def looks(self) -> int:
        return looks_for(self.rounds, self.max_rounds)


def rounds_plan(rounds: Any = None, max_rounds: Any = None, budget_s: Any = None, *,
                names: tuple[str, str, str] = ("--rounds", "--max-rounds", "--budget")) -> RoundsPlan:
    """The plan from a command line's or the API's values (None: the default), each checked; ConfigError names
    the value as `names` spell it."""
    def whole(value: Any, name: str, least: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MOST_ROUNDS:
            raise E.ConfigError(f"{name}: must be a whole number between {least} and {MOST_ROUNDS} (got {got(value)})")
        return value

    first = whole(ROUNDS if rounds is None else rounds, names[0], 1)
    most = whole(max(first, MAX_ROUNDS) if max_rounds is None else max_rounds, names[1], first)
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, int | float)
                                 or not 0 < budget_s < float("inf")):
        raise E.ConfigError(f"{names[2]}: must be a number of seconds above 0 (got {got(budget_s)})")
    return RoundsPlan(first, most, None if budget_s is None else float(budget_s))


class SweepRounds:
    """Measures a sweep's configurations in rounds against its reference (`run`)."""

    def __init__(self, reference: Entry, entries: list[Entry], plan: RoundsPlan, *, sweep_dir: Path,
                 runs_root: Path, on_event: EventSink | None = None, cache: BaselineCache | None = None,
                 wait: bool = False, aliases: dict[str, str] | None = None,
                 on_session: Callable[[RunSession, int, int], object] | None = None,
                 on_round: Callable[[Measurements], object] | None = None,
                 write_failed: list[E.RecordWriteFailed] | None = None, hosts: HeldHosts | None = None,
                 cluster: Cluster | None = None) -> None:
        self.reference, self.entries, self.plan, self.hosts = reference, entries, plan, hosts
        self.cluster = cluster
        """Every host the sweep may still use (None: a lost host ends the sweep, as under `--on-host-loss fail`)."""
        self.sweep_dir, self.runs_root, self.cache, self.wait = sweep_dir, runs_root, cache, wait
        self.aliases = aliases or {}
        """Configurations that are the reference itself (the sweep's serial point at its chunk): never run twice."""
        self.say: EventSink = on_event or (lambda _e: None)
        self.on_event, self.on_session, self.on_round, self.write_failed = on_event, on_session, on_round, write_failed
        self.measured = Measurements([e.label for e in entries])
        self.done = 0
        self.planned = plan.rounds * (1 + len(self.measured_entries))

    @property
    def retired(self) -> set[str]:
        """Configurations that no longer fit the hosts a lost one left."""
        return {label for loss in self.measured.losses for label in loss.retired}

    @property
    def measured_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.label not in self.aliases and e.label not in self.retired]

    def ranking(self) -> Ranking:
        return rank(self.measured.rounds(self.aliases), looks=self.plan.looks)

    async def run(self) -> Measurements:
        """Every round; an interrupted comparison raises with what it measured in `measured`."""
        started, longest = time.monotonic(), 0.0
        members = self.measured_entries
        round_no = 0
        while members:
            round_no += 1
            began = time.monotonic()
            await self._round(round_no, members)
            longest = max(longest, time.monotonic() - began)
            if not self.measured_entries:  # (every configuration retired: a lost host left none room)
                break
            if round_no < self.plan.rounds:
                continue
            ranking = self.ranking()
            why = more_rounds(ranking, round_no, max_rounds=self.plan.max_rounds,
                              elapsed_s=time.monotonic() - started, longest_round_s=longest,
                              budget_s=self.plan.budget_s)
            if why is None:
                break
            close = {name for v in ranking.undecided() for name in (v.a, v.b)}
            members = [e for e in self.measured_entries if e.label in close]
            if not members:
                break
            self.measured.added.append(why)
            self.planned = max(self.planned, self.done) + 1 + len(members)
            self.say(Phase("sweep", f"{why}: round {round_no + 1} measures the reference and "
                                    f"{', '.join(e.label for e in members)}"))
        return self.measured

    async def _round(self, round_no: int, members: list[Entry]) -> None:
        order = [e.label for e in (members if round_no % 2 else list(reversed(members)))]
        self.measured.order.append(order)
        ref_run, handed = await self._taken(self.reference, round_no, None)
        self.measured.reference.append(ref_run)
        for label in order:
            entry = next((e for e in self.entries if e.label == label), None)
            if entry is None or label in self.retired:  # (a host lost earlier in this round left it no room)
                continue
            run, _ = await self._taken(entry, round_no, handed, ref_run.ips)
            self.measured.runs.setdefault(label, []).append(run)
        if self.on_round:
            self.on_round(self.measured)

    async def _taken(self, entry: Entry, round_no: int, handed: Handed | None,
                     reference_ips: float | None = None) -> tuple[RoundRun, Handed | None]:
        """`entry`'s run of the round; one that lost a host is measured again on the hosts left (`_without`),
        where it still fits, else it stands as failed."""
        while True:
            run, handed_on, lost = await self._measure(entry, round_no, handed, reference_ips)
            if lost is None or self.cluster is None or self.hosts is None or entry.options.on_host_loss == "fail":
                await self._mended(run)
                return run, handed_on
            await self._without(lost, round_no, entry, run)
            again = self.reference if entry.label == REFERENCE else next(
                (e for e in self.entries if e.label == entry.label and e.label not in self.retired), None)
            if again is None:
                return run, handed_on
            entry = again

    async def _without(self, lost: E.HostLost, round_no: int, entry: Entry, run: RoundRun) -> None:
        """Go on without `lost`'s host: its lease given back, every configuration placed on the hosts left (the
        reference on the first), those that no longer fit retired; the run's error stands where nothing is left."""
        assert self.cluster is not None and self.hosts is not None
        self.cluster = await self.hosts.without(self.cluster, lost)
        left = self.cluster.hosts
        retired: dict[str, str] = {}
        moved = []
        for e in self.entries:
            if e.label in self.retired:
                moved.append(e)
                continue
            try:
                moved.append(e.on(self.cluster))
            except E.ConfigError as exc:
                retired[e.label] = str(exc)
                moved.append(e)
        self.entries, self.reference = moved, self.reference.on(self.cluster)
        loss = SweepHostLoss(round_no, lost.host, lost.detail or str(lost), entry.label, run.run_id,
                             [h.name for h in left], left[0].name, retired)
        self.measured.losses.append(loss)
        self.say(Phase("host-lost", loss.line()))

    async def _measure(self, entry: Entry, round_no: int, handed: Handed | None,
                       reference_ips: float | None = None) -> tuple[RoundRun, Handed | None, E.HostLost | None]:
        """One run of `entry` in round `round_no`; the reference's also returns what it hands the others, and a run
        that lost a host its loss."""
        is_reference = entry is self.reference
        part_of = {"kind": "sweep", "name": self.sweep_dir.name, "dir": str(self.sweep_dir.absolute()),
                   "round": round_no, "role": REFERENCE if is_reference else "candidate",
                   "configuration": entry.label}
        session = RunSession(entry.cluster, entry.options, on_event=self.on_event, runs_root=self.runs_root,
                             baseline_cache=self.cache, wait=self.wait, reuse_baseline=not entry.one_rank,
                             handed=None if entry.one_rank else handed, part_of=part_of, hosts=self.hosts)
        if self.on_session:
            self.on_session(session, self.done, self.planned)
        error: str | None = None
        lost: E.HostLost | None = None
        try:
            summary: RunSummary | None = await session.run()
        except E.HostLost as exc:  # (a run of a comparison never continues itself: `run.continuation`)
            summary, error, lost = session.summary, str(exc), exc
        except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
            # One failed run does not lose the others; the round leaves it out, and its row says why.
            summary, error = session.summary, str(exc)
        except E.Interrupted:
            run = RoundRun(round_no, session.run_id if session.record else None, None, session.summary,
                           "interrupted")
            (self.measured.reference if is_reference else self.measured.runs.setdefault(entry.label, [])).append(run)
            raise
        if session.write_error is not None and self.write_failed is not None and not self.write_failed:
            self.write_failed.append(session.write_error)
        if error is None and (summary is None or summary.status != "ok"):
            error = summary.error.message if summary is not None and summary.error else "the run did not finish"
        ips = summary.throughput_ips if error is None and summary is not None else None
        run = RoundRun(round_no, summary.run_id if summary else None, ips, summary, error)
        self.done += 1
        self.planned = max(self.planned, self.done)
        speedup = 1.0 if is_reference and ips else ips / reference_ips if ips and reference_ips else None
        self.say(Phase("sweep", f"[{self.done}/{self.planned}] round {round_no}, "
                                f"{_named(entry, is_reference)}: {ips_text(ips)} img/s, "
                                f"{speedup_text(speedup)}, {_outputs(summary, error)}"))
        return run, (session.reference if is_reference and ips else None), lost

    async def _mended(self, run: RoundRun) -> None:
        """After a run that failed, the held hosts checked: one whose connection was lost is connected again, or
        its error (naming it) ends the sweep, with what the rounds measured kept."""
        if run.error is not None and self.hosts is not None:
            await self.hosts.mend()


def _named(entry: Entry, is_reference: bool) -> str:
    return f"the reference (serial on {entry.cluster.hosts[0].name})" if is_reference else entry.label


def _outputs(summary: RunSummary | None, error: str | None) -> str:
    """A run's outputs against the serial run, in a few words for its progress line."""
    if error is not None or summary is None:
        return f"failed: {error}" if error else "failed"
    if summary.stages == 1 and summary.replicas == 1:
        return "serial"
    if summary.agreement is not None:
        return f"agreement {summary.agreement:.3f}"
    return "outputs identical" if summary.outputs_match else "outputs differ"
