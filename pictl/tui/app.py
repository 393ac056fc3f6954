"""`pictl`: the dashboard. Thin: it composes the widgets and wires them to the services.

Services (RunSession, HostMonitor) run in named workers and report through
messages (`bridge`, `messages`); the state model (`state`) folds them; a 4 Hz
timer renders what changed, so 800 progress events a second cost a few renders,
not 800. Failures of any worker surface in one place, `on_worker_state_changed`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Header
from textual.worker import Worker, WorkerState

from pictl import errors as E
from pictl.cluster.monitor import HostMonitor, HostSample
from pictl.inventory import Cluster
from pictl.planning.options import RunOptions
from pictl.records.runs import default_runs_root
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession
from pictl.run.traces import perfetto_hint
from pictl.tui.bridge import SessionBridge
from pictl.tui.job_runner import DashboardJob, Done
from pictl.tui.jobs import JobsApp
from pictl.tui.messages import Decided, HostHealth, LogLine, PhaseChanged, RankRecord, TracesGrabbed
from pictl.tui.state import DashboardState
from pictl.tui.widgets.board_screen import BoardForm, BoardScreen
from pictl.tui.widgets.confirm import Confirm
from pictl.tui.widgets.help_screen import HelpScreen
from pictl.tui.widgets.history import HistoryScreen
from pictl.tui.widgets.hosts_table import HostsTable
from pictl.tui.widgets.log_view import LogView
from pictl.tui.widgets.run_form import RunForm
from pictl.tui.widgets.run_panel import RunPanel
from pictl.tui.widgets.stage_list import StageList
from pictl.verdict import suspect_error

TRACE_STEPS = 8
RENDER_HZ = 2
PROGRESS_EVERY = 2
"""Frames per draw of the ranks' progress (img/s, the sparklines, the run's progress bar): once a second. A key,
a phase, a record or a host's health still draws at the next frame; progress is a per-second figure, and
drawing it at every frame was half of the dashboard's cost while 4 hosts stream 200 events a second each."""


