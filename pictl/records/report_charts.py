"""The figures of a run's report drawn from its record: each link's bytes per second (read from the ranks'
typed telemetry), where each stage's time went, and what each link carried (PNG charts, matplotlib's Agg)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO, Any

from pictl.events import SERIAL_FP32, parse_event
from pictl.records.files import event_files, read_lines
from pictl.records.train_report import chart_label, md_text, quiet_charts
from pictl.summary import RunSummary
from remote.floor.records import Record
from remote.floor.run_records import Progress, Throughput

MAX_CHART_ITEMS = 64
"""Bars in one chart: more than a cluster has stages or links is not drawn (the tables still list them)."""


def records_of(run_dir: Path, notes: list[str]) -> list[Record]:
    """The pipeline's telemetry records (not the serial run's), checked as the run checked them; a line that
    is not one (cut by a crash, or of another schema) is skipped. Each events file is read as a stream up to
    its cap (`pictl.records.files.read_lines`); what was skipped, or not read (a link), is put in `notes`."""
    out = []
    for name in event_files(run_dir / "events", notes):
        if name.removesuffix(".jsonl") in ("serial", SERIAL_FP32):  # (the serial runs' records are not links')
            continue
        for line in read_lines(run_dir, f"events/{name}", notes):
            record = parse_event(line)
            if record is not None:
                out.append(record)
    return out


def _number(value: Any) -> float | None:
    """`value` as a finite float, or None (text, a bool, NaN, an infinity, an int too big for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def link_rates(summary: RunSummary, records: list[Record]) -> list[dict[str, Any]]:
    """Bytes/s from each stage to the next: average over the timed passes, and the fastest pass."""
    seconds = {r.repeat: r.seconds for r in records if isinstance(r, Throughput) and r.seconds is not None}
    total_s = sum(seconds.values())
    links = []
    for st in summary.per_stage[:-1]:
        per_pass = {r.repeat: r.bytes_sent for r in records
                    if isinstance(r, Progress) and r.rank == st.rank and r.phase == "timed"}
        rates = [per_pass[r] / s for r, s in seconds.items() if r in per_pass and s > 0]
        average = (st.bytes_sent or 0) / total_s / 1e6 if total_s > 0 else None
        links.append({"from": f"{md_text(st.host)} (rank {st.rank})", "to_rank": st.rank + 1,
                      "average_MBps": round(average, 2) if average is not None and math.isfinite(average) else None,
                      "peak_MBps": round(max(rates) / 1e6, 2) if rates else None})
    return links


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def stage_chart(summary: RunSummary, fh: IO[bytes]) -> None:
    """A stacked bar per stage: computing, waiting for input, blocked sending (the timed passes)."""
    plt = _pyplot()
    stages = summary.per_stage[:MAX_CHART_ITEMS]
    labels = [f"{st.rank}\n{chart_label(st.host)}" for st in stages]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stages)), 3.5))
    try:
        bottom = [0.0] * len(stages)
        for key, color in (("compute_s", "#4c72b0"), ("wait_s", "#dd8452"), ("send_s", "#55a868")):
            values = [_number(getattr(st, key)) or 0.0 for st in stages]
            ax.bar(range(len(stages)), values, bottom=bottom, label=key.removesuffix("_s"), color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(stages)), labels)
        _finish(fig, ax, "seconds (timed passes)", "where each stage's time went", fh)
    finally:
        plt.close(fig)


def _finish(fig: Any, ax: Any, ylabel: str, title: str, fh: IO[bytes]) -> None:
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    with quiet_charts():
        ax.legend()
        fig.tight_layout()
        fig.savefig(fh, format="png", dpi=120)


def wire_chart(summary: RunSummary, fh: IO[bytes]) -> None:
    """Per link: MB uncompressed beside MB on the wire (the timed passes)."""
    plt = _pyplot()
    assert summary.wire is not None
    links = summary.wire.links[:MAX_CHART_ITEMS]
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(links)), 3.5))
    try:
        xs = range(len(links))
        ax.bar([x - 0.2 for x in xs], [(_number(k.raw_bytes) or 0.0) / 1e6 for k in links], width=0.4, label="fp32")
        ax.bar([x + 0.2 for x in xs], [(_number(k.wire_bytes) or 0.0) / 1e6 for k in links], width=0.4,
               label="on the wire")
        ax.set_xticks(list(xs), [f"{chart_label(k.link)}\n{chart_label(k.format)}" for k in links])
        _finish(fig, ax, "MB (timed passes)", "what each link carried", fh)
    finally:
        plt.close(fig)
