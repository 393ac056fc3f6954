"""How `pictl tune` runs and records its measurements (`TuneJob`): every one a `pictl run` of its own under the
runs root, a screening run judged once (`pictl.jobs.tune_verdicts.judge`), a round's run against that round's
reference (`pictl.jobs.tune_rounds`), a `[k/n]` line for each as it ends, and `tune.json` rewritten after each.
What the tune may spend and keep is `TuneSettings`; the search that orders the runs is `pictl.jobs.tune`.
Its runs borrow the hosts the tune holds (`hosts`: `pictl.run.hosts.held_hosts`); after a run that failed, a host
whose connection was lost is connected again, or the tune ends there with an error naming it. A host lost mid-run
(`errors.HostLost`) under `on_host_loss = continue` (the default) is left out instead (fail in place,
`TuneJob.without`): its lease is given back, the run it was lost in stands as failed (a finalist that lost one is
no longer kept: a winner runs every round), the runs after it go to the hosts left (a candidate that no longer
fits them is refused; the reference moves to the first of them), and tune.json keeps each loss (`host_lost`). A
loss in the first run hands the lead to the pipeline over the hosts left (`pictl.jobs.tune._search`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as checked_dataclass

from pictl import errors as E
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.jobs.tune_report import TUNE_FILE, TuneMeta, TuneRecord
from pictl.jobs.tune_rounds import FINALISTS, MAX_ROUNDS, MIN_ROUNDS
from pictl.jobs.tune_space import candidates
from pictl.jobs.tune_verdicts import Measured, Versus, judge
from pictl.planning.options import RunOptions
from pictl.run.baselines import BaselineCache
from pictl.run.compare import agreement, max_abs_diff
from pictl.run.context import Handed
from pictl.run.hosts import HeldHosts
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from pictl.text import figure
from remote.floor import protocol as P


@checked_dataclass(config=ConfigDict(strict=True))
class TuneSettings:
    """What a tune may spend and what it keeps, with the bounds `pictl tune` and `pictl.tune` both check."""

    measure: int = Field(default=3, ge=1, le=64)
    """Candidates screened at most (the pipeline-only one and the int8 serial run included; the serial runs
    that measure what threads and chunks gain are not)."""
    budget_s: float = Field(default=1800.0, ge=1.0, allow_inf_nan=False)
    """Seconds: no screening run starts after half of them, no round's run after them."""
    max_rounds: int = Field(default=MAX_ROUNDS, ge=MIN_ROUNDS, le=30)
    """Rounds at most (3 always; more while the top is too close to call): 3 gives a fixed count."""
    allow_loss: bool = False
    min_agreement: float = Field(default=0.99, ge=0.0, le=1.0)
    wait: bool = False
    search_threads: bool = False
    """Try 1, 2, 4 ... threads per rank up to the hosts' cores (False: the base's threads only)."""
    search_chunk: bool = False
    """Try chunks 1, 2, 4, 8 that divide the images (False: the base's chunk only)."""


@dataclass
class Reference:
    """The tune's reference serial run: the first run's fp32 serial run, in the base configuration."""

    logits: bytes | None = None
    serial_ips: float | None = None
    accuracy: float | None = None

    def versus(self, record_dir: Path | None, num_classes: int) -> Versus:
        mine = _logits(record_dir)
        diff = max_abs_diff(mine, self.logits) if mine is not None and self.logits is not None else None
        agreed = agreement(mine, self.logits, num_classes) if mine is not None and self.logits is not None else None
        return Versus(diff, round(agreed[0], 6) if agreed else None, self.serial_ips, self.accuracy)


def _logits(record_dir: Path | None) -> bytes | None:
    """A run's outputs: its pipeline's, or (one rank) its serial run's."""
    for name in (P.LOGITS_FILE_PIPELINE, P.LOGITS_FILE_SERIAL):
        path = record_dir / name if record_dir else None
        if path is not None and path.is_file():
            return path.read_bytes()
    return None


