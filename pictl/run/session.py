"""One run, start to end, as a straight line of phases; each takes the previous one's result:

    open_hosts -> HostsReady        connect, lease, push once               (run/hosts.py)
                                    (or borrow the hosts a sweep or tune holds: `hosts=`)
    place -> Placement              stages on hosts, threads; `Placed`      (run/placement.py)
    choose_split -> SplitChoice     balanced's costs, split and refinement  (run/split.py)
    stage -> Staged                 spec on the hosts, orphans, host facts  (run/staging.py)
    plan_and_baseline -> Serial     the plan, the serial baseline, record   (run/serial.py)
    Pipeline.run -> PipelineDone    torchrun everywhere, lines streamed     (run/pipeline.py)
    collect_and_compare -> Comparison                                       (run/compare.py)
    summarize -> summary                                                    (run/summarize.py)

The session orders them, owns the sink and the logbook (the record, the start-up timeline, the telemetry:
`logbook.py`), hands each phase the part of it that phase writes in, takes trace windows while the pipeline runs,
and handles stop and failure in one place: whatever happens (bad input, a failing host, Ctrl-C),
every process it started is stopped, each host confirms, and once a run directory exists a summary
saying how the run ended is written.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.artifacts import open_artifact
from pictl.cluster.jobs import HostJob, to_the_end
from pictl.cluster.monitor import HostMonitor
from pictl.cluster.transport import preload
from pictl.cluster.warm import started_since
from pictl.events import EventSink, HostOutput, Phase, SessionEvent
from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from pictl.planning.specs import spec_from
from pictl.records.runs import PendingRecord, RunRecord, default_runs_root
from pictl.records.tracker_writers import check_trackers, track_record
from pictl.records.trackers import run_series, write_samples
from pictl.run.baselines import BaselineCache
from pictl.run.compare import collect_and_compare
from pictl.run.context import Caches, Handed, RunContext
from pictl.run.continuation import cannot_continue, continue_without
from pictl.run.hosts import HeldHosts, open_hosts
from pictl.run.logbook import Logbook
from pictl.run.pipeline import Pipeline, PipelineDone
from pictl.run.placement import candidates, place
from pictl.run.serial import baseline_max_age, plan_and_baseline
from pictl.run.split import choose_split
from pictl.run.staging import stage
from pictl.run.summarize import Reached, bare_summary, summarize
from pictl.run.traces import RankTrace, TraceGrab, grab_traces
from pictl.summary_models import RunSummary
from remote.floor import protocol as P

SAMPLE_INTERVAL_S = 2.0


class RunSession:
    """Runs one experiment on a cluster; `await run()` returns its checked summary (`RunSummary`)."""

    def __init__(self, cluster: Cluster, options: RunOptions, *, on_event: EventSink | None = None,
                 runs_root: Path | None = None, baseline_cache: BaselineCache | None = None,
                 reuse_baseline: bool = True, profile: str | None = None, wait: bool = False,
                 handed: Handed | None = None, part_of: dict[str, Any] | None = None,
                 hosts: HeldHosts | None = None) -> None:
        preload(cluster)  # before the start-up clock: importing is not connecting
        runs_root = runs_root or default_runs_root()
        sink = on_event or (lambda _e: None)

        def observed(event: SessionEvent) -> None:
            if isinstance(event, HostOutput) and event.line.startswith(P.WARM_NOTE) and "cold" in event.line:
                self.book.timeline.ran_cold(event.host)  # (the host is warm, but this job could not be)
            sink(event)

        self.ctx = RunContext(cluster, options, RunRecord.new_id(options.stages), observed,
                              runs_root, Caches.beside(baseline_cache or BaselineCache()),
                              artifact=open_artifact(options.artifact) if options.artifact else None,
                              profile=profile, wait_for_hosts=wait, reuse_baseline=reuse_baseline, handed=handed,
                              pushed=hosts.tree if hosts is not None else None)
        self.held = hosts
        """The hosts the sweep or tune this run is one of holds, borrowed (None: the run connects, leases and pushes
        itself); closing the run stops its processes and removes its run directories, and leaves them held."""
        self.part_of = part_of
        """The comparison this run is one of (`pictl sweep`: its directory, round and role), written into its
        summary so that `pictl runs` lists it with it."""
        self.book = Logbook(PendingRecord(runs_root, self.ctx.run_id))
        self.reached = Reached(self.book)
        self.pipeline: Pipeline | None = None
        self.summary: RunSummary | None = None
        """The summary of the finished run, failed or not (None when nothing started), as written."""
        self.job: HostJob | None = None
        """The run's hold on its hosts, once they are open."""
        self._grab_tasks: set[asyncio.Task] = set()
        self._monitor: asyncio.Task | None = None

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def options(self) -> RunOptions:
        return self.ctx.options

    @property
    def baseline_max_age(self) -> float | None:
        """How old a cached serial baseline may be and still stand for this run (seconds; None: no bound)."""
        return baseline_max_age(self.ctx)

    @property
    def record(self) -> RunRecord | None:
        """The run's record, once it exists (its spec passed the plan)."""
        return self.book.record.record

    @property
    def write_error(self) -> E.RecordWriteFailed | None:
        """The record could not be written whole (a full disk): the result stands, the record is incomplete."""
        return self.record.write_error if self.record is not None else None

    @property
    def reference(self) -> Handed | None:
        """This run's serial baseline as another run of its comparison takes it (`RunSession(handed=...)`), once
        it has one."""
        serial, placement = self.reached.serial, self.reached.placement
        if serial is None or serial.fields is None or placement is None:
            return None
        return Handed(serial.baseline, serial.host or placement.first.host.name, serial.fields, self.run_id)

    @property
    def pipeline_live(self) -> bool:
        return self.pipeline is not None and self.pipeline.live

    async def run(self) -> RunSummary:
        """Run the experiment; its summary, or the error that ended it (`summary` then holds the failed
        run's summary)."""
        await self._run()
        assert self.summary is not None  # _run returned: the record closed with the summary
        return self.summary

    async def _run(self) -> None:
        ctx, reached, book = self.ctx, self.reached, self.book
        o = ctx.options
        usable = candidates(ctx.cluster, o.ranks, o.policy, o.replicas)  # ConfigError: nothing started yet
        check_trackers(self.trackers)
        spec = spec_from(o, ctx.run_id, ctx.artifact)
        summary: dict[str, Any] = {}
        try:
            try:
                self.job = job = (await open_hosts(ctx, list(usable.cluster.hosts), book.timeline, self.held)).job
                reached.placement = placement = await place(ctx, job, usable, book.timeline)
                reached.choice = choice = await choose_split(ctx, job, placement, spec, book.timeline)
                spec = choice.spec
                reached.staged = staged = await stage(ctx, job, placement, spec, book.timeline)
                # The run's hosts sampled while it runs (load, heat, throttling), over its own connections.
                self._monitor = asyncio.create_task(HostMonitor(
                    ctx.cluster, book.samples.append, interval_s=SAMPLE_INTERVAL_S,
                    transports=[job.transport(n.host) for n in placement.nodes]).run())
                reached.serial = serial = await plan_and_baseline(ctx, job, placement, spec, staged, book)
            except E.ConfigError:
                if self.record is None and self.job is not None:  # bad input: leave nothing behind, there or here
                    await asyncio.gather(*(t.remove_tree(t.host.run_dir(spec.run_id)) for t in self.job.fleet),
                                         return_exceptions=True)
                raise
            book.timeline.mark("baselined")
            if o.ranks > 1:
                reached.pipeline = await self._pipeline(job)
                # (a run that lost a host ran its last segment on other hosts, with fewer stages)
                ctx, placement, spec = self.ctx, reached.placement, reached.choice.spec
                await self._settle_grabs(ok=True)
                if spec.trace_steps:
                    await self.grab_traces(spec.trace_steps, trace_id="run", request=False, timeout_s=30)
            book.timeline.warm_started = await started_since([job.transport(n.host) for n in placement.nodes],
                                                             book.timeline.started_at)
            reached.comparison = cmp = await collect_and_compare(ctx, job, placement, spec, serial)
            summary = summarize(self.ctx, reached, "ok")
            if not cmp.outputs_match:
                summary["status"] = "failed"
                if cmp.lossy:
                    raise E.OutputMismatch(f"lossy wire ({o.wire}): top-1 agreement with the serial run "
                                           f"{cmp.agreement if cmp.agreement is None else f'{cmp.agreement:.4f}'} "
                                           f"is below --min-agreement {o.min_agreement}")
                raise E.OutputMismatch(f"pipeline output differs from the serial run "
                                       f"(max abs diff {cmp.max_abs_diff})")
        except asyncio.CancelledError:
            summary = summarize(self.ctx, reached, "interrupted")
            raise E.Interrupted("interrupted: every rank was stopped") from None
        except Exception as exc:  # pictl's own errors, and any other (a bug): the record says which
            if self.record is None:
                raise  # failed before the run existed: nothing to summarise
            if not summary:
                summary = summarize(self.ctx, reached, "failed")
            summary["status"] = "failed"
            where = exc.where if isinstance(exc, E.RunFailed) else {}
            summary["error"] = {"type": type(exc).__name__, "message": str(exc), **where}
            raise
        finally:
            try:
                try:
                    await to_the_end(self._settle_grabs(ok=False))
                finally:
                    await to_the_end(self._cleanup())
            finally:  # however the run ended, and whatever the clean-up met, the record closes
                if self.record is not None:
                    summary = self._comparison_noted(summary or bare_summary(self.ctx, book))
                    self.record.finish(summary)
                    self.summary = RunSummary.model_validate(summary)
                    if self.summary.status != "interrupted":  # a second Ctrl-C must not wait on a tracker
                        await self._track(self.summary)

    async def _pipeline(self, job: HostJob) -> PipelineDone:
        """The pipeline's launches: one, unless a host is lost and the run goes on without it: then the next
        segment runs the rest of the timed passes on the hosts left (`continuation`)."""
        reached, book = self.reached, self.book
        while True:
            assert reached.placement is not None and reached.choice is not None and reached.staged is not None
            self.pipeline = Pipeline(self.ctx, job, reached.placement, reached.choice, reached.staged, book)
            try:
                done = await self.pipeline.run()
            except E.HostLost as lost:
                why = cannot_continue(self.ctx, reached.placement, lost, book, comparison=self.part_of is not None)
                if why is not None:
                    self.ctx.sink(Phase("host-lost", f"{lost.host} lost; the run cannot continue: {why}"))
                    raise
                try:
                    nxt = await continue_without(self.ctx, job, reached.placement, reached.staged, lost, book)
                except E.PictlError as exc:  # (re-planning failed: the loss is the run's failure, and why it ended)
                    raise E.RunFailed(f"{lost}; continuing without it failed: {exc}", lost.where) from exc
                self.ctx = nxt.ctx
                reached.placement, reached.choice, reached.staged = nxt.placement, nxt.choice, nxt.staged
                continue
            if book.losses:
                book.losses[-1].first_output_at = self.pipeline.first_output_at
            return done

    def _comparison_noted(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The summary with the comparison it is part of, a handed reference's own host and run named in its
        baseline record (the summarizer names the run's first host, where a baseline of its own is measured), and
        a start-up on borrowed hosts saying who held them (its connect and push took no time of its own)."""
        if self.held is not None and isinstance(summary.get("startup"), dict):
            summary["startup"] = {**summary["startup"], "hosts_held_by": self.held.holder}
        serial = self.reached.serial
        if serial is not None and serial.handed is not None and isinstance(summary.get("baseline"), dict):
            summary["baseline"] = {**summary["baseline"], "host": serial.handed.host,
                                   "reference_run": serial.handed.run_id}
        return {**summary, "part_of": self.part_of} if self.part_of else summary

    @property
    def trackers(self) -> list[str]:
        """Where the finished run is also written: its own `track`, else the inventory's."""
        return list(self.options.track or self.ctx.cluster.track)

    async def _track(self, summary: RunSummary) -> None:
        record, kinds = self.record, self.trackers
        if record is None or not kinds:
            return
        try:
            write_samples(record.path, self.book.samples)
        except OSError as exc:  # the trackers go without the host samples; the record stands
            self.ctx.sink(Phase("track", f"host samples not written ({exc.strerror or exc})"))
        await track_record(kinds, record.path, lambda: run_series(record.path, summary),
                           lambda message: self.ctx.sink(Phase("track", message)))

    async def _cleanup(self) -> None:
        """Stop every process, wait for each host to confirm, leave no run directory there, free the hosts (borrowed
        ones stay held: the sweep's or tune's, freed once at its end)."""
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        if self.job is not None:
            placement = self.reached.placement
            # (a host the run lost is tidied too, as far as it answers: nothing of ours is left there)
            used = [n.host.name for n in placement.nodes] if placement else []
            await self.job.close([*used, *(loss.host for loss in self.book.losses)])

    # -- traces -----------------------------------------------------------------------------------

    def _rank_traces(self) -> list[RankTrace]:
        placement = self.reached.placement
        assert placement is not None and self.job is not None
        return [RankTrace(n.host.name, r, self.job.transport(n.host), n.host.run_dir(self.run_id))
                for n in placement.nodes for r in n.ranks]

    def _trace_gave_up(self, trace_id: str, rank: int) -> str | None:
        """Why `rank` will never deliver trace `trace_id`, or None while it still may."""
        tel = self.book.telemetry
        for ev in tel.traces:
            if ev.id == trace_id and ev.stage == rank and not ev.file:
                return f"rank {rank}: {ev.message or 'no trace written'}"
        st = tel.stages.get(rank)
        if st is not None and st.error:
            return f"rank {rank} failed: {st.error.message}"
        if not self.pipeline_live:
            return f"rank {rank}: the run ended before its trace arrived"
        return None

    async def grab_traces(self, steps: int, *, timeout_s: float = 120.0, trace_id: str | None = None,
                          request: bool = True) -> TraceGrab:
        """Profile `steps` steps on every rank of the running pipeline and merge what arrives.

        The run goes on meanwhile; passes the window touches are kept out of its throughput.
        """
        ctx, record = self.ctx, self.record
        if request and (not self.pipeline_live or record is None):
            raise E.ConfigError("no pipeline is running: traces are taken from a live run (or run --trace-steps)")
        assert record is not None
        task = asyncio.current_task()
        if task is not None:
            self._grab_tasks.add(task)
        ranks = self._rank_traces()
        ctx.sink(Phase("traces", f"profiling {steps} step(s) on {len(ranks)} rank(s)"))
        try:
            grab = await grab_traces(ranks, record.path, steps=steps, timeout_s=timeout_s,
                                     gave_up=self._trace_gave_up, trace_id=trace_id, request=request)
        finally:
            self._grab_tasks.discard(task)
        self.book.traces.append(grab.to_json())
        got = f"{len(grab.files)} of {len(grab.files) + len(grab.missing)} rank trace(s) in {grab.directory}"
        ctx.sink(Phase("traces", got + "".join(f"; {why}" for why in grab.missing.values())))
        return grab

    async def _settle_grabs(self, ok: bool) -> None:
        """Let trace grabs that are under way finish (a finished run has flushed every trace)."""
        pending = [t for t in self._grab_tasks if not t.done()]
        if not pending:
            return
        if not ok:
            for t in pending:
                t.cancel()
        await asyncio.wait(pending, timeout=60)
