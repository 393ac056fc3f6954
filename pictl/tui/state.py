"""What the dashboard shows, folded from session events and host samples. No Textual here.

Widgets read this model and render it; the app feeds it. Keeping the folding out
of the widgets lets the bench and the tests drive it without a screen, and keeps
every figure computed once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Literal

from pictl.cluster.monitor import HostSample
from pictl.events import SERIAL_FP32, BaselineReady, HostDropped, Placed, SplitChosen
from pictl.inventory import Cluster
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.jobs.prune_options import PruneOptions
from pictl.jobs.training.options import TrainOptions
from pictl.planning.options import RunOptions
from pictl.summary_models import RunError, RunSummary, TraceRecord
from pictl.tui.prune_state import PruneView
from pictl.tui.rows import Ending, HostRow, StageView
from pictl.tui.sweep_state import SweepStep, SweepView
from pictl.tui.train_state import TrainView
from pictl.tui.tune_state import TuneStep, TuneView
from remote.floor.records import Record
from remote.floor.run_records import Accuracy, Error, Progress, Refine, Refined, StageReady, Throughput, Trace

JobKind = Literal["run", "sweep", "tune", "prune", "train"]
"""What the dashboard runs: each kind starts and ends through one contract (`pictl.tui.jobs.DashboardJob`)."""
JobStep = SweepStep | TuneStep
"""Where a sweep or a tune is when its next run takes the panel."""
JobView = SweepView | TuneView | PruneView | TrainView
"""The job beside the run panel's figures: a sweep's or a tune's table above its runs, a pruning's or a
training's own panel. One at a time: a job's start puts its own or none."""

NO_RUN = RunOptions()
"""What a pass count reads while a training or pruning job has the panel: the run defaults (made once)."""


# Which hosts a session phase keeps busy, and how the hosts table names it.
_PHASE_ACTIVITY = {"push": "pushing", "balance": "profiling", "plan": "planning", "baseline": "serial baseline",
                   "pipeline": "running", "traces": "running", "cleanup": "cleaning up"}


class DashboardState:
    """The whole dashboard's data: hosts, stages, the run's figures, its log position."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.hosts = {h.name: HostRow(h.name) for h in cluster.hosts}
        self.stages: dict[int, StageView] = {}
        self.lost: set[str] = set()
        """The hosts the running job lost and went on without (`HostDropped`)."""
        self.options: RunOptions | None = None
        """The run's options (None while a training or pruning job has the panel)."""
        self.shape = (0, 1)
        """Stages and replicas of the job on the panel (its ranks are their product)."""
        self.running = False
        self.phase = "idle"
        self.phase_message = "press r to start a run"
        self.summary: RunSummary | None = None
        self.ending: Ending | None = None
        self.serial_ips: float | None = None
        self.pipeline_ips: list[float] = []
        self.accuracy: float | None = None
        self.started_at: float | None = None
        self.pipeline_started_at: float | None = None
        self.traces: list[TraceRecord] = []
        self.trace_note: str | None = None
        self.job: JobView | None = None
        """The latest job beside the runs, kept after it ended (its table, its summary); None for a run."""
        self.refine: list[Refine | Refined] = []  # `balanced` correcting its split: each round, then the result
        self.phase_since: float | None = None
        self.run_dir: str | None = None  # where this run's record goes (known from its start)
        self.serial_reused = False
        self.split_points: list[str] = []
        """Where the run cuts the model, once the session announced it (`SplitChosen`)."""

    @property
    def failure(self) -> RunError | None:
        """Why the run on the panel failed, as its summary says (None while it runs, or when it did not)."""
        return self.summary.error if self.summary else None

    @property
    def tune(self) -> TuneView | None:
        """The latest tune: its candidates so far, the one on the panel."""
        return self.job if isinstance(self.job, TuneView) else None

    @property
    def sweep(self) -> SweepView | None:
        """While and after a sweep: its table, the run on the panel."""
        return self.job if isinstance(self.job, SweepView) else None

    @property
    def prune(self) -> PruneView | None:
        """The latest pruning job: options, progress, accuracy, summary."""
        return self.job if isinstance(self.job, PruneView) else None

    @property
    def train(self) -> TrainView | None:
        """The latest training job."""
        return self.job if isinstance(self.job, TrainView) else None

    # -- run lifecycle ----------------------------------------------------------------------------

    def show_job(self, view: SweepView | TuneView | None) -> None:
        """A run (None), a sweep or a tune starts: its table replaces the previous job's; its runs take the
        panel as they come (`start_run`), and until the first one, it holds the panel as running."""
        self.job = view
        if view is not None:
            self.running = True

    def on_job_step(self, step: JobStep) -> None:
        """A sweep's or a tune's next run took the panel."""
        match step:
            case SweepStep() if self.sweep is not None:
                self.sweep.index, self.sweep.total = step.index, step.total
            case TuneStep() if self.tune is not None:
                self.tune.trying = step.trying

    def start_prune(self, options: PruneOptions, where: str, now: float | None = None) -> None:
        """A pruning job takes the run panel: there are no stages, only epochs and accuracy."""
        self.start_run(None, now, stages=0)
        self.job = PruneView(options, where)
        self.phase, self.phase_message = "prune", f"pruning on {where}"

    def finish_prune(self, summary: PruneSummary | None, ending: Ending) -> None:
        if self.prune is not None:
            self.prune.summary = summary
        self.finish(None, ending)
        if ending.outcome == "done" and summary:
            self.phase_message = f"artifact {summary.artifact}"

    def start_train(self, options: TrainOptions, now: float | None = None) -> None:
        """A training job takes the run panel: steps, the loss, samples/s and each rank's time."""
        self.start_run(None, now, stages=options.stages if options.mode != "single" else 1)
        self.job = TrainView(options)
        self.phase, self.phase_message = "connect", f"training ({options.mode}): connecting"

    def finish_train(self, summary: TrainSummary | None, ending: Ending) -> None:
        if self.train is not None:
            self.train.summary = summary
        self.finish(None, ending)

    def start_run(self, options: RunOptions | None, now: float | None = None, *, stages: int = 0) -> None:
        """A run (`options`) or another job of `stages` ranks takes the panel."""
        self.options = options
        self.shape = (options.stages, options.replicas) if options else (stages, 1)
        if isinstance(self.job, PruneView | TrainView):
            self.job = None  # (a sweep's or a tune's table stays above its runs)
        self.running, self.summary, self.ending = True, None, None
        self.serial_ips, self.pipeline_ips, self.accuracy, self.traces, self.trace_note = None, [], None, [], None
        self.refine, self.run_dir, self.serial_reused, self.split_points = [], None, False, []
        self.started_at, self.pipeline_started_at = now or time.time(), None
        self.phase, self.phase_message = "connect", "connecting"
        self.phase_since = self.started_at
        self.stages, self.lost = {}, set()
        for row in self.hosts.values():
            row.ranks, row.activity = [], "idle"
        # A panel per rank at once; where each runs is the session's word alone (`on_placed`), never guessed
        # here (under `balanced` it may not be the inventory's first hosts).
        for rank in range(self.shape[0] * self.shape[1]):
            self.stages[rank] = self._view(rank, "")

    def _view(self, rank: int, host: str) -> StageView:
        stages, copies = max(1, self.shape[0]), self.shape[1]
        label = f"replica {rank // stages} stage {rank % stages}" if copies > 1 else f"stage {rank}"
        return StageView(rank, host, label)

    def _put(self, host: str, ranks: Iterable[int], activity: str) -> None:
        row = self.hosts[host]
        row.ranks, row.activity = list(ranks), activity
        for r in ranks:
            self.stages[r] = self._view(r, host)

    def on_placed(self, placed: Placed) -> None:
        """Where the session put the stages (under `balanced`, maybe not the first hosts; after a host was lost,
        the hosts left: the lost one stays marked so)."""
        activity = _PHASE_ACTIVITY.get(self.phase) or "waiting"
        self.stages = {}
        for name, row in self.hosts.items():
            row.ranks, row.activity = [], "lost" if name in self.lost else "idle"
        if self.lost:  # the next segment's stages: one panel each
            self.shape = (sum(len(part.ranks) for part in placed.stages), 1)
        for part in placed.stages:
            if part.host in self.hosts:
                self._put(part.host, part.ranks, activity)

    def _busy_hosts(self) -> list[HostRow]:
        return [r for r in self.hosts.values() if r.ranks]

    def on_decided(self, decision: Placed | SplitChosen | BaselineReady | HostDropped) -> None:
        """What the session decided once (never worked out again here)."""
        match decision:
            case Placed():
                self.on_placed(decision)
            case HostDropped():
                self.lost.add(decision.host)
                if (row := self.hosts.get(decision.host)) is not None:
                    row.activity = "lost"
            case SplitChosen():
                self.split_points = list(decision.points)
            case BaselineReady():
                self.serial_ips, self.serial_reused = decision.ips, decision.reused

    def on_phase(self, name: str, message: str, now: float | None = None) -> None:
        self.phase, self.phase_message = name, message
        self.phase_since = now or time.time()
        activity = _PHASE_ACTIVITY.get(name)
        busy = self._busy_hosts()
        if name in ("plan", "baseline") and busy:
            for row in busy:
                row.activity = "waiting"
            busy[0].activity = activity or name
        elif activity:
            for row in busy:
                row.activity = activity
        if name == "pipeline":
            self.pipeline_started_at = now or time.time()

    def on_record(self, source: str, host: str, rec: Record, now: float | None = None) -> None:
        now = now or time.time()
        if host in self.hosts:
            self.hosts[host].last_event = now
        if isinstance(rec, Error) and (self.prune is not None or self.train is not None):
            self.phase_message = rec.message
        if source == "prune" and self.prune is not None:
            self.prune.apply(rec)
            return
        if self.train is not None:
            self.train.apply(source, host, rec)
            return
        if source in ("serial", SERIAL_FP32):  # (the fp32 reference of other numerics is not shown)
            if source == "serial" and isinstance(rec, Throughput):
                self.serial_ips = float(rec.ips)
            return
        st = self.stages.get(rec.rank)
        match rec:
            case StageReady() if st:  # (and StageMoved)
                st.modules = list(rec.modules)
            case Refine() | Refined():
                self.refine.append(rec)
            case Progress() if st:
                self._progress(st, rec)
            case Throughput() if not rec.traced:
                self.pipeline_ips.append(float(rec.ips))
            case Accuracy() if rec.applicable:
                self.accuracy = rec.top1
            case Error() if st:
                st.error = rec.message
            case Trace() if st and not rec.file:
                self.trace_note = f"rank {st.rank}: {rec.message}"

    def _progress(self, st: StageView, rec: Progress) -> None:
        t = rec.t or time.time()
        mbs, sent = rec.microbatches, rec.bytes_sent
        chunk = self.options.chunk if self.options else 1
        if st._last and (rec.phase, rec.repeat) == (st.phase, st.repeat) and t > st._last[0] \
                and mbs >= st._last[1]:
            dt = t - st._last[0]
            st.ips.append((mbs - st._last[1]) * chunk / dt)
            st.bytes_per_s = (sent - st._last[2]) / dt
        if st._pass_start is None or (rec.phase, rec.repeat) != (st.phase, st.repeat):
            st._pass_start, st.pass_ips = (t, mbs), None
        elif t > st._pass_start[0] and mbs > st._pass_start[1]:
            st.pass_ips = (mbs - st._pass_start[1]) * chunk / (t - st._pass_start[0])
        st._last = (t, mbs, sent)
        st.phase, st.repeat = rec.phase, rec.repeat
        st.microbatches, st.microbatches_total = mbs, rec.microbatches_total
        if rec.raw_bytes:
            st.wire_ratio = sent / rec.raw_bytes
        st.compute_s, st.wait_s, st.send_s = rec.compute_s, rec.wait_s, rec.send_s

    def on_sample(self, sample: HostSample) -> None:
        row = self.hosts.get(sample.host)
        if row is None:
            return
        row.up, row.error = sample.up, sample.error
        if sample.up:
            row.cpu_pct, row.mem_used_mb, row.mem_total_mb = sample.cpu_pct, sample.mem_used_mb, sample.mem_total_mb
            row.temp_c, row.throttled, row.power_w = sample.temp_c, sample.throttled, sample.power_w
            row.busy_cores, row.cpus, row.runnable, row.cpu_wait = (sample.busy_cores, sample.cpus, sample.runnable,
                                                                    sample.cpu_wait)

    def down_hosts(self) -> str:
        """The hosts the monitor found not answering, each with why ("" when none)."""
        return ", ".join(f"{r.name} ({r.error or 'no answer'})" for r in self.hosts.values() if r.up is False)

    def on_traces(self, grab: TraceRecord) -> None:
        self.traces.append(grab)

    def finish(self, summary: RunSummary | None, ending: Ending) -> None:
        self.running = False
        self.summary, self.ending = summary, ending
        failed_host = self.failure.host if self.failure else None
        for row in self._busy_hosts():
            row.activity = "failed" if row.name == failed_host else ("done" if ending.outcome == "done" else "stopped")
        self.phase, self.phase_message = ending.outcome, ending.error or "finished"
        if summary and summary.traces:
            known = {g.directory for g in self.traces}
            self.traces += [g for g in summary.traces if g.directory not in known]

    # -- derived figures --------------------------------------------------------------------------

    def progress(self, now: float | None = None) -> tuple[float, float | None]:
        """Fraction of the pipeline's steps done (by the last stage) and the seconds left, if known."""
        if self.summary and self.summary.status == "ok":
            return 1.0, None
        if not self.stages:
            return 0.0, None
        last = self.stages[max(self.stages)]
        if not last.microbatches_total:
            return 0.0, None
        o = self.options or NO_RUN
        warmup, repeats = o.warmup, o.repeats
        passes = warmup + repeats + (1 if o.trace_steps else 0)
        index = {"warmup": last.repeat, "calibrate": warmup, "timed": warmup + last.repeat,
                 "trace": warmup + repeats}.get(last.phase, 0)
        done = (index * last.microbatches_total + last.microbatches) / (passes * last.microbatches_total)
        done = min(done, 1.0)
        if not self.running or not self.pipeline_started_at or done <= 0:
            return done, None
        elapsed = (now or time.time()) - self.pipeline_started_at
        return done, elapsed * (1 - done) / done

    def phase_line(self, now: float) -> tuple[str, bool]:
        """What the run is doing now, and whether it is waiting on something slow (launch, profiling, the
        baseline: the panel then shows a spinner and the seconds so far). Once the pipeline reports, the
        line follows its passes instead of the launch message."""
        last = self.stages[max(self.stages)] if self.stages else None
        if self.running and self.phase == "pipeline" and last is not None and last.microbatches_total:
            o = self.options or NO_RUN
            warmup, repeats = o.warmup, o.repeats
            label = {"warmup": f"warm-up pass {last.repeat + 1}/{warmup}", "calibrate": "calibrating the split",
                     "timed": f"timed pass {last.repeat + 1}/{repeats}", "trace": "traced pass"}.get(last.phase,
                                                                                                 last.phase)
            return f"pipeline: {label}", False
        waiting = self.running and self.phase_since is not None
        text = f"{self.phase}: {self.phase_message}"
        if waiting and self.phase_since is not None:
            text += f" ({max(0.0, now - self.phase_since):.0f}s)"
        return text, waiting

    @property
    def live_ips(self) -> float | None:
        if self.summary and self.summary.throughput_ips:
            return self.summary.throughput_ips
        return sum(self.pipeline_ips) / len(self.pipeline_ips) if self.pipeline_ips else None
