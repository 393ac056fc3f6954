"""What `pictl tune` leaves behind: its ranked table (80 columns), the Pareto plots (throughput against
agreement with the fp32 serial run, and against latency per image; each point exact or lossy), and the winner
saved as a preset (`profiles/NAME.toml`), so `pictl run --profile NAME` runs the winning configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pictl.jobs.tune import Measured, ranked
from pictl.planning.options import RunOptions
from pictl.planning.presets import PRESET_NAME
from pictl.records.runs import write_bytes_atomic

PRESET_FIELDS = ("model", "num_classes", "stages", "replicas", "policy", "split", "numerics", "wire", "min_agreement",
                 "images", "chunk", "warmup", "repeats", "threads")
"""What a tuned preset fixes: the configuration and the measurement protocol it won under."""


def _short(m: Measured) -> str:
    c = m.candidate
    extra = ("+int8" if c.numerics != "fp32" else "") + (f"+w:{c.wire}" if c.wire != "fp32" else "")
    return f"{c.replicas}x{c.stages}{extra}"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[Measured], best: Measured | None) -> str:
    """Measured candidates first, fastest first, then the predicted rest (`ranked`); fits 80 columns."""
    shown = ranked(rows)
    lines = ["| RxS         | kind  | pred/s | img/s  | x fp32 | agree | p50 ms | verdict |",
             "|-------------|-------|--------|--------|--------|-------|--------|---------|"]
    for m in shown:
        verdict = ("WINNER" if m is best else "kept" if m.kept else "no" if m.status else "-")
        lines.append(f"| {_short(m):<11} | {'lossy' if m.candidate.lossy else 'exact':<5} "
                     f"| {_num(m.predicted_ips, '.1f'):>6} | {_num(m.throughput_ips):>6} "
                     f"| {_num(m.speedup_vs_fp32):>6} | {_num(m.agreement_vs_fp32, '.3f'):>5} "
                     f"| {_num(m.latency_p50_ms, '.0f'):>6} | {verdict:<7} |")
    return "\n".join(lines)


def plot(out: Path, rows: list[Measured]) -> Path | None:
    """tune.png: throughput against agreement and against latency per image, for every measured candidate."""
    done = [m for m in rows if m.throughput_ips]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, value, label in ((left, lambda m: m.agreement_vs_fp32, "top-1 agreement with the fp32 serial run"),
                             (right, lambda m: m.latency_p50_ms, "latency per image, p50 (ms)")):
        for lossy, marker, colour in ((False, "o", "#1f77b4"), (True, "^", "#d62728")):
            pts = [m for m in done if m.candidate.lossy == lossy and value(m) is not None]
            ax.scatter([value(m) for m in pts], [m.throughput_ips for m in pts], marker=marker, color=colour,
                       label="lossy" if lossy else "exact")
            for m in pts:
                ax.annotate(_short(m), (value(m), m.throughput_ips), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("images / s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("pictl tune: every measured configuration")
    fig.tight_layout()
    path = out / "tune.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def preset_text(options: RunOptions, m: Measured, source: str) -> str:
    """A profile for `m`'s configuration: the split it was measured with fixed (`explicit`), so the preset runs
    what won, not what a later `balanced` would choose."""
    values: dict[str, Any] = {k: getattr(options, k) for k in PRESET_FIELDS}
    if m.candidate.stages > 1 and m.split_points:
        values["split"], values["policy"] = list(m.split_points), "explicit"
    else:
        values["split"], values["policy"] = [], "equal"
    about = f"pictl tune winner: {m.candidate.label}, {m.throughput_ips} img/s on {source}"
    lines = [f"description = {json.dumps(about)}"]
    # JSON's strings, numbers, booleans and lists of strings are TOML's too.
    lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def save_preset(directory: Path, name: str, text: str) -> Path:
    if not PRESET_NAME.fullmatch(name):
        raise ValueError(f"--save-as: {name!r} is not a profile name (letters, digits, '-' and '_')")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    write_bytes_atomic(path, text.encode())
    return path