class PictlApp(JobsApp):
    CSS_PATH = "pictl.tcss"
    TITLE = "pictl"
    BINDINGS = [
        Binding("r", "run", "run"),
        Binding("w", "sweep", "sweep"),
        Binding("p", "prune", "prune"),
        Binding("n", "train", "train", show=False),  # in the palette and help: the footer keeps to 80 columns
        Binding("u", "tune", "tune", show=False),
        Binding("s", "stop", "stop"),
        Binding("t", "traces", "traces"),
        Binding("/", "filter", "filter"),
        Binding("h", "history", "history"),
        Binding("g", "board", "class board", show=False),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit", "quit"),
    ]
    # Classes on the screen by size: the stylesheet keeps speedup, outputs and progress in view on 80x24.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]
    LONG_RUN_S = 30.0
    """A run that took longer than this rings the terminal's bell (and OSC 9) when it ends."""

    def __init__(self, cluster: Cluster, *, runs_root: Path | None = None, monitor: bool = True,
                 clock: Callable[[], float] = time.time, baseline_cache: BaselineCache | None = None,
                 trace_steps: int = TRACE_STEPS, start: tuple[RunOptions, str | None] | None = None) -> None:
        super().__init__()
        self.start_with = start
        """`pictl run` on a terminal: the run to start at once (options, preset), followed in the console."""
        self.run_exit_code: int | None = None
        """How the last run ended, as `pictl run` exits (0 ok; a failure's code): `pictl run` returns it."""
        self.cluster = cluster
        self.runs_root = runs_root or default_runs_root()
        self.state = DashboardState(cluster)
        self.clock = clock
        self.monitor_enabled = monitor
        self.baseline_cache = baseline_cache  # None: the user's cache, shared with `pictl run`
        self.trace_steps = trace_steps
        self.session: RunSession | None = None
        self.bridge = SessionBridge(self.post_message)
        self.last_form: dict = {}
        self.board_folder = ""
        """The folder of bundles the class board (g) last showed: asked for again, filled in."""
        self._dirty: set[str] = set()
        self._frame = 0
        self.sub_title = f"{cluster.name}: {len(cluster.hosts)} host(s) from {cluster.source}"

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield HostsTable(id="hosts")
        with Horizontal(id="middle"):
            yield StageList(id="stages")
            yield RunPanel(id="summary")
        yield LogView(id="logs")
        yield Footer(compact=True, show_command_palette=False)  # every key, quit included, in 80 columns

    def on_mount(self) -> None:
        for widget_id, title in (("hosts", "hosts"), ("stages", "stages"), ("summary", "run"), ("logs", "logs")):
            self.query_one(f"#{widget_id}").border_title = title
        self.render_all()
        self.set_interval(1 / RENDER_HZ, self.render_dirty)
        self.set_interval(1.0, lambda: self._dirty.update({"hosts", "summary"}))
        if self.monitor_enabled:
            def post(sample: HostSample) -> None:
                self.post_message(HostHealth(sample))

            monitor = HostMonitor(self.cluster, post)
            self.run_worker(monitor.run(), name="host monitor", group="monitor", exit_on_error=False)
        if self.start_with is not None:
            self.start_job(self.run_job(*self.start_with))

    # -- rendering ----------------------------------------------------------------------------------

    def render_all(self) -> None:
        self._dirty = {"hosts", "stages", "summary"}
        self.render_dirty()

    def render_dirty(self) -> None:
        try:
            hosts, stages, summary = self.query_one(HostsTable), self.query_one(StageList), self.query_one(RunPanel)
        except NoMatches:
            return  # the app is shutting down: its widgets are removed before its timers stop
        now = self.clock()
        self._frame += 1
        if self._frame % PROGRESS_EVERY == 0:
            self.fold_progress(now)
        dirty, self._dirty = self._dirty, set()
        if "hosts" in dirty:
            hosts.show_state(self.state, now)
        if "stages" in dirty:
            stages.show_state(self.state)
        if "summary" in dirty:
            summary.show_state(self.state, now)

    # -- service messages --------------------------------------------------------------------------

    def on_phase_changed(self, msg: PhaseChanged) -> None:
        self.state.on_phase(msg.name, msg.text, self.clock())
        self.query_one(LogView).add("pictl", "", "stdout", f"{msg.name}: {msg.text}")
        self._dirty.update({"hosts", "summary"})

    def on_decided(self, msg: Decided) -> None:
        self.state.on_decided(msg.decision)
        self._dirty.update({"hosts", "stages", "summary"})

    def on_rank_record(self, msg: RankRecord) -> None:
        self.state.on_record(msg.source, msg.host, msg.record, self.clock())
        self._dirty.update({"stages", "summary", "hosts"})

    def on_log_line(self, msg: LogLine) -> None:
        self.query_one(LogView).add(msg.host, msg.source, msg.stream, msg.line)

    def on_host_health(self, msg: HostHealth) -> None:
        row = self.state.hosts.get(msg.sample.host)
        was_up = row.up if row else None
        self.state.on_sample(msg.sample)
        if was_up and not msg.sample.up:
            self.notify(f"host {msg.sample.host} is not answering: {msg.sample.error}", severity="error")
        self._dirty.add("hosts")

    def fold_progress(self, now: float) -> None:
        """The newest progress of each rank since it was last drawn, into the state."""
        ticks = self.bridge.take_progress()
        for tick in ticks:
            self.state.on_record(tick.source, tick.host, tick.record, now)
        if ticks:
            self._dirty.update({"stages", "summary", "hosts"})

    def on_traces_grabbed(self, msg: TracesGrabbed) -> None:
        self.state.on_traces(msg.grab)
        got, missing, timeline = len(msg.grab.files), msg.grab.missing, msg.grab.timeline
        self.notify(f"{got} rank trace(s) in {msg.grab.directory}"
                    + "".join(f"\nrank {r}: {why}" for r, why in missing.items())
                    + (f"\n{perfetto_hint(timeline)}" if timeline else ""),
                    title="traces", severity="warning" if missing else "information", timeout=10)
        self._dirty.add("summary")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place a failed worker becomes a notice (expected errors arrive as messages)."""
        if event.state == WorkerState.ERROR:
            self.notify(f"{event.worker.name}: {event.worker.error}", severity="error", timeout=10)

    # -- the run -----------------------------------------------------------------------------------

    def run_job(self, options: RunOptions, profile: str | None = None) -> DashboardJob:
        """A run of `options` (measured as preset `profile`), its stages on the panel."""
        def begin() -> None:
            self.state.start_run(options, self.clock())
            self.state.show_job(None)
            self.session = RunSession(self.cluster, options, on_event=self.bridge, runs_root=self.runs_root,
                                      baseline_cache=self.baseline_cache, profile=profile)
            self.state.run_dir = str(self.runs_root / self.session.run_id)

        async def run() -> Done:
            session = self.session  # (begin's: the worker starts after it)
            assert session is not None
            try:
                summary = await session.run()
            except E.PictlError as exc:
                self.run_exit_code = exc.exit_code
                raise
            suspect = suspect_error(summary)
            self.run_exit_code = (E.EXIT_WRITE_FAILED if session.write_error is not None
                                  else suspect.exit_code if suspect is not None else E.EXIT_OK)
            return Done(summary)

        return DashboardJob("run", begin, run, self.last_run_summary)

    async def _grab(self, session: RunSession) -> None:
        try:
            grab = await session.grab_traces(self.trace_steps)
        except E.PictlError as exc:
            self.notify(str(exc), title="traces", severity="warning")
            return
        self.post_message(TracesGrabbed(grab.record()))

    async def stop_run(self) -> None:
        """Cancel the run worker and wait for the session to stop every process it started."""
        runs = [w for w in self.workers if w.group == "run" and w.is_running]
        for worker in runs:
            worker.cancel()
        await self.workers.wait_for_complete(runs)

    # -- actions ------------------------------------------------------------------------------------

    def action_run(self) -> None:
        if self.run_active:
            self.notify("a run is in progress: stop it first (s)", severity="warning")
            return
        if down := self.state.down_hosts():
            self.notify(f"not answering: {down}; a run placed there fails", title="hosts down", severity="warning",
                        timeout=8, markup=False)

        def chosen(result: tuple[RunOptions, str | None] | None) -> None:
            if result is not None:
                options, profile = result
                self.last_form = {"profile": profile, "stages": options.stages, "policy": options.policy,
                                  "split": ",".join(options.split), "chunk": options.chunk, "images": options.images}
                self.start_job(self.run_job(options, profile))

        self.push_screen(RunForm(self.last_form), chosen)

    def action_stop(self) -> None:
        if not self.run_active:
            self.notify("no run to stop", severity="warning")
            return

        async def answered(stop: bool | None) -> None:
            if stop:
                self.state.phase_message = "stopping every rank"
                await self.stop_run()

        self.push_screen(Confirm("Stop the run? Every rank on every host is stopped.", "Stop"), answered)

    def action_traces(self) -> None:
        if not self.run_active or self.session is None or not self.session.pipeline_live:
            self.notify("no pipeline is running: start a run (r) and press t while it runs", title="traces",
                        severity="warning")
            return
        self.notify(f"profiling {self.trace_steps} steps on every rank...", title="traces")
        self.run_worker(self._grab(self.session), name="traces", group="traces", exit_on_error=False)

    def action_filter(self) -> None:
        self.query_one(LogView).open_filter()

    def action_history(self) -> None:
        self.push_screen(HistoryScreen(self.runs_root))

    def action_board(self) -> None:
        def chosen(result: tuple[Path, list] | None) -> None:
            if result is not None:
                folder, rows = result
                self.board_folder = str(folder)
                self.push_screen(BoardScreen(folder, rows))

        self.push_screen(BoardForm(self.board_folder), chosen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def bell_if_long(self) -> None:
        """A long run ended: ring, and ask the terminal for a desktop notification (OSC 9; ignored where
        unsupported), so whoever went for coffee knows."""
        if self.state.started_at is None or self.clock() - self.state.started_at < self.LONG_RUN_S:
            return
        self.bell()
        if self._driver is not None and not self.is_headless:
            self._driver.write("\x1b]9;pictl: run finished\x07")

    async def action_quit(self) -> None:
        """q, ctrl+q and the palette's Quit: a run in progress is stopped on every host first, after asking."""
        if not self.run_active:
            self.exit()
            return

        async def answered(stop: bool | None) -> None:
            if stop:
                await self.stop_run()
                self.exit()

        self.push_screen(Confirm("A run is in progress. Stop it (every rank on every host) and quit?",
                                 "Stop and quit"), answered)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Run", "Start a run (r)", self.action_run)
        yield SystemCommand("Sweep", "Run every combination of stages, chunks and policies (w)", self.action_sweep)
        yield SystemCommand("Tune", "Find the fastest configuration: replicas, stages, threads, chunk, numerics (u)",
                            self.action_tune)
        yield SystemCommand("Prune", "Prune, fine-tune and evaluate a model (p)", self.action_prune)
        yield SystemCommand("Train", "Train across the hosts: single, pipeline or ddp (n)", self.action_train)
        yield SystemCommand("Stop", "Stop the run (s)", self.action_stop)
        yield SystemCommand("Traces", "Grab profiler traces from every rank (t)", self.action_traces)
        yield SystemCommand("History", "Past runs (h)", self.action_history)
        yield SystemCommand("Class board", "A folder of graded bundles, fastest first, as pictl board shows it (g)",
                            self.action_board)
        yield SystemCommand("Filter logs", "Filter the log by host, rank, text (/)", self.action_filter)
