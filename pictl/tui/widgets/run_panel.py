"""The run at a glance: throughput and latency, serial baseline (reused? how old?), speedup against the ideal
and, once the run is done, why it is not N (the waterfall as one bar of coloured terms, and its line),
accuracy, outputs, progress, and the result's sanity flags."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from pictl.figure_text import efficiency_text, figure_of, interval_text, points_text, speedup_text
from pictl.records.run_details import energy_line, metered, trace_rank_text
from pictl.records.waterfall_view import TERM_COLORS, gap_bar, latency_of, line_text, waterfall_of
from pictl.run.traces import perfetto_hint
from pictl.summary import baseline_text
from pictl.summary_figures import Open
from pictl.summary_models import RunSummary
from pictl.text import figure
from pictl.tui.state import DashboardState
from pictl.tui.widgets.train_panel import train_grid
from pictl.tui.widgets.tune_table import tune_table
from pictl.verdict import shown_status
from remote.floor.run_records import Refine, Refined


def _share(part: float | None, whole: float | None) -> str:
    return f"{part / whole:.0%}" if part is not None and whole else "-"


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f} min"


class SweepRow(Open):
    """A sweep's row as the run panel reads it (`pictl.jobs.sweep_table.row_of`, `sweep_rows`)."""

    place: int | str | None = None
    stages: int | None = None
    policy: str | None = None
    chunk: int | None = None
    wire: str | None = None
    status: str = "?"
    error: str | None = None
    rounds: int | list[Any] | None = None
    throughput_ips: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    efficiency: float | None = None
    reference: str | None = None


def sweep_table(rows: list[dict]) -> RenderableType:
    """The sweep's table as `pictl sweep` ranks it (table.md), in the columns half a terminal holds: place (ties
    share one), median throughput and speedup, the speedup's interval over rounds (`-` from one round),
    efficiency; and, under it, the one reference every speedup divides by (with how many rounds)."""
    table = Table(box=None, padding=(0, 1), header_style="bold")
    # Short headings, as the tune's: the run panel may be half of an 80-column terminal (config: stages, policy,
    # chunk; x: the speedup over the reference).
    for col in ("#", "config", "img/s", "x", "interval", "eff"):
        table.add_column(col, justify="left" if col == "config" else "right", no_wrap=True)
    shown = [SweepRow.view(r) for r in rows]
    for r in shown:
        wire = f" {r.wire}" if r.wire not in (None, "fp32") else ""
        place = str(r.place) if r.place is not None else "-"
        config = (place, f"{r.stages} {r.policy} c{r.chunk}{wire}")
        if r.status != "ok" and not r.rounds:
            table.add_row(*config, Text(r.status, style="red"), "", "", Text(str(r.error or "")[:40], style="red"))
            continue
        interval = interval_text(r.speedup_low, r.speedup_high)
        failed = Text(" (a round failed)", style="red") if r.status != "ok" else ""
        table.add_row(*config, figure(r.throughput_ips), speedup_text(r.speedup), interval,
                      Text.assemble(efficiency_text(r.efficiency), failed))
    reference = next((r.reference for r in shown if r.reference), None)
    if not reference:
        return table
    return Group(table, Text(f"speedups over one reference: {reference}", style="dim"))


def _declared(name: str, value: float | None) -> tuple[str, str]:
    """A run figure's row (live, or the summary's) as `RunSummary` declares it: its label, and its value with its
    unit (`-` or `n/a` alone while there is none)."""
    fig = figure_of(RunSummary, name)
    return fig.label, fig.text(value) if value is None else fig.shown(value)


def result_line(s: RunSummary) -> str:
    """A finished run in one line (the toast): speedup, whether the outputs matched, how many flags."""
    speedup = speedup_text(s.speedup)
    matched = s.outputs_match
    match = "outputs not compared" if matched is None else ("outputs match" if matched else "outputs DIFFER")
    flags = f", {len(s.flags)} flag(s)" if s.flags else ""
    suspect = "SUSPECT: " if shown_status(s) == "suspect" else ""
    return f"{suspect}speedup {speedup}, {match}{flags}"


