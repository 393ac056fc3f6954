"""`pictl tune`: the fastest configuration the cluster allows, exact first, and past N times where the user
accepts a bounded loss.

The search space (`pictl.jobs.tune_space`) is replicas x stages (stages beyond the hosts through their slots)
x threads per rank x chunk (each only where the preset or a flag leaves it free) and, with `allow_loss`,
int8-dynamic numerics and compressing wire formats (one lossy source per candidate, so its agreement with the
fp32 serial run is the one measured). The first measurement is the pipeline over every host (R = 1,
`balanced`, the base's threads and chunk): it profiles the hosts, is the pipeline-only answer, its serial run
is the tune's reference (every speedup divides by it) and it calibrates the cost model
(`pictl.jobs.tune_model`). Then one serial run per machine measures what each lever gains there (int8 with
`allow_loss`, each thread count, each chunk searched), every candidate is predicted, and the best predicted are
measured, each a full `pictl run`, until `measure` of them are in or the budget is spent. The verdicts are
`pictl.jobs.tune_verdicts`'; the first run's serial run is a row of its own (one copy on one host), and the
winner is the kept candidate with the highest speedup over it, only if it beats it.
`tune.json` is written before the first run (a directory that cannot take it refuses the tune before anything
is measured) and after every measurement, so an interrupted or failed tune keeps what it measured and says
how it ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass as checked_dataclass

from pictl import errors as E
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.jobs.tune_model import Calibration, by_machine, cached_profiles, predict, usable_cores
from pictl.jobs.tune_report import TUNE_FILE, TuneRecord
from pictl.jobs.tune_space import Axes, Candidate, candidates
from pictl.jobs.tune_verdicts import Measured, Versus, judge, judge_serial, ranked
from pictl.planning.costs import Profiles
from pictl.planning.options import RunOptions, as_flag
from pictl.planning.presets import preset_keys, resolve_options
from pictl.run.baselines import BaselineCache
from pictl.run.compare import agreement, max_abs_diff
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from pictl.validation import problem_line
from remote import protocol as P


@checked_dataclass(config=ConfigDict(strict=True))
class TuneSettings:
    """What a tune may spend and what it keeps, with the bounds `pictl tune` and `pictl.tune` both check."""

    measure: int = Field(default=3, ge=1, le=64)
    """Candidates measured at most (the pipeline-only one and the int8 serial run included; the serial runs
    that measure what threads and chunks gain are not)."""
    budget_s: float = Field(default=1800.0, ge=1.0, allow_inf_nan=False)
    allow_loss: bool = False
    min_agreement: float = Field(default=0.99, ge=0.0, le=1.0)
    wait: bool = False
    search_threads: bool = False
    """Try 1, 2, 4 ... threads per rank up to the hosts' cores (False: the base's threads only)."""
    search_chunk: bool = False
    """Try chunks 1, 2, 4, 8 that divide the images (False: the base's chunk only)."""


def plan_tune(profile: str | None, overrides: dict[str, Any], *, allow_loss: bool = False,
              min_agreement: float = 0.99, measure: int | None = None, budget_s: float = 1800.0,
              wait: bool = False, name_of: Callable[[str], str] = as_flag) -> tuple[RunOptions, TuneSettings]:
    """A tune's base options (defaults < profile < `overrides`, as `pictl run` resolves them; ConfigError names
    the flag or file) and its settings: threads and chunk are searched unless the profile or `overrides`
    set them. `pictl tune`, the dashboard's form and the Python API all start here."""
    base = resolve_options(profile, overrides, name_of=name_of)
    fixed = preset_keys(profile) | {k for k, v in overrides.items() if v is not None}
    try:
        settings = TuneSettings(measure=(5 if allow_loss is True else 3) if measure is None else measure,
                                budget_s=budget_s, allow_loss=allow_loss, min_agreement=min_agreement, wait=wait,
                                search_threads="threads" not in fixed, search_chunk="chunk" not in fixed)
    except ValidationError as exc:  # (in the caller's words: `--min-agreement` on the command line)
        raise E.ConfigError(problem_line(exc, TuneSettings, name_of=name_of)) from None
    return base, settings


@dataclass
class _Reference:
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


async def run_tune(cluster: Cluster, base: RunOptions, settings: TuneSettings, out: Path, *,
                   on_event: EventSink | None = None, cache: BaselineCache | None = None,
                   on_rows: Callable[[list[Measured]], object] | None = None,
                   on_session: Callable[[RunSession, Measured], object] | None = None,
                   write_failed: list[E.RecordWriteFailed] | None = None) -> list[Measured]:
    """Measure, predict, measure the best; `tune.json` in `out` after every run. `on_session(session, row)`
    before each run (the dashboard follows it), `on_rows(rows)` after: every candidate so far.
    However the tune ends, `tune.json` says so: `done`, or `failed` / `interrupted` with the error, which is
    raised again; a tune that measured nothing leaves nothing (the directory it made goes). A tune directory
    that cannot be written is ConfigError before anything is measured (it is written first), RecordWriteFailed
    once something is; a run whose own record is incomplete (a full disk) goes into `write_failed`, if given.
    Returns every candidate, `ranked`: those measured have a `status`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise E.ConfigError(f"the tune directory {out} cannot be made ({exc.strerror or exc})") from None
    tune = _Tune(cluster, base, settings, out, on_event=on_event, cache=cache, on_rows=on_rows,
                 on_session=on_session, write_failed=write_failed)
    try:
        tune.save("running")  # before the first run: a tune directory that cannot be written refuses the tune here
        await _search(tune)
    except BaseException as exc:
        stopped = isinstance(exc, E.Interrupted | asyncio.CancelledError | KeyboardInterrupt)
        tune.save("interrupted" if stopped else "failed", exc)
        if not tune.anything_measured():
            _remove_if_empty(out)
        raise
    tune.save("done")
    return ranked(list(tune.rows.values()))


class _Tune:
    """One tune's state (every row, those that count toward --measure, the reference serial run, tune.json)
    and how it measures a candidate."""

    def __init__(self, cluster: Cluster, base: RunOptions, settings: TuneSettings, out: Path, *,
                 on_event: EventSink | None, cache: BaselineCache | None,
                 on_rows: Callable[[list[Measured]], object] | None,
                 on_session: Callable[[RunSession, Measured], object] | None,
                 write_failed: list[E.RecordWriteFailed] | None) -> None:
        self.cluster, self.base, self.settings, self.out, self.cache = cluster, base, settings, out, cache
        self.on_event, self.on_rows, self.on_session, self.write_failed = on_event, on_rows, on_session, write_failed
        self.say: EventSink = on_event or (lambda _e: None)
        self.started = time.monotonic()
        self.rows = {c: Measured(c) for c in candidates(cluster, base, allow_loss=settings.allow_loss)}
        self.measured: list[Measured] = []
        """The rows that count toward --measure."""
        self.reference = _Reference()
        self.first: list[RunSession] = []
        """The first run: its tree's digest and its model file key the profiles it measured."""
        self.record = TuneRecord(out, {"started_at": time.time(), "cluster": cluster.source,
                                       "options": base.model_dump(), "settings": asdict(settings)})

    @property
    def meta(self) -> dict[str, Any]:
        return self.record.meta

    def spent(self) -> bool:
        return time.monotonic() - self.started > self.settings.budget_s

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

    async def measure(self, m: Measured, why: str, on: str | None = None, *, counted: bool = True) -> None:
        """Run `m` (on the host `on` alone, when given) and judge it; a row of the table counts toward
        --measure, a further machine's serial run and a gain's do not."""
        settings, label = self.settings, m.candidate.label
        self.say(Phase("tune", f"measuring {label} ({why})"))
        session = RunSession(_alone(self.cluster, on) if on else self.cluster, m.candidate.options(self.base),
                             on_event=self.on_event, runs_root=self.out / "runs", baseline_cache=self.cache,
                             wait=settings.wait)
        self.first[:] = self.first or [session]
        lead = not self.anything_measured()
        if self.on_session:
            self.on_session(session, m)
        summary: RunSummary | None
        try:
            summary = await session.run()
        except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
            summary = session.last_summary
            if lead and isinstance(exc, E.TransportError):  # the hosts cannot be reached: nothing to tune on
                if summary is not None:
                    judge(m, summary, settings.min_agreement, allow_loss=settings.allow_loss)
                raise
            self.say(Phase("tune", f"{label}: {exc}"))
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
            if session.last_summary:
                judge(m, session.last_summary, settings.min_agreement, self._versus(m, session),
                      allow_loss=settings.allow_loss)
                self.measured.extend([m] if counted else [])
            raise
        if session.write_error is not None:  # measured, but its record is incomplete: the tune goes on
            self.say(Phase("tune", f"{label}: {session.write_error}"))
            if self.write_failed is not None and not self.write_failed:
                self.write_failed.append(session.write_error)
        judge(m, summary, settings.min_agreement, self._versus(m, session) if summary else None,
              allow_loss=settings.allow_loss)
        self.measured.extend([m] if counted else [])
        self.save("running")
        self.say(Phase("tune", f"{label}: " + (f"{m.throughput_ips} img/s, " if m.throughput_ips else "")
                       + ("kept" if m.kept else f"not kept: {m.why}")))

    def _versus(self, m: Measured, session: RunSession) -> Versus | None:
        if not m.candidate.changes_arithmetic(self.base):
            return None
        return self.reference.versus(session.record.path if session.record else None, self.base.num_classes)


async def _search(tune: _Tune) -> None:
    """The pipeline over every host first, then what each lever gains per machine, then the best predicted."""
    cluster, base, settings, rows, say, meta = tune.cluster, tune.base, tune.settings, tune.rows, tune.say, tune.meta
    measure, spent, save, reference, first, measured = (tune.measure, tune.spent, tune.save, tune.reference,
                                                        tune.first, tune.measured)
    # One stage per host (a single host: one per slot): `balanced` profiles every host it runs on.
    pipeline = Candidate(1, len(cluster.hosts) if len(cluster.hosts) > 1 else cluster.slots, threads=base.threads,
                         chunk=base.chunk)
    lead = rows.setdefault(pipeline, Measured(pipeline))
    await measure(lead, "the pipeline over every host; it profiles them and its serial run is the reference")
    # The serial run is a row of its own: one copy on one host, what every candidate has to beat.
    serial = Candidate(1, 1, threads=base.threads, chunk=base.chunk)
    if first[0].last_summary is not None:
        judge_serial(rows.setdefault(serial, Measured(serial)), first[0].last_summary)
    record = first[0].record
    if record and (record.path / P.LOGITS_FILE_SERIAL).is_file():
        reference.logits = (record.path / P.LOGITS_FILE_SERIAL).read_bytes()
    reference.serial_ips, reference.accuracy = lead.serial_ips, lead.fp32_accuracy
    profiles = cached_profiles(cluster, base, first[0].ctx.caches.root, first[0].ctx.code,
                               first[0].ctx.artifact)
    if profiles is None:  # nothing to predict from: the first run failed (or did not profile)
        raise E.RunFailed(f"tune: the first run ({lead.candidate.label}) failed, nothing to tune from: {lead.why}"
                          if lead.status != "ok" else
                          "tune: the hosts' cost profiles are not in the cache after the first run")
    calibration = calibrate(lead, cluster, base, profiles)
    axes = Axes.of(base, search_threads=settings.search_threads, search_chunk=settings.search_chunk,
                   cores=usable_cores(lead.machines))
    for c in candidates(cluster, base, allow_loss=settings.allow_loss, axes=axes):
        rows.setdefault(c, Measured(c))
    meta["axes"] = asdict(axes)

    async def gains_of(lever: Candidate, what: str, gain: Callable[[Measured, str], float | None],
                       counted: bool = False) -> dict[str, float]:
        """One serial run of `lever` per machine: host -> what it gains there (a row is its first machine's)."""
        found: dict[str, float] = {}
        for i, group in enumerate(by_machine(cluster, lead.machines)):
            if spent():
                say(Phase("tune", f"budget spent: {what} not measured on {group[0]}"))
                break
            m = rows[lever] if i == 0 else Measured(lever)
            shared = f" (one machine with {', '.join(group[1:])})" if group[1:] else ""
            await measure(m, f"what {what} gains on {group[0]}{shared}", on=group[0], counted=counted and i == 0)
            g = gain(m, group[0]) if m.status == "ok" else None
            found |= dict.fromkeys(group, g) if g else {}
        return found

    def over_base(m: Measured, host: str) -> float | None:
        """A serial run's img/s over the base serial run's on that host (calibrated prediction)."""
        plain = predict(Candidate(1, 1, threads=base.threads, chunk=base.chunk), _alone(cluster, host), base, profiles,
                        calibration)
        return round(m.throughput_ips / plain, 4) if m.throughput_ips and plain else None

    int8_gains: dict[str, float] = {}
    if settings.allow_loss:  # its table row counts toward --measure (int8 on one host is a real answer)
        int8_gains = await gains_of(Candidate(1, 1, "int8-dynamic", threads=base.threads, chunk=base.chunk), "int8",
                                    lambda m, _h: m.speedup_vs_fp32, counted=True)
    thread_levers = {t: Candidate(1, 1, threads=t, chunk=base.chunk) for t in axes.threads[1:]}
    chunk_levers = {c: Candidate(1, 1, threads=base.threads, chunk=c) for c in axes.chunks[1:]}
    thread_gains = {t: await gains_of(lever, f"{t} threads", over_base) for t, lever in thread_levers.items()}
    chunk_gains = {c: await gains_of(lever, f"chunk {c}", over_base) for c, lever in chunk_levers.items()}
    # An exact tune measures nothing at a thread count or chunk whose own serial run already differed from the
    # reference: every run there computes what that serial run computed.
    inexact = [(lever, rows[lever].max_abs_diff_vs_reference) for lever in [*thread_levers.values(),
                                                                            *chunk_levers.values()]
               if rows[lever].identical is False and not settings.allow_loss]
    for m in rows.values():
        for lever, diff in inexact:
            if m.status is None and _shares_lever(m.candidate, lever, base):
                m.why = (f"not measured: {lever.label}'s serial run differs from the reference's"
                         + (f" by up to {diff:.1e}" if diff is not None else ""))
    calibration = Calibration(calibration.serial, calibration.pipeline, None, calibration.machines, int8_gains,
                              thread_gains, chunk_gains)
    say(Phase("tune", f"cost model calibrated: serial x{calibration.serial:.2f}, pipelines x{calibration.pipeline:.2f}"
                      + "".join(f", {k} x{min(g.values()):.2f}-{max(g.values()):.2f}"
                                for k, g in _gains_by_lever(calibration).items() if g)))
    meta["calibration"] = asdict(calibration)
    meta["int8_gains"] = int8_gains
    for m in rows.values():
        m.predicted_ips = predict(m.candidate, cluster, base, profiles, calibration)
    save("running")
    todo = sorted((m for m in rows.values() if m.status is None and m.predicted_ips and not m.why),
                  key=lambda m: -(m.predicted_ips or 0.0))
    if settings.allow_loss:  # the best exact configuration is measured too, to stand beside the lossy winner
        exact = [m for m in todo if not m.candidate.lossy and not m.candidate.changes_arithmetic(base)][:1]
        todo = exact + [m for m in todo if m not in exact]
    for m in todo:
        if len(measured) >= settings.measure:
            break
        if spent():
            say(Phase("tune", f"budget of {settings.budget_s:.0f} s spent: {len(measured)} candidate(s) measured"))
            break
        await measure(m, f"predicted {m.predicted_ips:.1f} img/s")


def _remove_if_empty(out: Path) -> None:
    """A tune that measured nothing leaves nothing: its tune.json, and the folders it made if they are empty."""
    runs = out / "runs"
    try:
        if runs.is_dir() and not runs.is_symlink() and not any(runs.iterdir()):
            runs.rmdir()
        if [p.name for p in out.iterdir()] == [TUNE_FILE]:
            (out / TUNE_FILE).unlink()
        out.rmdir()
    except OSError:
        pass  # something else is in it (a run's record): it stays, and its tune.json says how the tune ended


def _alone(cluster: Cluster, host: str) -> Cluster:
    """The inventory with one host left: where a serial run measures what a lever gains on its machine."""
    return cluster.model_copy(update={"hosts": tuple(h for h in cluster.hosts if h.name == host)})


def _shares_lever(c: Candidate, lever: Candidate, base: RunOptions) -> bool:
    """`c` runs at the thread count or chunk that `lever` moved away from the base."""
    return (lever.threads != base.threads and c.threads == lever.threads) or \
        (lever.chunk != base.chunk and c.chunk == lever.chunk)


def _gains_by_lever(cal: Calibration) -> dict[str, dict[str, float]]:
    return {"int8": cal.int8_gains, **{f"{t} threads": g for t, g in cal.thread_gains.items()},
            **{f"chunk {c}": g for c, g in cal.chunk_gains.items()}}


def calibrate(first: Measured, cluster: Cluster, base: RunOptions, profiles: Profiles,
              int8_gains: dict[str, float] | None = None) -> Calibration:
    """The model corrected by the first run: its serial run, and (when it is a pipeline) the pipeline itself."""
    raw_serial = predict(Candidate(1, 1, threads=base.threads, chunk=base.chunk), cluster, base, profiles)
    serial = first.serial_ips / raw_serial if first.serial_ips and raw_serial else 1.0
    pipeline = 1.0
    if first.candidate.stages > 1 and first.status == "ok" and first.throughput_ips:
        raw = predict(first.candidate, cluster, base, profiles, Calibration(serial, machines=first.machines))
        pipeline = first.throughput_ips / raw if raw else 1.0
    return Calibration(round(serial, 4), round(pipeline, 4), None, dict(first.machines), dict(int8_gains or {}))
