"""Render a session's events for scripts and terminals.

Progress goes to stderr: a live stage table when stderr is a terminal, plain
throttled lines otherwise. The final figures go to stdout as a table, or as one
JSON object with --json (the table then goes to stderr).
"""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pictl.console import Fields, Fitted, result_console
from pictl.events import SERIAL_FP32, HostOutput, Phase, RankEvent, SessionEvent
from pictl.figure_text import energy_text, figures, ips_text, percent_text, speedup_text
from pictl.headless_generate import print_generate_summary
from pictl.headless_prune import macs_text, print_prune_summary
from pictl.headless_train import TrainProgress, print_train_summary
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.jobs.generation.figures import GenerateSummary
from pictl.records.run_details import energy_line, trace_rank_text
from pictl.records.waterfall_view import latency_of, percentiles_text, waterfall_line, waterfall_of
from pictl.run.traces import perfetto_hint
from pictl.summary import baseline_text
from pictl.summary_models import RunSummary
from pictl.text import figure, markup_safe, printable
from pictl.verdict import result_word
from remote.floor.job_records import (
    PruneAccuracy,
    PruneDone,
    PruneProgress,
    PruneStart,
    TrainEval,
    TrainStart,
    TrainStep,
)
from remote.floor.protocol import WARM_NOTE
from remote.floor.run_records import Error, Progress, Recut, Refine, Refined, StageReady, Throughput

PRUNE_RECORDS = (PruneStart, PruneProgress, PruneAccuracy, PruneDone)


