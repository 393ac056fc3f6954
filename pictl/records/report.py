"""`pictl report RUN_OR_SWEEP...`: a Markdown report with tables and charts, from what runs left on disk.

With pruned models among the sources (runs made with `--model ARTIFACT`, or
`pictl prune` job directories): a table of every model's parameters, MACs, top-1,
serial throughput and pipeline speedup, all against the unpruned serial baseline.
For a run: the headline figures, latency per image, why the speedup is not N (a waterfall chart and its
terms: `report_waterfall`), the serial baseline's age (and why a cached one was not reused), the run's sanity
flags, the per-stage table (with the balanced policy's prediction where there is one), a stacked chart of each
stage's time (computing, waiting for input, blocked sending), and each link's bytes/s, average over the timed
passes and the fastest pass. For a sweep: its table, its runs' latency, and plots. For training jobs (`pictl train`):
a table of every job by mode, and per job where each rank's step time went, with its loss curve.

Run summaries are read through the checked reader (`pictl.summary.read_summary`); a name taken from a
record (a run id, a job id) becomes a file name only through `safe_file_name`, and every file lands in `--out` whole or
not at all (a temporary file renamed into place; a full disk leaves no partial file and exits with
RecordWriteFailed's code). What a record holds reaches the Markdown as text without control characters.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pictl import errors as E
from pictl.figure_text import figures, ms_text, speedup_text
from pictl.job_summaries import PruneSummary, TrainSummary, parse_job_summary
from pictl.records.files import LinkFound, read_regular, refused
from pictl.records.report_charts import link_rates, records_of, stage_chart, wire_chart
from pictl.records.report_sections import host_lost_lines, numerics_lines, recut_lines, refine_lines
from pictl.records.report_waterfall import gap_lines, sweep_latency_lines
from pictl.records.run_details import energy_line
from pictl.records.runs import SUMMARY_FILE, path_exists, path_is_file, writable_dir
from pictl.records.train_report import ReportFiles, job_section, jobs_table, md_text
from pictl.summary import RecordInvalid, RunSummary, age_text, parse_summary, read_json_object, terminal_text
from pictl.summary_figures import Open
from pictl.text import printable
from pictl.verdict import shown_status

MAX_TEXT_BYTES = 4 * 2**20
"""A sweep's table.md is a few kilobytes; more is not one."""
MAX_PLOT_BYTES = 16 * 2**20
"""A sweep's plot is tens of kilobytes; a larger `*.png` is no plot pictl drew: not copied, and said."""


def _read_file(sweep_dir: Path, name: str, limit: int) -> bytes | None:
    """A file of a sweep directory (never through a link: ConfigError naming it), None if over `limit`."""
    try:
        return read_regular(sweep_dir, name, limit)
    except OSError as exc:
        raise E.ConfigError(f"{terminal_text(sweep_dir / name)}: cannot read it ({exc.strerror or exc})") from None


def _read_text(sweep_dir: Path, name: str) -> str:
    """A small text file from a sweep (its table), or ConfigError naming it."""
    data = _read_file(sweep_dir, name, MAX_TEXT_BYTES)
    if data is None:
        raise E.ConfigError(f"{terminal_text(sweep_dir / name)}: not a sweep table pictl wrote (more than "
                            f"{MAX_TEXT_BYTES >> 20} MiB)")
    return data.decode("utf-8", "replace")


def _wire_lines(s: RunSummary, files: ReportFiles) -> list[str]:
    """With `--wire` other than fp32: how the outputs were judged, and each link's bytes and bandwidth."""
    if s.wire is None or s.wire.format == "fp32":
        return []
    wire = s.wire
    judged = (f"**lossy wire** `{md_text(wire.format)}`: top-1 agreement with the serial run {s.agreement} (at least "
              f"{wire.min_agreement} passes), mean |logit diff| {s.mean_abs_diff}." if wire.lossy
              else f"wire `{md_text(wire.format)}` (exact).")
    lines = [judged, "", "| link | cut | format | MB on the wire | MB raw | ratio | compress s | decompress s | "
                         "average MB/s | peak MB/s |", "|---|---|---|---|---|---|---|---|---|---|"]

    def mb(v: float | None) -> str:
        return "-" if v is None else f"{v / 1e6:.2f}"

    for k in wire.links:
        lines.append(f"| {md_text(k.link)} | {md_text(k.cut)} | {md_text(k.format)} | {mb(k.wire_bytes)} | "
                     f"{mb(k.raw_bytes)} | {k.ratio} | {k.compress_s} | {k.decompress_s} | {mb(k.avg_Bps)} | "
                     f"{mb(k.peak_Bps)} |")
    chart = files.chart(s.run_id, "wire", lambda fh: wire_chart(s, fh))
    return [*lines, "", f"![wire bytes per link]({chart})", ""]


