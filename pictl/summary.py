"""The run summary (`summary.json`, `--json`): what every reader of a finished run relies on.

`RunSummary` types the fields readers use (headless, the dashboard, history, report, sweeps); a run's
summary is checked against it when it is written and when it is read back, so a summary that breaks
the contract fails in the run that made it, not later in a report. Fields a newer pictl adds pass
through (`extra="allow"`); a change to what is here raises `SUMMARY_SCHEMA`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SUMMARY_SCHEMA = 1


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class SanityFlag(BaseModel):
    """Something that makes a result suspect, with one line saying why (`pictl.run.flags`)."""

    model_config = ConfigDict(extra="forbid")
    code: str
    message: str


class StageFigures(_Open):
    """One stage: where it ran, what it held, and its time per microbatch (compute, waits, sends apart)."""

    rank: int
    host: str | None = None
    threads: int | None = None
    modules: list[str] = []
    params: int = 0
    measured_ms: float | None = None
    predicted_ms: float | None = None
    prediction_error: float | None = None
    wait_ms: float | None = None
    send_ms: float | None = None
    microbatches: int | None = None
    compute_s: float | None = None
    wait_s: float | None = None
    send_s: float | None = None
    bytes_sent: int | None = None
    raw_bytes: int | None = None
    compress_s: float | None = None
    decompress_s: float | None = None
    peak_Bps: float | None = None


class BaselineRecord(_Open):
    """The serial run the speedup divides by: where and when it was measured, and whether it was reused."""

    host: str
    measured_at: float
    reused: bool
    age_s: float
    max_age_s: float | None = None
    state: dict[str, Any] | None = None
    not_reused_because: str | None = None


class LinkFigures(_Open):
    """One link (stage r to r+1) under `--wire`."""

    link: str
    cut: str
    format: str
    wire_bytes: int | None = None
    raw_bytes: int | None = None
    ratio: float | None = None
    compress_s: float | None = None
    decompress_s: float | None = None
    avg_Bps: float | None = None
    peak_Bps: float | None = None


class WireFigures(_Open):
    format: str
    lossy: bool
    min_agreement: float | None = None
    links: list[LinkFigures] = []


class RunError(_Open):
    type: str
    message: str


class RunSummary(_Open):
    schema_version: int = Field(SUMMARY_SCHEMA, alias="schema")
    status: Literal["ok", "failed", "interrupted"]
    run_id: str
    run_dir: str | None = None
    stages: int
    policy: str | None = None
    split_points: list[str] = []
    throughput_ips: float | None = None
    serial_ips: float | None = None
    serial_reused: bool | None = None
    speedup: float | None = None
    efficiency: float | None = None
    outputs_match: bool | None = None
    max_abs_diff: float | None = None
    per_stage: list[StageFigures] = []
    baseline: BaselineRecord | None = None
    flags: list[SanityFlag] = []
    error: RunError | None = None
    wire: WireFigures | None = None
    agreement: float | None = None
    """Lossy wire: the share of images whose top-1 class is the serial run's (None with an exact wire)."""
    mean_abs_diff: float | None = None
    started_at: float | None = None
    duration_s: float | None = None


def checked(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` as written, once it is known to keep the contract (pydantic's ValidationError if not)."""
    RunSummary.model_validate(summary)
    return summary


def age_text(seconds: float) -> str:
    """A duration as people say it: 40 s, 21 min, 3.5 h, 2.0 days."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def baseline_text(summary: dict[str, Any]) -> str:
    """A run summary's serial baseline in a few words: ` (reused, 21 min old)`, ` (measured now)`."""
    base = summary.get("baseline") or {}
    if summary.get("serial_reused"):
        return f" (reused, {age_text(base.get('age_s') or 0.0)} old)"
    return " (measured now)" if base else ""
