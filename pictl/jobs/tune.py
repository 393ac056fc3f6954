"""`pictl tune`: the fastest configuration the cluster allows, exact first, and past N times where the user
accepts a bounded loss.

The search space (`pictl.jobs.tune_space`) is replicas x stages (stages beyond the hosts through their slots)
x threads per rank x chunk (each only where the preset or a flag leaves it free) and, with `allow_loss`,
int8-dynamic numerics and compressing wire formats (one lossy source per candidate, so its agreement with the
fp32 serial run is the one measured). Screening comes first. The pipeline over every host (R = 1, `balanced`,
the base's threads and chunk): it profiles the hosts, is the pipeline-only answer, its serial run names the
tune's reference (the fp32 serial run on that host, at the base's threads and chunk) and it calibrates the cost
model (`pictl.jobs.tune_model`). Then one serial run per machine measures what each lever gains there (int8
with `allow_loss`, each thread count, each chunk searched), every candidate is predicted, and the best
predicted are screened, each a full `pictl run`, until `measure` of them are in or half the budget is spent.
Screening chooses the finalists; the rounds decide (`pictl.jobs.tune_rounds`): the reference and the
finalists measured again and again in alternating order, each finalist's speedup the median of its img/s over
its round's reference, a winner only beyond the noise, a tie to the simpler configuration. The verdicts are
`pictl.jobs.tune_verdicts`'. Every run is a run of its own under the runs root (`pictl runs` lists it).
Every host is held for the whole tune (connected, leased under the tune's name and the code pushed, once;
`pictl.run.hosts.held_hosts`), and every run borrows them.
`tune.json` is written before the first run (a directory that cannot take it refuses the tune before anything
is measured) and after every measurement, so an interrupted or failed tune keeps what it measured and says
how it ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.jobs.tune_model import Calibration, by_machine, cached_profiles, predict, usable_cores
from pictl.jobs.tune_report import TUNE_FILE, TunePlan, TuneReference
from pictl.jobs.tune_rounds import FINALISTS, MAX_ROUNDS, MIN_ROUNDS, Budget, interleave
from pictl.jobs.tune_runs import TuneJob, TuneSettings, alone
from pictl.jobs.tune_space import Axes, Candidate, candidates
from pictl.jobs.tune_verdicts import Measured, judge_serial, ranked
from pictl.planning.costs import Profiles
from pictl.planning.options import RunOptions, as_flag
from pictl.planning.placement import place_stages
from pictl.planning.presets import preset_keys, resolve_options
from pictl.records.runs import default_runs_root
from pictl.run.baselines import BaselineCache
from pictl.run.hosts import held_hosts
from pictl.run.session import RunSession
from pictl.validation import problem_line
from remote.floor import protocol as P

__all__ = ["TuneSettings", "plan_tune", "run_tune"]

SCREENING_SHARE = 0.5
"""The share of the budget after which no screening run starts: the rest is the rounds'."""


def plan_tune(profile: str | None, overrides: dict[str, Any], *, allow_loss: bool = False,
              min_agreement: float = 0.99, measure: int | None = None, budget_s: float = 1800.0,
              wait: bool = False, name_of: Callable[[str], str] = as_flag,
              max_rounds: int = MAX_ROUNDS) -> tuple[RunOptions, TuneSettings]:
    """A tune's base options (defaults < profile < `overrides`, as `pictl run` resolves them; ConfigError names
    the flag or file) and its settings: threads and chunk are searched unless the profile or `overrides`
    set them. `pictl tune`, the dashboard's form and the Python API all start here."""
    base = resolve_options(profile, overrides, name_of=name_of)
    fixed = preset_keys(profile) | {k for k, v in overrides.items() if v is not None}
    try:
        settings = TuneSettings(measure=(5 if allow_loss is True else 3) if measure is None else measure,
                                budget_s=budget_s, allow_loss=allow_loss, min_agreement=min_agreement, wait=wait,
                                search_threads="threads" not in fixed, search_chunk="chunk" not in fixed,
                                max_rounds=max_rounds)
    except ValidationError as exc:  # (in the caller's words: `--min-agreement` on the command line)
        raise E.ConfigError(problem_line(exc, TuneSettings, name_of=name_of)) from None
    return base, settings