HEADLINE_LEFT_OUT = ("agreement", "accuracy")
"""The run's declared figures the report's first table leaves out: a lossy wire's agreement and the accuracy are
written in the outputs' and the models' sections."""
HEADINGS = {"throughput_ips": "throughput img/s"}
"""Headings other than a figure's own (`Figure.heading`)."""


def _headline(s: RunSummary) -> list[str]:
    """The run's headline table: its declared figures (`RunSummary`'s `Figure`s) in their order, each written by
    its own declaration, and whether the outputs matched."""
    shown = [(HEADINGS.get(name) or fig.heading(), fig.text(value)) for name, fig, value in figures(s)
             if name not in HEADLINE_LEFT_OUT]
    cells = [*shown, ("outputs match", str(s.outputs_match))]
    return [f"| {' | '.join(h for h, _ in cells)} |", f"|{'---|' * len(cells)}",
            f"| {' | '.join(v for _, v in cells)} |", ""]


def _run_section(run_dir: Path, s: RunSummary, files: ReportFiles, notes: list[str]) -> list[str]:
    lines = [f"## Run {md_text(s.run_id)}", "",
             (f"{s.replicas} replicas x " if s.replicas > 1 else "")
             + f"{s.stages} stage(s), policy {md_text(s.policy)}, "
             f"split {', '.join(map(md_text, s.split_points)) or '-'}; "
             f"{s.images} images, chunk {s.chunk}, {md_text(s.threads)} thread(s); "
             f"status **{shown_status(s)}**.", "",
             *([f"**SUSPECT**: {md_text(s.suspect_because)}", ""] if shown_status(s) == "suspect" else []),
             *_headline(s),
             *([f"**energy per image**: {md_text(energy)}", ""] if (energy := energy_line(s)) else []),
             *gap_lines(s.run_id, s, files),
             *_wire_lines(s, files),
             *numerics_lines(s), *recut_lines(s), *host_lost_lines(s),
             *_baseline_and_flags(s)]
    if s.stages * s.replicas > 1:
        # Per microbatch: the stage's compute (what `balanced` predicts), and apart from it the time it
        # waited for input and was blocked on sends.
        lines += ["| rank | host | first module | compute ms | wait ms | send ms | MB sent | predicted ms | "
                  "error |", "|---|---|---|---|---|---|---|---|---|"]
        for st in s.per_stage:
            mb = None if st.bytes_sent is None else round(st.bytes_sent / 1e6, 1)
            error = st.prediction_error
            lines.append(f"| {st.rank} | {md_text(st.host)} | {md_text((st.modules or ['-'])[0])} | "
                         f"{ms_text(st.measured_ms)} | {ms_text(st.wait_ms)} | {ms_text(st.send_ms)} | "
                         f"{'-' if mb is None else mb} | {ms_text(st.predicted_ms)} | "
                         f"{'-' if error is None else format(error, '+.1%')} |")
        lines += refine_lines(s.refine)
        chart = files.chart(s.run_id, "stages", lambda fh: stage_chart(s, fh))
        lines += ["", f"![per-stage time]({chart})", "", "| link | average MB/s | fastest pass MB/s |",
                  "|---|---|---|"]
        read: list[str] = []
        for link in link_rates(s, records_of(run_dir, read)):
            lines.append(f"| {link['from']} -> rank {link['to_rank']} | {link['average_MBps']} | "
                         f"{link['peak_MBps']} |")
        lines += ["", *(f"Note: {md_text(n)}" for n in read)] if read else []
        notes += read
    return [*lines, ""]


def _baseline_and_flags(s: RunSummary) -> list[str]:
    """How old the serial baseline is, whether it was reused (or why not), and the run's sanity flags."""
    base = s.baseline
    lines = []
    if base and s.serial_reused:
        lines += [f"Serial baseline: reused, measured on {md_text(base.host)} {age_text(base.age_s)} before this run.",
                  ""]
    elif base:
        why = f"; a cached one was not reused: {md_text(base.not_reused_because)}" if base.not_reused_because else ""
        lines += [f"Serial baseline: measured on {md_text(base.host)} for this run{why}.", ""]
    if s.flags:
        lines += ["**Sanity flags** (these numbers are suspect):", "",
                  *(f"- `{md_text(f.code)}`: {md_text(f.message)}" for f in s.flags), ""]
    elif "flags" in s.model_fields_set:
        lines += ["No sanity flags.", ""]
    return lines


