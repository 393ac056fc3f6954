"""`pictl report`'s part on why a run's speedup is not N and how long an image takes: per run, the latency
table (pipeline, serial, traced pass), the speedup waterfall as a chart (N stepping down, term by term, to the
measured speedup) with its terms' table, its one line and what would reduce the dominant term; per sweep,
each run's latency beside its throughput when the sweep's rows carry it.

The figures are read through `pictl.records.waterfall_view` (an older summary has none, and gets no section);
charts are written through the report's `ReportFiles` (whole or not at all, inside `--out`).
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from pictl.figure_text import ips_text, points_text, speedup_text
from pictl.records import waterfall_view as wv
from pictl.records.train_report import ReportFiles, chart_label, md_text, quiet_charts
from pictl.summary import RecordInvalid, read_json_object
from pictl.summary_figures import SweepRecord, SweepRowRecord
from pictl.summary_models import RunSummary

__all__ = ["gap_lines", "sweep_latency_lines", "waterfall_chart"]

LOSS, GAIN, RESIDUAL, ENDS = "#c44e52", "#55a868", "#8c8c8c", "#4c72b0"


def waterfall_chart(w: wv.Waterfall, fh: IO[bytes]) -> None:
    """A classic waterfall (PNG into `fh`): N stages at full height, each term a bar floating from the level
    the one before left (a loss red, a gain green, the residual grey), the measured speedup at full height."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a controller over SSH
    import matplotlib.pyplot as plt

    labels = [f"{w.stages} stages", *(chart_label(t.name) for t in w.terms), "measured"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels)), 4.0))
    try:
        level = float(w.stages)
        ax.bar(0, level, color=ENDS)
        ax.annotate(f"{level:.2f}", (0, level), ha="center", va="bottom", fontsize=8)
        for x, t in enumerate(w.terms, start=1):
            after = level + t.points
            color = RESIDUAL if t.term == "residual" else (LOSS if t.points < 0 else GAIN)
            ax.bar(x, abs(t.points), bottom=min(level, after), color=color)
            ax.plot([x - 1.4, x + 0.4], [level, level], color="#444444", linewidth=0.6, linestyle=":")
            ax.annotate(points_text(t.points), (x, max(level, after)), ha="center", va="bottom", fontsize=8)
            level = after
        end = len(w.terms) + 1
        ax.bar(end, w.speedup, color=ENDS)
        ax.annotate(speedup_text(w.speedup), (end, w.speedup), ha="center", va="bottom", fontsize=8)
        ax.axhline(w.stages, color="#444444", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("speedup over serial (x)")
        ax.set_title(f"why not {w.stages}x: {speedup_text(w.speedup)} measured, term by term")
        ax.grid(alpha=0.3, axis="y")
        ax.margins(y=0.12)  # room for the labels above the tallest bar
        with quiet_charts():
            fig.tight_layout()
            fig.savefig(fh, format="png", dpi=120)
    finally:
        plt.close(fig)


def _cell(text: object) -> str:
    """A record's string as a Markdown table cell (a `|` would end the cell)."""
    return md_text(text).replace("|", "\\|")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def latency_lines(latency: wv.Latency) -> list[str]:
    lines = ["Latency per image (ms; the images of a microbatch enter and leave with it):", "",
             "| | p50 | p95 | p99 | mean | microbatches |", "|---|---|---|---|---|---|"]
    for label, p in (("pipeline", latency.pipeline), ("serial", latency.serial), ("traced pass", latency.traced)):
        if p is not None:
            lines.append(f"| {label} | {_ms(p.p50_ms)} | {_ms(p.p95_ms)} | {_ms(p.p99_ms)} | {_ms(p.mean_ms)} | "
                         f"{'-' if p.microbatches is None else p.microbatches} |")
    if latency.clock_aligned is False:
        lines += ["", "The hosts' clocks were not aligned: the pipeline's latency holds their offset."]
    return [*lines, ""]


def gap_lines(run_id: str, summary: RunSummary, files: ReportFiles) -> list[str]:
    """A run's latency table and its waterfall (chart, terms, line, advice); nothing for an older summary."""
    latency, w = wv.latency_of(summary), wv.waterfall_of(summary)
    lines = latency_lines(latency) if latency else []
    lines += [f"_The record's `{key}` is not in a shape this pictl reads._\n" for key in ("latency", "waterfall")
              if wv.unreadable(summary, key)]
    if w is None:
        return lines
    chart = files.chart(run_id, "waterfall", lambda fh: waterfall_chart(w, fh))
    lines += [f"### Why not {w.stages}x", "", md_text(wv.waterfall_line(w)), "",
              f"![speedup waterfall]({chart})", "", "| term | speedup points | share of the gap |", "|---|---|---|"]
    for t in w.terms:
        name = _cell(t.name)
        lines.append(f"| {f'**{name}**' if t.term == w.dominant else name} | {points_text(t.points)} | "
                     f"{wv.shown_share(w, t)} |")
    lines.append(f"| gap | {points_text(-w.gap)} | {'100%' if w.gap > wv.GAP_EPSILON else '-'} |")
    if note := wv.share_note(w):
        lines += ["", md_text(note[0].upper() + note[1:]) + "."]
    if w.dominant:
        lines += ["", f"Dominant term: **{_cell(w.dominant.replace('_', ' '))}**. What would reduce it: "
                      f"{md_text(w.advice or '-')}."]
    return [*lines, ""]


def sweep_latency_lines(sweep_dir: Path) -> list[str]:
    """A sweep's runs, throughput beside latency and the dominant term, when its rows carry latency (a sweep
    from an older pictl does not: nothing is shown)."""
    try:
        found = SweepRecord.of(read_json_object(sweep_dir / "sweep.json")).rows
    except RecordInvalid:
        return []
    rows = [SweepRowRecord.of(r) for r in found if isinstance(r, dict)] if isinstance(found, list) else []
    if not any(_number(r.latency_p50_ms) is not None for r in rows):
        return []
    lines = ["Throughput beside latency per image (pipeline, ms):", "",
             "| stages | chunk | policy | wire | img/s | latency p50 | latency p95 | dominant loss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {_cell(r.stages)} | {_cell(r.chunk)} | {_cell(r.policy)} | {_cell(r.wire)} | "
                     f"{ips_text(_number(r.throughput_ips))} | {_ms(_number(r.latency_p50_ms))} | "
                     f"{_ms(_number(r.latency_p95_ms))} | {_cell(r.dominant or '-')} |")
    return [*lines, ""]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < wv.LIMIT:
        return None
    return float(value)