async def run_tune(cluster: Cluster, base: RunOptions, settings: TuneSettings, out: Path, *,
                   on_event: EventSink | None = None, cache: BaselineCache | None = None,
                   on_rows: Callable[[list[Measured]], object] | None = None,
                   on_session: Callable[[RunSession, Measured], object] | None = None,
                   write_failed: list[E.RecordWriteFailed] | None = None,
                   runs_root: Path | None = None) -> list[Measured]:
    """Screen, predict, screen the best, then measure the finalists in rounds against one reference and decide
    (`pictl.jobs.tune_rounds`); `tune.json` in `out` after every run. Every run is a run of its own under
    `runs_root` (default: the runs root), so `pictl runs` lists it and every command finds it by id.
    `on_session(session, row)` before each run (the dashboard follows it), `on_rows(rows)` after: every
    candidate so far. However the tune ends, `tune.json` says so: `done`, or `failed` / `interrupted` with the
    error, which is raised again; a tune that measured nothing leaves nothing (the directory it made goes). A
    tune directory that cannot be written is ConfigError before anything is measured (it is written first),
    RecordWriteFailed once something is; a run whose own record is incomplete (a full disk) goes into
    `write_failed`, if given. Returns every candidate, `ranked`: those measured have a `status`, the decided
    one `won`."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise E.ConfigError(f"the tune directory {out} cannot be made ({exc.strerror or exc})") from None
    tune = TuneJob(cluster, base, settings, out, on_event=on_event, cache=cache, on_rows=on_rows,
                 on_session=on_session, write_failed=write_failed, runs_root=runs_root or default_runs_root())
    try:
        tune.save("running")  # before the first run: a tune directory that cannot be written refuses the tune here
        # Every host held for the whole tune (connected, leased under its name, the code pushed, once); every
        # run borrows them, and they are freed once, however the tune ends.
        async with held_hosts(cluster, "tune", out.name, wait=settings.wait, on_event=on_event,
                              model=base.model) as tune.hosts:
            await _search(tune)
            await _decide(tune)
    except BaseException as exc:
        stopped = isinstance(exc, E.Interrupted | asyncio.CancelledError | KeyboardInterrupt)
        tune.save("interrupted" if stopped else "failed", exc)
        if not tune.anything_measured():
            _remove_if_empty(out)
        raise
    tune.save("done")
    return ranked(list(tune.rows.values()))


async def _search(tune: TuneJob) -> None:
    """The pipeline over every host first, then what each lever gains per machine, then the best predicted."""
    cluster, base, settings, rows, say, meta = tune.cluster, tune.base, tune.settings, tune.rows, tune.say, tune.meta
    measure, spent, save, reference, first, measured = (tune.measure, tune.spent, tune.save, tune.reference,
                                                        tune.first, tune.measured)
    # One stage per host (a single host: one per slot): `balanced` profiles every host it runs on.
    pipeline = Candidate(1, len(cluster.hosts) if len(cluster.hosts) > 1 else cluster.slots, threads=base.threads,
                         chunk=base.chunk)
    lead = rows.setdefault(pipeline, Measured(pipeline))
    await measure(lead, "the pipeline over every host; it profiles them and its serial run is the reference")
    if lead.status != "ok" and len(tune.cluster.hosts) < len(cluster.hosts):
        # A host was lost in it (`TuneJob.without`): the pipeline over the hosts left leads instead, and the search
        # goes on from its profiles and its serial run, over those hosts.
        cluster = tune.cluster
        pipeline = Candidate(1, len(cluster.hosts) if len(cluster.hosts) > 1 else cluster.slots,
                             threads=base.threads, chunk=base.chunk)
        lead = rows.setdefault(pipeline, Measured(pipeline))
        await measure(lead, f"the pipeline over the hosts left ({', '.join(h.name for h in cluster.hosts)}); its "
                            "serial run is the reference", lead=True)
        for m in rows.values():
            if m.status is None and not _fits(m.candidate, cluster):
                m.why = f"not measured: {m.candidate.label} does not fit the hosts left"
    # The serial run is a row of its own: one copy on one host, what every candidate has to beat.
    serial = Candidate(1, 1, threads=base.threads, chunk=base.chunk)
    if first[0].summary is not None:
        judge_serial(rows.setdefault(serial, Measured(serial)), first[0].summary)
    record = first[0].record
    if record and (record.path / P.LOGITS_FILE_SERIAL).is_file():
        reference.logits = (record.path / P.LOGITS_FILE_SERIAL).read_bytes()
    reference.serial_ips, reference.accuracy = lead.serial_ips, lead.fp32_accuracy
    ran = first[0].summary
    meta.reference = TuneReference(host=ran.baseline.host if ran and ran.baseline else cluster.hosts[0].name,
                                   numerics="fp32", threads=base.threads, chunk=base.chunk,
                                   screening_run_id=lead.run_id, screening_ips=lead.serial_ips)
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
    meta.axes = asdict(axes)

    async def gains_of(lever: Candidate, what: str, gain: Callable[[Measured, str], float | None],
                       counted: bool = False) -> dict[str, float]:
        """One serial run of `lever` per machine: host -> what it gains there (a row is its first machine's)."""
        found: dict[str, float] = {}
        for i, group in enumerate(by_machine(cluster, lead.machines)):
            if spent(SCREENING_SHARE):
                say(Phase("tune", f"screening's half of the budget spent: {what} not measured on {group[0]}"))
                break
            m = rows[lever] if i == 0 else Measured(lever)
            shared = f" (one machine with {', '.join(group[1:])})" if group[1:] else ""
            await measure(m, f"what {what} gains on {group[0]}{shared}", on=group[0], counted=counted and i == 0)
            g = gain(m, group[0]) if m.status == "ok" else None
            found |= dict.fromkeys(group, g) if g else {}
        return found

    def over_base(m: Measured, host: str) -> float | None:
        """A serial run's img/s over the base serial run's on that host (calibrated prediction)."""
        plain = predict(Candidate(1, 1, threads=base.threads, chunk=base.chunk), alone(cluster, host), base, profiles,
                        calibration)
        return round(m.throughput_ips / plain, 4) if m.throughput_ips and plain else None

    int8_gains: dict[str, float] = {}
    if settings.allow_loss:  # its table row counts toward --measure (int8 on one host is a real answer)
        int8_gains = await gains_of(Candidate(1, 1, "int8-dynamic", threads=base.threads, chunk=base.chunk), "int8",
                                    _int8_gain, counted=True)
    thread_levers = {t: Candidate(1, 1, threads=t, chunk=base.chunk) for t in axes.threads[1:]}
    chunk_levers = {c: Candidate(1, 1, threads=base.threads, chunk=c) for c in axes.chunks[1:]}
    tune.progress.planned += len(by_machine(cluster, lead.machines)) * (len(thread_levers) + len(chunk_levers))
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
    meta.calibration = asdict(calibration)
    meta.int8_gains = int8_gains
    for m in rows.values():
        m.predicted_ips = predict(m.candidate, cluster, base, profiles, calibration) if _fits(m.candidate, cluster) \
            else None
    save("running")
    todo = sorted((m for m in rows.values() if m.status is None and m.predicted_ips and not m.why),
                  key=lambda m: -(m.predicted_ips or 0.0))
    if settings.allow_loss:  # the best exact configuration is measured too, to stand beside the lossy winner
        exact = [m for m in todo if not m.candidate.lossy and not m.candidate.changes_arithmetic(base)][:1]
        todo = exact + [m for m in todo if m not in exact]
    for m in todo:
        if len(measured) >= settings.measure:
            break
        if spent(SCREENING_SHARE):
            say(Phase("tune", f"screening's half of the {settings.budget_s:.0f} s budget spent: {len(measured)} "
                              "candidate(s) screened"))
            break
        await measure(m, f"predicted {m.predicted_ips:.1f} img/s")


async def _decide(tune: TuneJob) -> None:
    """The finalists (the kept rows screening ranked best, at most `FINALISTS`) measured in rounds against the
    reference, and the decision (`pictl.jobs.tune_rounds`), said and kept in tune.json."""
    rows = list(tune.rows.values())
    reference = next((m for m in rows if m.reference), None)
    finalists = [m for m in ranked(rows) if m.kept and m.status == "ok" and not m.reference][:FINALISTS]
    if reference is None or not finalists:
        tune.meta.decision = ["no candidate was kept: nothing to measure in rounds, nothing is saved"]
        return
    assert tune.meta.reference is not None  # (set once the first run measured it)
    host = tune.meta.reference.host
    tune.progress.planned = tune.progress.done + MIN_ROUNDS * (1 + len(finalists))
    tune.say(Phase("tune", f"rounds: the reference (the serial run on {host}) and "
                           f"{', '.join(m.candidate.label for m in finalists)}, in alternating order"))

    def plan_round(runs: int) -> None:
        tune.progress.planned = tune.progress.done + runs

    decision = await interleave(finalists, reference, tune.base, tune.measure_round,
                                Budget(tune.elapsed, tune.settings.budget_s), tune.say,
                                max_rounds=tune.settings.max_rounds, plan_round=plan_round)
    tune.meta.decision = decision.lines
    tune.meta.rounds = len(reference.rounds)
    tune.meta.plan = TunePlan(rounds=MIN_ROUNDS, max_rounds=tune.settings.max_rounds)  # (`runs compare` reads it)
    for line in decision.lines:
        tune.say(Phase("tune", line))


def _fits(c: Candidate, cluster: Cluster) -> bool:
    """`c`'s ranks fit the hosts (fewer after a host was lost than the candidates were made for)."""
    try:
        place_stages(cluster, c.replicas * c.stages)
    except E.ConfigError:
        return False
    return True


def _int8_gain(m: Measured, _host: str) -> float | None:
    """int8's gain on a host: its serial run's img/s over the fp32 serial run its own run measured there."""
    return round(m.throughput_ips / m.serial_ips, 4) if m.throughput_ips and m.serial_ips else None


def _remove_if_empty(out: Path) -> None:
    """A tune that measured nothing leaves nothing: its tune.json, and its directory if nothing else is there."""
    try:
        if [p.name for p in out.iterdir()] == [TUNE_FILE]:
            (out / TUNE_FILE).unlink()
        out.rmdir()
    except OSError:
        pass  # something else is in it (a run's record): it stays, and its tune.json says how the tune ended

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