def _plots(sweep_dir: Path) -> list[str]:
    """The names of the sweep's plots (regular `*.png` files: a FIFO or a device named like one is never read);
    ConfigError naming a link among them, its table or its record (a folder from someone else: never
    followed)."""
    try:
        with os.scandir(sweep_dir) as entries:
            found = [(e.name, e.is_symlink(), e.is_file(follow_symlinks=False)) for e in entries
                     if e.name.endswith(".png") or e.name in ("table.md", "sweep.json")]
    except OSError as exc:
        raise E.ConfigError(f"{terminal_text(sweep_dir)}: cannot read it ({exc.strerror or exc})") from None
    for name, link, _ in sorted(found):
        if link:
            raise refused(LinkFound(sweep_dir / name))
    return sorted(name for name, _, regular in found if regular and name.endswith(".png"))


def _sweep_section(sweep_dir: Path, files: ReportFiles, notes: list[str]) -> list[str]:
    lines = [f"## Sweep {md_text(sweep_dir.name)}", "", _read_text(sweep_dir, "table.md"), "",
             *sweep_latency_lines(sweep_dir)]
    for name in _plots(sweep_dir):
        data = _read_file(sweep_dir, name, MAX_PLOT_BYTES)
        if data is None:
            notes.append(f"{terminal_text(sweep_dir / name)}: more than {MAX_PLOT_BYTES >> 20} MiB, no plot pictl "
                         "drew: not copied")
            continue
        stem = name.removesuffix(".png")
        chart = files.chart(sweep_dir.name, stem, _copy_of(data))
        lines += [f"![{md_text(stem)}]({chart})", ""]
    return lines


def _copy_of(data: bytes) -> Callable[[IO[bytes]], None]:
    def fill(fh: IO[bytes]) -> None:
        fh.write(data)

    return fill


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


BASE = "base"
"""The unpruned model's row of the models' table: every speedup there is against its serial run."""


@dataclass
class _ModelRow:
    """One model of the models' table: its size and top-1 (from the pruning job or the run's artifact), its
    serial img/s and its pipelines' (stages, img/s, own serial img/s)."""

    name: str
    params: int | None = None
    macs: float | None = None
    top1_pruned: float | None = None
    top1: float | None = None
    serial_ips: float | None = None
    pipelines: list[tuple[int, float | None, float | None]] = field(default_factory=list)


def models_section(runs: list[RunSummary], prunes: list[PruneSummary]) -> list[str]:
    """The course's Part 3 table: each model's size, accuracy, serial throughput and pipeline speedup,
    all speedups against the unpruned model's serial baseline (the same yardstick for every row)."""
    rows: dict[str, _ModelRow] = {}
    for job in prunes:
        rows.setdefault(job.artifact or job.job_id, _ModelRow(
            f"pruned {job.importance} {job.ratio}", params=job.params, macs=job.macs, top1_pruned=job.top1_pruned,
            top1=job.top1))
        rows.setdefault(BASE, _ModelRow(f"{job.base_model} (unpruned)", params=job.params_base,
                                          macs=job.macs_base, top1=job.top1_before))
    for run in runs:
        art = run.artifact
        key = art.path if art else BASE
        row = rows.setdefault(key, _ModelRow(f"pruned {art.importance} {art.ratio}" if art
                                             else f"{run.model} (unpruned)"))
        if art:
            row.params, row.macs, row.top1_pruned, row.top1 = art.params, art.macs, art.top1_pruned, art.top1
            base = rows.setdefault(BASE, _ModelRow(f"{art.base_model} (unpruned)"))
            base.params, base.macs, base.top1 = art.params_base, art.macs_base, art.top1_before
        row.serial_ips = run.serial_ips or row.serial_ips
        if run.stages > 1 and run.status == "ok":
            row.pipelines.append((run.stages, run.throughput_ips, run.serial_ips))
    if len(rows) < 2:
        return []
    base_serial = unpruned.serial_ips if (unpruned := rows.get(BASE)) else None
    lines = ["## Models: pruned against unpruned", "",
             "Top-1 is measured on the pruning job's held-out data; speedups are against the unpruned "
             "model's serial throughput" + ("" if base_serial else " (no unpruned run given: own serial)") + ".",
             "", "| model | parameters | GMACs | top-1 after pruning | top-1 | serial img/s | serial vs unpruned | "
             "pipeline stages: speedup |", "|---|---|---|---|---|---|---|---|"]
    for key in [BASE, *sorted(k for k in rows if k != BASE)]:
        r = rows.get(key)
        if r is None:
            continue
        serial = r.serial_ips
        # Speedup against the unpruned serial run when there is one, else against the run's own.
        pipes = ", ".join(f"{n}: {speedup_text(ips / yardstick)}" for n, ips, own in sorted(r.pipelines, key=_by_stages)
                          if ips and (yardstick := base_serial or own))
        size = f"{r.params:,} | {(r.macs or 0.0) / 1e9:.2f}" if r.params else "- | -"
        vs_base = speedup_text(serial / base_serial) if serial and base_serial else "-"
        lines.append(f"| {md_text(r.name)} | {size} | {_pct(r.top1_pruned)} | {_pct(r.top1)} | "
                     f"{serial or '-'} | {vs_base} | {pipes or '-'} |")
    return [*lines, ""]


