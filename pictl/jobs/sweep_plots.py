"""A sweep's plots (`pictl sweep`): speedup against stages beside the ideal line, throughput against chunk
size, throughput against latency per image (one point per configuration), and the wire formats side by side. Each
is a PNG beside the sweep's table, drawn from its rows (`pictl.jobs.sweep_table.sweep_rows`): medians over the
rounds, with their interval as error bars where the rows carry one."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pictl.summary_figures import SweepRowRecord

__all__ = ["plot"]


class PlotRow(SweepRowRecord):
    """A sweep's row as its plots read it (`Open.view`: each value as the table wrote it, never coerced): the
    record's figures and the intervals, bytes and agreement the plots draw besides."""

    throughput_low: Any = None
    throughput_high: Any = None
    speedup_low: Any = None
    speedup_high: Any = None
    bytes_per_image: Any = None
    agreement: Any = None


def plot(out: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """speedup vs stages (with the ideal line); throughput vs chunk when more than one chunk ran; throughput vs
    latency when the runs recorded latency; the wire formats when a run used one other than fp32."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a controller over SSH
    import matplotlib.pyplot as plt

    ok = [r for r in map(PlotRow.view, rows) if r.status == "ok" and r.speedup]
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    stages = sorted({r.stages for r in ok}) or [1]
    ax.plot(stages, stages, "k--", label="ideal")
    series = lambda r: (r.policy, r.chunk, r.wire)  # noqa: E731
    for (policy, chunk, wire), group in itertools.groupby(sorted((r for r in ok if r.stages > 1),
                                                                key=lambda r: (*series(r), r.stages)), key=series):
        g = list(group)
        ax.errorbar([1] + [r.stages for r in g], [1.0] + [r.speedup for r in g],
                    yerr=_bars([None, *g], "speedup"), fmt="o-", capsize=3,
                    label=f"{policy}, chunk {chunk}" + ("" if wire == "fp32" else f", {wire}"))
    written.append(_save(plt, fig, ax, "stages", "speedup over the one serial reference (median, interval)",
                         out / "speedup_vs_stages.png"))
    if len({r.chunk for r in ok}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        key = lambda r: (r.policy, r.stages, r.chunk)  # noqa: E731
        for (policy, n), group in itertools.groupby(sorted(ok, key=key), key=lambda r: (r.policy, r.stages)):
            g = list(group)
            ax.errorbar([r.chunk for r in g], [r.throughput_ips for r in g], yerr=_bars(g, "throughput"),
                        fmt="o-", capsize=3, label=f"{policy}, {n} stage(s)")
        written.append(_save(plt, fig, ax, "chunk (images per microbatch)", "images / s",
                             out / "throughput_vs_chunk.png"))
    timed = [r for r in ok if isinstance(r.latency_p50_ms, int | float)]
    if timed:
        written.append(_plot_latency(plt, timed, out / "throughput_vs_latency.png"))
    if any(r.wire != "fp32" for r in ok if r.stages > 1):
        written.append(_plot_wires(plt, [r for r in ok if r.stages > 1], out / "wire_formats.png"))
    return written


def _bars(rows: Sequence[PlotRow | None], figure: str) -> list[list[float]]:
    """Error bars (below, above) from each row's interval (`speedup_low`, `throughput_high`...): none for a row
    without one (a row of one round, or of an older sweep), and for None (the serial point drawn at 1)."""
    key = "throughput_ips" if figure == "throughput" else figure
    below, above = [], []
    for r in rows:
        value, low, high = ((getattr(r, key), getattr(r, f"{figure}_low"), getattr(r, f"{figure}_high")) if r
                             else (None, None, None))
        known = all(isinstance(v, int | float) for v in (value, low, high))
        below.append(max(0.0, float(value) - float(low)) if known else 0.0)  # type: ignore[arg-type]
        above.append(max(0.0, float(high) - float(value)) if known else 0.0)  # type: ignore[arg-type]
    return [below, above]


def _plot_wires(plt: Any, rows: list[PlotRow], path: Path) -> Path:
    """Per wire format (one group of bars per stage count and chunk): throughput, bytes per image, agreement."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    labels = [f"{r.wire}\n{r.stages}st c{r.chunk} {r.policy}" for r in rows]
    for ax, key, title in zip(axes, ("throughput_ips", "bytes_per_image", "agreement"),
                              ("images / s", "bytes on the wire per image", "top-1 agreement (lossy wires)"),
                              strict=True):
        ax.bar(range(len(rows)), [getattr(r, key) or (1.0 if key == "agreement" else 0) for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_latency(plt: Any, rows: list[PlotRow], path: Path) -> Path:
    """One point per run: its pipeline's latency per image (p50) against its throughput, labelled by what
    it ran (stages, chunk, policy, and the wire when not fp32): the trade-off a chunk size or a stage buys."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, group in itertools.groupby(sorted(rows, key=lambda r: r.policy), key=lambda r: r.policy):
        g = list(group)
        ax.plot([r.latency_p50_ms for r in g], [r.throughput_ips for r in g], "o", label=policy)
        for r in g:
            wire = "" if r.wire == "fp32" else f" {r.wire}"
            ax.annotate(f"{r.stages}st c{r.chunk} {r.policy}{wire}",
                        (r.latency_p50_ms, r.throughput_ips), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    ax.margins(x=0.15, y=0.1)  # room for the labels right of the points
    return _save(plt, fig, ax, "latency per image, p50 (ms)", "images / s", path)


def _save(plt: Any, fig: Any, ax: Any, xlabel: str, ylabel: str, path: Path) -> Path:  # pyplot: untyped
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