class HeadlessRenderer:
    """Turns session events into stderr progress; `print_summary` prints the result."""

    def __init__(self, *, verbose: bool = False, console: Console | None = None) -> None:
        # soft_wrap: one event per line however long (a log file or CI keeps whole figures and paths); styles
        # only reach a terminal, so a non-terminal gets plain text.
        self.err = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.verbose = verbose
        self._live: Live | None = None
        self._progress: dict[int, tuple[str, Progress]] = {}
        """rank -> (its host, its latest progress)"""
        self._last_line: dict[int, float] = {}
        self._train = TrainProgress(self.err)
        self._warm_noted: set[str] = set()

    def __call__(self, event: SessionEvent) -> None:
        if isinstance(event, Phase):
            self._stop_live()
            self.err.print(f"[bold cyan]pictl[/] {event.name}: {markup_safe(event.message)}")
            if event.name == "pipeline" and self.err.is_terminal:
                self._live = Live(self._table(), console=self.err, refresh_per_second=4, transient=True)
                self._live.start()
        elif isinstance(event, RankEvent):
            self._on_record(event)
        elif isinstance(event, HostOutput) and (self.verbose or event.stream == "stderr" and "Error" in event.line
                                                or self._first_warm_note(event)):
            self.err.print(Text.assemble((event.source, "dim"), " ", printable(event.line)), highlight=False)

    def _first_warm_note(self, event: HostOutput) -> bool:
        """A host's jobs ran cold, and why (`remote.host.warmclient`): said once per host, not once per job."""
        if not event.line.startswith(WARM_NOTE) or event.host in self._warm_noted:
            return False
        self._warm_noted.add(event.host)
        return True

    def _on_record(self, event: RankEvent) -> None:
        rec, rank = event.record, event.record.rank
        match rec:
            case Progress() if event.source not in ("serial", SERIAL_FP32):
                self._progress[rank] = (event.host, rec)
                if self._live:
                    self._live.update(self._table())
                elif time.monotonic() - self._last_line.get(rank, 0.0) >= 5.0:
                    self._last_line[rank] = time.monotonic()
                    self.err.print(f"pictl progress: rank {rank} ({event.host}) {markup_safe(rec.phase)} "
                                   f"{rec.repeat}: {rec.microbatches}/{rec.microbatches_total} microbatches, compute "
                                   f"{rec.compute_s:.2f}s wait {rec.wait_s:.2f}s send {rec.send_s:.2f}s")
            case Progress() if rec.phase == "warmup":  # the serial run's pass, once over: a line, not silence
                self.err.print(f"pictl {_who(event.source)}: warm-up pass {rec.repeat + 1}: {rec.compute_s:.1f} s "
                               "(untimed)")
            case StageReady() if event.source in ("serial", SERIAL_FP32):
                self.err.print(f"pictl {_who(event.source)}: the whole model ({rec.params:,} parameters) built on "
                               f"{markup_safe(event.host)} in {figure(rec.load_s, '.1f')} s")
            case Throughput():
                self.err.print(f"pictl {_who(event.source)}: pass {rec.repeat + 1}: {rec.ips:.2f} img/s")
            case Refine() | Refined():
                self.err.print(printable(refine_line(rec)), markup=False, highlight=False)
            case Recut():
                self.err.print(printable(recut_line(rec)), markup=False, highlight=False)
            case PruneStart() | PruneProgress() | PruneAccuracy() | PruneDone():
                self._on_prune(rec)
            case TrainStart() | TrainStep() | TrainEval():
                self._train(event.source, rec)
            case Error():
                self._stop_live()
                self.err.print(f"[bold red]error[/] {event.source} rank {rank}: {markup_safe(rec.message)}")

    def _on_prune(self, rec: PruneStart | PruneProgress | PruneAccuracy | PruneDone) -> None:
        match rec:
            case PruneStart():
                self.err.print(f"pictl prune: {markup_safe(rec.model)} on {markup_safe(rec.device)}: "
                               f"{rec.params:,} parameters, {macs_text(rec.macs)}; {rec.train_images} training and "
                               f"{rec.eval_images} test images, {rec.classes} classes")
            case PruneAccuracy():
                what = {"before": "before pruning", "pruned": "right after pruning"}.get(rec.phase,
                                                                                      f"after epoch {rec.epoch}")
                extra = (f" ({rec.params:,} parameters, {macs_text(rec.macs)})"
                         if rec.params is not None and rec.macs is not None else "")
                self.err.print(f"pictl prune: top-1 {what}: {rec.top1:.2%}{extra}")
            case PruneProgress() if (rec.step == rec.steps
                                     or time.monotonic() - self._last_line.get(-1, 0.0) >= 5.0):
                self._last_line[-1] = time.monotonic()
                self.err.print(f"pictl prune: epoch {rec.epoch}/{rec.epochs} step {rec.step}/{rec.steps} "
                               f"loss {rec.loss:.4f} {rec.ips:.1f} img/s")

    def _table(self) -> Fitted:
        table = Table(title="stages", expand=False)
        for col in ("rank", "host", "pass", "microbatches", "compute s", "wait s", "send s", "MB sent"):
            table.add_column(col, justify="right" if col not in ("host", "pass") else "left")
        for rank in sorted(self._progress):
            host, r = self._progress[rank]
            table.add_row(str(rank), host, markup_safe(f"{r.phase} {r.repeat}"),
                          f"{r.microbatches}/{r.microbatches_total}", figure(r.compute_s),
                          figure(r.wait_s), figure(r.send_s), figure(r.bytes_sent / 1e6, ".1f"))
        return Fitted(table, ("MB sent", "send s", "wait s"))  # (at 80 columns every heading was cut short)

    def _stop_live(self) -> None:
        if self._live:
            self._live.stop()
            self._live = None

    def close(self) -> None:
        self._stop_live()


def _who(source: str) -> str:
    return {"serial": "serial", SERIAL_FP32: "fp32 serial reference"}.get(source, "pipeline")