def refine_text(rec: Refine | Refined) -> str:
    """A refinement round (predicted / measured ms per stage, and what follows), or the final split."""
    def ms(values: list[float]) -> str:
        return "/".join(f"{v:.0f}" for v in values)

    split = ",".join(rec.split_points)
    if isinstance(rec, Refined):
        if rec.chosen_round is not None and rec.measured_ms:  # refinement's: which round's split runs
            return (f"round {rec.chosen_round}'s split {split}, measured {ms(rec.measured_ms)} ms, predicted "
                    f"{ms(rec.predicted_ms)} ms")
        return f"{split} after {rec.rounds} measured split(s), predicted {ms(rec.predicted_ms)} ms"
    then = (f" -> {','.join(rec.next_split)}" if rec.next_split else
            f", then round {rec.adopted_round}'s split" if rec.adopted_round is not None else ", kept")
    return f"{split}: predicted {ms(rec.predicted_ms)}, measured {ms(rec.measured_ms)} ms{then}"


def prune_grid(state: DashboardState) -> Table:
    """A pruning job: what it prunes, where fine-tuning is, top-1 at each step, the artifact."""
    job = state.prune
    assert job is not None
    o, start, prog, done = job.options, job.start, job.progress, job.summary
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    phase_style = {"failed": "bold red", "stopped": "yellow", "done": "green"}.get(state.phase, "cyan")
    grid.add_row("prune", Text(f"{state.phase}: {state.phase_message}", style=phase_style))
    grid.add_row("model", f"{o.model}  {o.importance} importance, ratio {o.ratio}"
                          f"{'  global' if o.global_pruning else ''}  on {job.where}")
    if start:
        grid.add_row("data", f"{start.train_images} training / {start.eval_images} test images, "
                             f"{start.classes} classes, {start.device}")
    for rec in job.accuracy:
        label = {"before": "before", "pruned": "pruned"}.get(rec.phase, f"epoch {rec.epoch}")
        size = f"  {rec.params:,} parameters" if rec.params is not None else ""
        grid.add_row(f"top-1 {label}", f"{rec.top1:.2%}{size}")
    if prog and not done:
        frac = prog.step / max(prog.steps, 1)
        filled = round(frac * 20)
        grid.add_row("fine-tune", f"epoch {prog.epoch}/{prog.epochs} {'█' * filled}{'░' * (20 - filled)} "
                                  f"loss {prog.loss:.4f}  {prog.ips:.0f} img/s")
    if done and done.status == "ok":
        grid.add_row("result", f"top-1 {figure(done.top1, '.2%')} (epoch {done.best_epoch}), "
                               f"{_share(done.params, done.params_base)} of the parameters, "
                               f"{_share(done.macs, done.macs_base)} of the MACs")
    return grid


SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class RunPanel(Static):
    """Re-rendered from the state (a few times per second at most), and only when a figure changed.

    The rows a result is read by (speedup, outputs, progress) come first, so that a 24-line terminal shows
    them, and the flags that make them suspect right under them (at 120x36 they were below the fold); the
    figures, the split, the refinement and traces follow."""

    _shown: tuple = ()

    def show_state(self, state: DashboardState, now: float | None = None) -> None:
        now = now or time.time()
        done, eta = state.progress(now)
        phase_line, waiting = state.phase_line(now)
        prune = state.prune
        pruned = (id(prune.progress), len(prune.accuracy), id(prune.summary)) if prune else None
        train = state.train
        trained = (train.step, len(train.evals), id(train.summary), len(train.ranks)) if train else None
        key = (state.phase, state.phase_message, trained, state.live_ips, state.serial_ips, state.accuracy,
               pruned,
               id(state.summary), len(state.traces), state.trace_note, round(done, 3),
               None if eta is None else round(eta), state.shape[0],
               (sweep.index, len(sweep.rows)) if (sweep := state.sweep) else None, len(state.refine), phase_line,
               int(now * 4) if waiting else None,
               state.run_dir, tuple(state.split_points),
               (tune.trying, id(tune.winner), id(tune.rows)) if (tune := state.tune) else None)
        if key == self._shown:
            return
        self._shown = key
        spinner = f"{SPINNER[int(now * 4) % len(SPINNER)]} " if waiting else ""
        self._render_state(state, done, eta, spinner + phase_line)

    _height: int = -1

    def _show(self, content: RenderableType) -> None:
        """Show `content`; a new layout only when its height changes (a layout pass on every frame was most of
        the dashboard's cost while hosts stream progress)."""
        width = self.content_region.width or self.app.console.width
        height = len(self.app.console.render_lines(content, self.app.console.options.update_width(width), pad=False))
        self.update(content, layout=height != self._height)
        self._height = height

    def _render_state(self, state: DashboardState, done: float, eta: float | None, phase_line: str) -> None:
        if state.prune is not None:
            self._show(prune_grid(state))
            return
        if state.train is not None:
            self._show(train_grid(state, phase_line))
            return
        s = state.summary
        # The ideal is every rank: replicas x stages.
        stages = state.shape[0] * state.shape[1] or None
        ips = state.live_ips
        serial = (s.serial_ips if s else None) or state.serial_ips
        speedup = (s.speedup if s else None) or (ips / serial if ips and serial else None)
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        phase_style = {"failed": "bold red", "stopped": "yellow", "done": "green"}.get(state.phase, "cyan")
        grid.add_row("run", Text(phase_line, style=phase_style))
        suspect = bool(s and shown_status(s) == "suspect")
        # An untrue result is never shown as a plain success: SUSPECT on the speedup's own row, its cause whole
        # under the outputs and progress (folded: it is what the user must read; on a 24-line terminal the
        # speedup, the outputs and the progress come first, and the flags below may be cut short).
        grid.add_row("speedup", Text.assemble(
            speedup_text(speedup) + (f"  of {stages}x ideal" if stages else "")
            + (f"  efficiency {efficiency_text(speedup / stages)}" if speedup and stages else ""),
            *((("  SUSPECT", "bold red"),) if suspect else ())))
        if s and (n := s.numerics):  # the speedup above is the parallelism alone; beside it, numerics and both
            grid.add_row(n.kind, f"{speedup_text(n.speedup_vs_fp32)} over fp32 serial  (alone "
                                 f"{speedup_text(n.numerics_gain)}, top-1 agreement "
                                 + ("-" if n.agreement_vs_fp32 is None else f"{n.agreement_vs_fp32:.1%}") + ")")
        gap = waterfall_of(s) if s else None
        if gap:  # each term's share of the gap in its colour (a gain shaded); the `gap` line names them all
            most = [(f": {t.name}", f"bold {TERM_COLORS.get(t.term, 'white')}") for t in gap.terms
                    if t.term == gap.dominant][:1]
            grid.add_row(f"why not {gap.stages}", Text.assemble(
                gap_bar(gap, 14), f" {points_text(-gap.gap)} points", *most,
                no_wrap=True, overflow="ellipsis"))
        match = s.outputs_match if s else None
        lossy = bool(s and s.wire and s.wire.lossy) or bool(state.options and state.options.wire != "fp32")
        if lossy and s and s.agreement is not None:  # a lossy wire passes by top-1 agreement, not identity
            verdict = f"{'agree' if match else 'DISAGREE'} {s.agreement:.1%} (lossy wire)"
        else:
            verdict = "-" if match is None else ("match" if match else
                                                 f"DIFFER (max |diff| {s.max_abs_diff if s else None})")
        grid.add_row("outputs", Text(verdict + (" (lossy wire)" if lossy and match is None else ""),
                                     style="" if match is None else ("green" if match else "bold red")))
        bar_width = 12
        filled = round(done * bar_width)
        grid.add_row("progress", f"{'█' * filled}{'░' * (bar_width - filled)} {done:.0%}  ETA {_eta(eta)}")
        if s and suspect:
            grid.add_row(Text("SUSPECT", style="bold red"), Text(s.suspect_because or "a flag invalidates the result",
                                                                 style="red", overflow="fold"))
        for i, flag in enumerate(s.flags if s else []):  # what makes the figures suspect: beside them, in view
            grid.add_row(Text("flags" if i == 0 else "", style="bold yellow"),
                         Text(f"{flag.code}: {flag.message}", style="yellow", no_wrap=True, overflow="ellipsis"))
        grid.add_row(*_declared("throughput_ips", ips))
        label, text = _declared("serial_ips", serial)
        grid.add_row(label, text + (baseline_text(s) if s else ("  reused" if state.serial_reused else "")))
        latency = latency_of(s) if s else None
        if latency and latency.pipeline:
            p = latency.pipeline
            grid.add_row("latency", f"p50 {figure(p.p50_ms, '.0f')}  p95 {figure(p.p95_ms, '.0f')} ms"
                         + (f"  serial p50 {figure(latency.serial.p50_ms, '.0f')}" if latency.serial else ""))
        grid.add_row(*_declared("accuracy", s.accuracy if s else state.accuracy))
        if stages:
            policy = state.options.policy if state.options else "-"
            split = ", ".join(s.split_points if s else state.split_points) or policy
            grid.add_row("stages", f"{stages} ({split})")
        if state.refine:  # `balanced` measuring a split and correcting itself: the latest step
            grid.add_row("refine", refine_text(state.refine[-1]))
        if s and metered(s):  # below the speed figures: per image beside the serial run
            # (where no host has a meter the row would only say n/a: the hosts table's power column says so)
            grid.add_row("energy", Text(energy_line(s) or "", no_wrap=True, overflow="ellipsis"))
        if state.run_dir:
            # The run's id first (what `pictl runs show` takes), never folded apart; its directory after it.
            where, _, run_id = state.run_dir.rstrip("/").rpartition("/")
            grid.add_row("record", Text.assemble(run_id, (f"  in {where}", "dim"), overflow="fold"))
        if state.failure:
            f = state.failure
            where = f"host {f.host}" + (f" rank {f.rank}" if f.rank is not None else "")
            grid.add_row(Text("failed", style="bold red"), Text(f"{where}: {f.message}", style="red"))
            for line in f.last_lines[-4:]:
                grid.add_row("", Text(line, style="dim"))
        for grab in state.traces[-1:]:
            grid.add_row("traces", Text(perfetto_hint(grab.timeline) if grab.timeline else str(grab.directory),
                                        overflow="fold"))  # (a path folds, never cut short)
            for rank, share in sorted(grab.per_rank.items(), key=lambda kv: int(kv[0])):
                grid.add_row("", trace_rank_text(rank, share))
            for rank, why in grab.missing.items():
                grid.add_row("", Text(f"rank {rank}: missing ({why})", style="yellow"))
        if state.trace_note:
            grid.add_row("", Text(state.trace_note, style="yellow"))
        if gap:  # the waterfall's line, each term named in its colour as in the bar above; last: it is long
            grid.add_row("gap", line_text(gap))
        if state.tune is not None:  # the tune's table above the candidate being measured, as a sweep's
            self._show(Group(tune_table(state.tune), grid))
            return
        if not state.sweep:
            self._show(grid)
            return
        # The sweep's table gets the panel's full width, above the run it is on: the run's rows (flags, the gap)
        # may be many, and the table is what a sweep is followed by.
        sweep = state.sweep
        self._show(Group(Text.assemble(("sweep", "bold"), f"  run {sweep.index + 1} of {sweep.total}  ",
                                        (sweep.directory, "dim")),
                          sweep_table(sweep.rows), grid))