def _by_stages(pipeline: tuple[int, float | None, float | None]) -> tuple[int, float, float]:
    """The pipelines in the order of their stages (then img/s: a None, a run that measured none, first)."""
    n, ips, own = pipeline
    return n, ips or 0.0, own or 0.0


class _JobId(Open):
    job_id: Any = None
    """A training or pruning job's summary names its job (a run's its run)."""


def _load(src: Path) -> RunSummary | TrainSummary | PruneSummary:
    """A source's summary, checked against its model: a run's, a training job's or a pruning job's."""
    path = src / SUMMARY_FILE
    data = read_json_object(path)
    if "run_id" in data:
        return parse_summary(path, data)
    if not isinstance(_JobId.of(data).job_id, str):
        raise RecordInvalid(path, "neither a run's nor a pruning job's summary, nor a training job's "
                                  "(no run_id, no job_id)")
    return parse_job_summary(path, data)


_UNREADABLE = (KeyError, TypeError, AttributeError, ValueError, IndexError, ArithmeticError, RuntimeError)
"""What a record of another shape raises in the code that lays it out (a hand-edited prune summary, a chart
matplotlib cannot draw): named as that source's fault, never a traceback."""


def write_report(sources: list[Path], out: Path, note: Callable[[str], object] = lambda _line: None) -> Path:
    """report.md (and its charts) in `out`; every source is checked before anything is written.

    ConfigError (exit 2) for a source this pictl cannot read, naming it (a link in a sweep directory
    included: never followed); RecordWriteFailed (exit 9) when `out` refuses a file (a full disk): nothing
    half-written is left. What was left out (an events file read only up to its cap, a plot too large to
    be one) is said through `note`, one line each."""
    writable_dir(out, "--out")
    for src in sources:
        if not (path_exists(src / SUMMARY_FILE) or path_is_file(src / "sweep.json")):
            raise E.ConfigError(f"{terminal_text(src)}: not a run directory (summary.json), a sweep directory "
                                f"(sweep.json) or a pruning job")
        if path_is_file(src / "sweep.json"):
            _plots(src)  # a link in it is refused before anything is written
    # (a summary.json that is no regular file, a FIFO, is named by the reader, never opened)
    summaries = {src: _load(src) for src in sources if path_exists(src / SUMMARY_FILE)}
    trains = [s for s in summaries.values() if isinstance(s, TrainSummary)]
    prunes = [s for s in summaries.values() if isinstance(s, PruneSummary) and s.status == "ok"]
    runs = [s for s in summaries.values() if isinstance(s, RunSummary)]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise E.RecordWriteFailed(f"--out: cannot make {terminal_text(out)}: {exc.strerror or exc}") from None
    files = ReportFiles(out)
    try:
        lines = ["# pictl report", "", *models_section(runs, prunes), *(jobs_table(trains) if trains else [])]
    except _UNREADABLE as exc:
        raise E.ConfigError(f"the models and jobs tables: a pruning or training job's summary (or a run's "
                            f"artifact) this pictl cannot read ({type(exc).__name__}: {terminal_text(exc, 200)})") \
            from None
    notes: list[str] = []
    for src in sources:
        try:
            summary = summaries.get(src)
            if path_is_file(src / "sweep.json"):
                lines += _sweep_section(src, files, notes)
            elif isinstance(summary, RunSummary):
                lines += _run_section(src, summary, files, notes)
            elif isinstance(summary, TrainSummary):
                lines += job_section(summary, files)
        except _UNREADABLE as exc:
            # A summary from another pictl version, or edited by hand: name it, do not crash on it.
            raise E.ConfigError(f"{terminal_text(src)}: holds a record this pictl cannot read "
                                f"({type(exc).__name__}: {terminal_text(exc, 200)})") from None
    # The record's strings were made one line each; the sweep's table is read as it is: no control
    # character reaches the Markdown either way.
    text = "\n".join(printable(line) for line in "\n".join(lines).split("\n"))
    report = files.path("report.md")
    files.write(report, _copy_of(text.encode("utf-8", "backslashreplace")))
    for line in notes:
        note(line)
    return report