def _ms_list(values: list[float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def refine_line(rec: Refine | Refined) -> str:
    """One line per refinement step of `balanced` (a `refine` or `refined` record): what the split measured,
    with its noise, and the decision; at the end, which round's split the timed passes run."""
    if isinstance(rec, Refined):
        if rec.chosen_round is None:  # (a re-cut's: `recut_line` says why)
            return (f"pictl refine: the timed passes run {', '.join(rec.split_points)} (predicted "
                    f"{_ms_list(rec.predicted_ms)} ms per microbatch, {rec.rounds} split(s) measured)")
        added = (f"; refinement added {rec.calibration_passes} untimed pass(es), {rec.calibration_s:.1f} s, to "
                 "start-up" if rec.calibration_passes is not None and rec.calibration_s is not None else "")
        return (f"pictl refine: the timed passes run round {rec.chosen_round}'s split {', '.join(rec.split_points)}: "
                f"{_measured(rec.measured_ms, rec.low_ms, rec.high_ms, rec.passes)}, predicted "
                f"{_ms_list(rec.predicted_ms)} ms per microbatch{added}")
    then = rec.reason or (f"next: {', '.join(rec.next_split)}" if rec.next_split else "refinement is over")
    which = f"round {rec.first_round}'s split, again" if rec.first_round not in (None, rec.round) else ""
    return (f"pictl refine: round {rec.round}: {', '.join(rec.split_points)}{f' ({which})' if which else ''}: "
            f"{_measured(rec.measured_ms, rec.low_ms, rec.high_ms, rec.passes)}, predicted "
            f"{_ms_list(rec.predicted_ms)} ms compute per microbatch; {then}")


def _measured(median: list[float] | None, low: list[float] | None, high: list[float] | None,
              passes: int | None) -> str:
    """ "measured 14.3 / 12.1 ms (slowest 14.3, 13.6-15.0 over 1 pass)": each stage's median microbatch, and
    the slowest stage's interval: the noise a decision had to clear."""
    if not median:
        return "not measured"
    spread = (f" (slowest {max(median):.1f}, {max(low):.1f}-{max(high):.1f}"
              + (f" over {passes} pass(es)" if passes else "") + ")") if low and high else ""
    return f"measured {_ms_list(median)} ms{spread}"


def recut_line(rec: Recut) -> str:
    """One line per decision of the watch over the timed passes."""
    then = (f"re-cut to {', '.join(rec.next_split)} (predicted {_ms_list(rec.next_predicted_ms)})" if rec.moved
            else "no split better by the margin: kept")
    return (f"pictl recut: after timed pass {rec.after_pass + 1}: {rec.reason}; {', '.join(rec.split_points)} "
            f"measured {_ms_list(rec.measured_ms)} ms per microbatch against {_ms_list(rec.expected_ms)} expected; "
            f"{then}")


def segment_lines(s: RunSummary) -> list[str]:
    """A run of more than one segment (it re-cut, or lost a host): each one's hosts, timed passes, split, img/s and
    speedup over the run's one serial reference, and why it ended."""
    if len(s.segments) < 2:
        return []
    ended = {r.after_pass: r for r in s.recuts if r.moved}
    losses = {loss.host: loss for loss in s.host_lost}
    lines = []
    for seg in s.segments:
        passes = f"timed passes {seg.passes[0] + 1}-{seg.passes[1] + 1}" if seg.passes else "no timed pass"
        recut = ended.get(seg.passes[1]) if seg.passes and seg.ended_by == "re-cut" else None
        why = f"; re-cut after timed pass {recut.after_pass + 1} ({recut.reason})" if recut else ""
        if seg.ended_by == "host-lost" and (loss := losses.get(seg.lost_host or "")) is not None:
            cost = f"{loss.lost_s:.1f} s" if loss.lost_s is not None else "unknown time"
            why = (f"; {loss.host} lost ({loss.message or 'no word'}): {cost} to the next segment's first output, "
                   f"{loss.recomputed_images} image(s) computed again")
        lines.append(printable(f"segment {seg.index + 1} on {', '.join(dict.fromkeys(seg.hosts)) or '-'}: {passes}, "
                               f"split {', '.join(seg.split_points) or '-'}: "
                               f"{ips_text(seg.ips)} img/s ({speedup_text(seg.speedup)}){why}"))
    return lines


def explain_lines(s: RunSummary) -> list[str]:
    """Why the speedup is not N (the waterfall, one line), and the latency per image beside the serial's."""
    lines = []
    if (gap := waterfall_of(s)) is not None:
        lines.append("why not N: " + waterfall_line(gap))
    lat = latency_of(s)
    if lat is not None and (lat.pipeline or lat.serial):
        unaligned = " (hosts' clocks not aligned)" if lat.clock_aligned is False else ""
        lines.append(f"latency per image: pipeline {percentiles_text(lat.pipeline)}; serial "
                     f"{percentiles_text(lat.serial)}{unaligned}")
    return [printable(line) for line in lines]


def flag_lines(summary: RunSummary) -> list[str]:
    return [printable(f"flag {f.code}: {f.message}") for f in summary.flags]


def outputs_text(s: RunSummary) -> str:
    """How the output check went: bit-identity with an exact wire, top-1 agreement with a lossy one."""
    wire = s.wire
    if wire is None or not wire.lossy:
        return f"outputs match {s.outputs_match} (max |diff| {s.max_abs_diff})"
    agreed = "-" if s.agreement is None else f"{s.agreement:.2%}"
    bound = "-" if wire.min_agreement is None else f"{wire.min_agreement:.0%}"
    return (f"lossy wire {wire.format}: top-1 agreement {agreed} (at least {bound} passes), max |diff| "
            f"{figure(s.max_abs_diff, '.3g')}, mean |diff| {figure(s.mean_abs_diff, '.3g')}, accuracy "
            f"{percent_text(s.accuracy)} against serial {percent_text(s.serial_accuracy)}")


def wire_lines(s: RunSummary) -> list[str]:
    """One line per link when anything but fp32 travelled."""
    if s.wire is None or s.wire.format == "fp32":
        return []
    return [printable(f"link {k.link} at {k.cut}: {k.format}, {figure((k.wire_bytes or 0) / 1e6, '.2f')} MB on the "
                      f"wire of {figure((k.raw_bytes or 0) / 1e6, '.2f')} MB ({figure(k.ratio, '.3f')}), compress "
                      f"{figure(k.compress_s, '.3f')} s, decompress {figure(k.decompress_s, '.3f')} s, average "
                      f"{figure((k.avg_Bps or 0) / 1e6, '.2f')} MB/s, "
                      f"peak {figure((k.peak_Bps or 0) / 1e6, '.2f')} MB/s")
            for k in s.wire.links]


def numerics_lines(s: RunSummary) -> list[str]:
    """Under other numerics: the speedup against fp32 serial beside the one against the same numerics."""
    n = s.numerics
    if n is None:
        return []
    agreed = "-" if n.agreement_vs_fp32 is None else f"{n.agreement_vs_fp32:.2%}"
    return [printable(
        f"numerics {n.kind} ({', '.join(n.engines) or 'serial only'}): speedup "
        f"{speedup_text(n.speedup_vs_fp32)} over the fp32 serial run ({ips_text(n.fp32_serial_ips)} img/s), "
        f"{speedup_text(s.speedup)} over the {n.kind} serial run; {n.kind} alone "
        f"{speedup_text(n.numerics_gain)} on one host; top-1 agreement with fp32 {agreed} over "
        f"{n.compared_images or '-'} image(s)")]


def replica_lines(s: RunSummary) -> list[str]:
    """With replicas: each one's own img/s beside the aggregate (every image over the slowest one's time)."""
    if not s.replica_ips:
        return []
    return [f"replicas: {' / '.join(figure(v) for v in s.replica_ips)} img/s each; together "
            f"{figure(s.throughput_ips)} img/s (every image over the slowest replica's pass)"]


def energy_lines(s: RunSummary) -> list[str]:
    """Where the energy per image came from (the meters and the power they read), or why it is n/a."""
    return [printable(f"energy per image: {line}")] if (line := energy_line(s)) else []


def detail_lines(s: RunSummary) -> list[str]:
    """The lines under the stage table: replicas, links, numerics, segments (a re-cut run's), why not N, energy."""
    return (replica_lines(s) + wire_lines(s) + numerics_lines(s) + segment_lines(s) + explain_lines(s)
            + energy_lines(s))


RESULT_LINE_LEFT_OUT = ("efficiency", "agreement")
"""Declared figures the result line leaves to others: the efficiency is the speedup over the ideal it names, and
a lossy wire's agreement is in the outputs' field."""


def summary_fields(s: RunSummary) -> list[str]:
    """The result line's fields (printed above the stage table; one line in a file): the run's declared figures
    (`RunSummary`'s `Figure`s) as each declares itself, the outputs' check before the accuracy."""
    copies = f"{s.replicas} replicas x " if s.replicas > 1 else ""
    after = {"serial_ips": baseline_text(s), "speedup": f" (ideal {s.stages * s.replicas}x)"}
    before = {"accuracy": [outputs_text(s)]}
    shown = [field for name, fig, value in figures(s) if name not in RESULT_LINE_LEFT_OUT
             for field in (*before.get(name, []), fig.field(value) + after.get(name, ""))]
    return [printable(field) for field in (
        result_word(s), f"{copies}{s.stages} stage(s)", f"split {', '.join(s.split_points) or '-'}", *shown,
        *([f"energy {energy_text(s.energy.pipeline_j_per_image, s.energy.serial_j_per_image)}"] if s.energy else []))]


STAGE_COLUMNS_LEFT_OUT_FIRST = ("peak RSS MB", "params", "MB sent", "predicted ms", "send ms", "wait ms")
"""Where the terminal is too narrow for the stage table, these go first (summary.json has every figure)."""


def summary_table(s: RunSummary) -> Fitted:
    table = Table()
    predicted = s.prediction is not None
    # Per microbatch: the stage's compute, and apart from it the time it waited for input and was
    # blocked on sends (back-pressure from the next stage).
    cols = ["rank", "host", "modules", "params", "compute ms", "wait ms", "send ms", "MB sent", "peak RSS MB"]
    for col in cols + (["predicted ms", "error"] if predicted else []):
        table.add_column(col, justify="left" if col in ("host", "modules") else "right")
    for st in s.per_stage:
        mods = st.modules
        span = f"{mods[0]} .. {mods[-1]}" if len(mods) > 1 else (mods[0] if mods else "-")
        cells = [str(st.rank), st.host or "-", span, f"{st.params:,}", figure(st.measured_ms, ".1f"),
                 figure(st.wait_ms, ".1f"), figure(st.send_ms, ".1f"),
                 figure(st.bytes_sent / 1e6 if st.bytes_sent is not None else None, ".1f"),
                 figure(st.peak_rss_mb, ".0f")]
        if predicted:  # where the cost model was right or wrong, stage by stage
            error = st.prediction_error
            cells += [figure(st.predicted_ms, ".1f"), "-" if error is None else f"{error:+.0%}"]
        table.add_row(*map(markup_safe, cells))  # module names come from the hosts
    return Fitted(table, STAGE_COLUMNS_LEFT_OUT_FIRST, whole="; summary.json has every figure")


def print_summary(summary: RunSummary, *, as_json: bool) -> None:
    """The result on stdout (with --json the JSON is there, and this on stderr). A file gets each line whole, however
    long (scripts grep them); a terminal gets them broken between fields or words, never inside one."""
    out = result_console(stderr=as_json)
    out.print(Fields(summary_fields(summary)))
    out.print(summary_table(summary))
    for line in detail_lines(summary):
        out.print(line, markup=False, highlight=False)
    for line in flag_lines(summary):
        out.print(line, style="yellow", markup=False, highlight=False)
    # Paths soft-wrapped: one the terminal folds is still one line to copy.
    if summary.run_dir and not as_json:
        out.print(f"run directory: {printable(summary.run_dir)}", markup=False, highlight=False, soft_wrap=True)
    for grab in summary.traces:
        for rank, share in sorted(grab.per_rank.items(), key=lambda kv: kv[0]):  # beside the counters, as runs show
            out.print(printable(f"traced {trace_rank_text(rank, share)}"), markup=False, highlight=False)
        if grab.timeline:
            out.print(printable(f"traces: {perfetto_hint(grab.timeline)}"), markup=False, highlight=False,
                      soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps(summary.written()) + "\n")
        sys.stdout.flush()


def print_result(summary: RunSummary | TrainSummary | PruneSummary | GenerateSummary, *, as_json: bool) -> None:
    """Any job's result, as `pictl run`, `train` and `prune` end: the figures its summary declares, as its kind
    shows them (a run's result line and stage table, a training job's losses and time per rank, a pruning's
    comparison), and the summary as one JSON object on stdout with `as_json`."""
    match summary:
        case RunSummary():
            print_summary(summary, as_json=as_json)
        case TrainSummary():
            print_train_summary(summary, as_json=as_json)
        case PruneSummary():
            print_prune_summary(summary, as_json=as_json)
        case GenerateSummary():
            print_generate_summary(summary, as_json=as_json)