class TuneJob:
    """One tune's state (every row, those that count toward --measure, the reference serial run, tune.json)
    and how it measures a candidate."""

    def __init__(self, cluster: Cluster, base: RunOptions, settings: TuneSettings, out: Path, *,
                 on_event: EventSink | None, cache: BaselineCache | None,
                 on_rows: Callable[[list[Measured]], object] | None,
                 on_session: Callable[[RunSession, Measured], object] | None,
                 write_failed: list[E.RecordWriteFailed] | None, runs_root: Path) -> None:
        self.cluster, self.base, self.settings, self.out, self.cache = cluster, base, settings, out, cache
        self.on_event, self.on_rows, self.on_session, self.write_failed = on_event, on_rows, on_session, write_failed
        self.runs_root = runs_root
        self.say: EventSink = on_event or (lambda _e: None)
        self.started = time.monotonic()
        self.rows = {c: Measured(c) for c in candidates(cluster, base, allow_loss=settings.allow_loss)}
        self.measured: list[Measured] = []
        """The rows that count toward --measure."""
        self.reference = Reference()
        self.first: list[RunSession] = []
        """The first run: its tree's digest and its model file key the profiles it measured."""
        self.progress = Progress(planned=settings.measure + MIN_ROUNDS * (1 + min(FINALISTS, settings.measure)))
        self.round_reference: dict[int, float] = {}
        """Round -> its reference serial run's img/s."""
        self.handed: dict[int, Handed] = {}
        """Round -> its reference serial run as a run of that round takes it instead of a baseline of its own
        (0: screening's, the first run's serial run)."""
        self.hosts: HeldHosts | None = None
        """The hosts the tune holds for all of its runs, once held (`run_tune`)."""
        self.record = TuneRecord(out, TuneMeta(started_at=time.time(), cluster=cluster.source,
                                               options=base.model_dump(), settings=asdict(settings),
                                               runs_root=str(runs_root)))

    @property
    def meta(self) -> TuneMeta:
        return self.record.meta

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def spent(self, share: float = 1.0) -> bool:
        """The budget (or `share` of it: screening's half) is spent: no run starts after it."""
        return self.elapsed() > self.settings.budget_s * share

    def anything_measured(self) -> bool:
        return any(m.status for m in self.rows.values())

    def save(self, status: str, error: BaseException | None = None) -> None:
        """tune.json rewritten; what a write the disk refuses costs depends on what was measured."""
        try:
            self.record.write(status, list(self.rows.values()), error)
        except OSError as exc:
            if error is not None:
                return  # the tune is ending on an error of its own: that one is said, not this one
            if not self.anything_measured():
                raise E.ConfigError(f"the tune directory {self.out}: cannot write {TUNE_FILE} "
                                    f"({exc.strerror or exc}); nothing was measured") from None
            raise E.RecordWriteFailed(f"the tune measured {sum(1 for m in self.rows.values() if m.status)} row(s), "
                                      f"but writing {self.record.path} failed ({exc.strerror or exc})") from None
        if self.on_rows:
            self.on_rows(list(self.rows.values()))

    def session(self, cluster: Cluster, options: RunOptions, m: Measured, *, fresh: bool = False,
                round_no: int | None = None) -> RunSession:
        """A run of the tune (its record under the runs root, noting the tune, round and role). `fresh`: it
        measures its serial run now (a one-rank run's img/s is that run's), never a cached baseline; any other
        is handed its round's reference (screening's: the first run's serial run) to divide by and check its
        outputs against, where that reference stands for its serial run (the same arithmetic: else it has its
        own, and says why)."""
        part_of = {"kind": "tune", "name": self.out.name, "dir": str(self.out), "round": round_no,
                   "role": "reference" if m.reference else "candidate", "configuration": m.candidate.label}
        session = RunSession(cluster, options, on_event=self.on_event, runs_root=self.runs_root,
                             baseline_cache=self.cache, reuse_baseline=not fresh, wait=self.settings.wait,
                             handed=None if fresh else self.handed.get(round_no or 0), part_of=part_of,
                             hosts=self.hosts)
        if self.on_session:
            self.on_session(session, m)
        return session

    async def measure(self, m: Measured, why: str, on: str | None = None, *, counted: bool = True,
                      lead: bool | None = None) -> None:
        """Screen `m` by one run (on the host `on` alone, when given) and judge it; a row of the table counts
        toward --measure, a further machine's serial run and a gain's do not. `lead`: the run whose serial run
        and profiles the tune goes on from (default: the first run; the pipeline over the hosts left when the
        first run lost a host)."""
        settings, label = self.settings, m.candidate.label
        if on is not None and on not in {h.name for h in self.cluster.hosts}:
            m.why = f"not measured: {on} was lost"
            self.say(Phase("tune", f"{label} on {on}: {m.why}"))
            return
        self.say(Phase("tune", f"measuring {label} ({why})"))
        if lead is None:
            lead = not self.anything_measured()  # its serial run is screening's reference: measured now, in this tune
        session = self.session(alone(self.cluster, on) if on else self.cluster, m.candidate.options(self.base), m,
                               fresh=lead)
        self.first[:] = [session] if lead else self.first or [session]
        summary: RunSummary | None
        try:
            summary = await session.run()
        except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
            summary = session.summary
            if lead and isinstance(exc, E.TransportError):  # the hosts cannot be reached: nothing to tune on
                if summary is not None:
                    judge(m, summary, settings.min_agreement, allow_loss=settings.allow_loss)
                raise
            self.say(Phase("tune", f"{label}: {exc}"))
            await self._mended(exc)
        except E.RecordWriteFailed as exc:  # raised, not kept: the run's record could not even be made
            if lead:
                raise E.ConfigError(f"{exc}; nothing was measured") from None
            raise
        except E.ConfigError as exc:
            if lead:  # the first run: the tune's own options are at fault, nothing is measured
                raise
            summary = None  # this shape cannot run here (no split fits, say): the rest can
            self.say(Phase("tune", f"{label} refused: {exc}"))
        except E.Interrupted:
            if session.summary:
                judge(m, session.summary, settings.min_agreement, self._versus(m, session),
                      allow_loss=settings.allow_loss, reference_ips=self.reference.serial_ips)
                self.measured.extend([m] if counted else [])
            raise
        self._kept_write_error(session, label)
        if lead and session.reference is not None:
            self.handed[0] = session.reference
        judge(m, summary, settings.min_agreement, self._versus(m, session) if summary else None,
              allow_loss=settings.allow_loss, reference_ips=self.reference.serial_ips)
        self.measured.extend([m] if counted else [])
        self.save("running")
        self.say(Phase("tune", self.progress.line(label, m.throughput_ips, m.speedup_vs_fp32,
                                                  _outputs(m.status, summary, m.kept, m.why))))

    async def measure_round(self, m: Measured, round_no: int) -> tuple[str | None, float] | None:
        """`m` (or the reference) once more, in round `round_no`: the same configuration and split its screening
        run measured. Its run id and img/s, or None: its run failed or its outputs differed, and a finalist
        that did is no longer kept (a winner must run every time)."""
        c, label = m.candidate, "reference" if m.reference else m.candidate.label
        reference = self.meta.reference
        cluster = alone(self.cluster, reference.host) if m.reference and reference else self.cluster
        session = self.session(cluster, c.options(self.base, m.split_points), m, fresh=c.stages * c.replicas == 1,
                               round_no=round_no)
        summary: RunSummary | None
        failure: str | None = None
        try:
            summary = await session.run()
        except (E.RunFailed, E.OutputMismatch, E.TransportError, E.ConfigError) as exc:
            summary, failure = session.summary, str(exc)
            await self._mended(exc)
        if failure is None and summary is not None and not (summary.status == "ok" and summary.outputs_match):
            failure = "its outputs differed"
        self._kept_write_error(session, label)
        ips = summary.throughput_ips if summary is not None and failure is None else None
        if m.reference and ips and session.reference is not None:
            self.round_reference[round_no], self.handed[round_no] = ips, session.reference
        ref = self.round_reference.get(round_no)
        self.say(Phase("tune", self.progress.line(f"round {round_no}, {label}", ips, ips / ref if ips and ref else None,
                                                  _outputs(summary.status if summary else "failed", summary,
                                                           failure is None, failure or ""))))
        if ips is None:
            if not m.reference:
                m.kept, m.compared = False, f"round {round_no}: {failure or 'its run failed'}"
            self.save("running")
            return None
        self.save("running")
        return (summary.run_id if summary else None), ips

    async def _mended(self, exc: BaseException) -> None:
        """After a run that failed on the hosts (not on its outputs or its options), the held hosts checked: one
        whose connection was lost is connected again, or its error (naming it) ends the tune. A host lost mid-run
        is left out instead, where the tune goes on without it (`without`)."""
        if isinstance(exc, E.HostLost) and self.base.on_host_loss == "continue" and self.hosts is not None:
            await self.without(exc)
        elif self.hosts is not None and isinstance(exc, E.RunFailed | E.TransportError):
            await self.hosts.mend()

    async def without(self, lost: E.HostLost) -> None:
        """Go on without `lost`'s host: its lease given back, the later runs on the hosts left (the reference on
        the first of them where it ran on the lost one), the loss said and kept in tune.json; its error stands
        where no host is left."""
        assert self.hosts is not None
        self.cluster = await self.hosts.without(self.cluster, lost)
        left = self.cluster.hosts
        reference = self.meta.reference
        moved = reference is not None and reference.host == lost.host
        if moved and reference is not None:
            self.meta.reference = reference.model_copy(update={"host": left[0].name})
        line = (f"{lost.host} was lost ({lost.detail or lost}): the runs after it run on "
                f"{', '.join(h.name for h in left)}" + (f", the reference on {left[0].name}" if moved else "")
                + "; a candidate that no longer fits them is refused")
        self.meta.host_lost = [*(self.meta.host_lost or []),
                               {"host": lost.host, "detail": lost.detail or str(lost), "at_run": self.progress.done,
                                "hosts_left": [h.name for h in left], "line": line}]
        self.say(Phase("host-lost", line))
        self.save("running")

    def _kept_write_error(self, session: RunSession, label: str) -> None:
        if session.write_error is not None:  # measured, but its record is incomplete: the tune goes on
            self.say(Phase("tune", f"{label}: {session.write_error}"))
            if self.write_failed is not None and not self.write_failed:
                self.write_failed.append(session.write_error)

    def _versus(self, m: Measured, session: RunSession) -> Versus | None:
        if not m.candidate.changes_arithmetic(self.base):
            return None
        return self.reference.versus(session.record.path if session.record else None, self.base.num_classes)


@dataclass
class Progress:
    """The `[k/n]` of a tune's lines: `n`, the runs planned so far, grows or shrinks as the tune learns how many
    levers, finalists and rounds there are."""

    planned: int
    done: int = 0

    def line(self, label: str, ips: float | None, speedup: float | None, outputs: str) -> str:
        self.done += 1
        self.planned = max(self.planned, self.done)
        return (f"[{self.done}/{self.planned}] {label}: {figure(ips, '.2f')} img/s, "
                f"{figure(speedup, '.2f', 'x')}, {outputs}")


def _outputs(status: str | None, summary: RunSummary | None, kept: bool, why: str) -> str:
    """What a run's outputs were against the serial run, in a few words for its progress line."""
    if summary is None or status != "ok":
        return "failed"
    if summary.agreement is not None:
        return f"agreement {summary.agreement:.3f}" + ("" if kept else f" ({why})")
    return "outputs identical" if summary.outputs_match and kept else f"not kept ({why})"


def alone(cluster: Cluster, host: str) -> Cluster:
    """The inventory with one host left: where a serial run measures what a lever gains on its machine."""
    return cluster.model_copy(update={"hosts": tuple(h for h in cluster.hosts if h.name == host)})
