"""The run summary's models (`summary.json`, `--json`): one typed field for every key `pictl.run.summarize` writes.

The top-level `RunSummary` and the records nested in it are what every reader of a finished run relies on
(headless, the dashboard, history, report, sweeps). Each model lets through keys it does not name
(`extra="allow"`): a newer pictl's additions read as they are, and an older pictl's records (which lack the
later keys: every field past the first few has a default) read too. Keys this pictl writes are all typed here;
`tests/unit/test_summary_models.py` checks a real summary leaves nothing untyped.

Reading and writing (the checks, `RecordInvalid`) live in `pictl.summary`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pictl.figure_text import Figure, efficiency_text, ips_text, percent_text, speedup_text
from pictl.summary_figures import (
    ClockReading,
    EnergyFigures,
    HostLossFigures,
    Latencies,
    NumericsFigures,
    Open,
    Prediction,
    RecutFigures,
    Refinement,
    SegmentFigures,
    SerialTiming,
    WaterfallRecord,
    WireFigures,
)

SUMMARY_SCHEMA = 1
LATEST_TIMESTAMP = 253402300799.0
"""9999-12-31 23:59:59 UTC: a later `started_at` is no clock's reading (and no calendar formats it)."""

Timestamp = Annotated[float, Field(ge=0.0, le=LATEST_TIMESTAMP)]
"""Seconds since the epoch, as `time.time()` gives them: finite, not negative, before the year 10000."""


class SanityFlag(BaseModel):
    """Something that makes a result suspect, with one line saying why (`pictl.run.flags`)."""

    model_config = ConfigDict(extra="forbid")
    code: str
    message: str
    invalidates: bool = False
    """The flag makes the result untrue (it ends SUSPECT: `verdict`); the others warn (an older record: none)."""


class StageFigures(Open):
    """One stage: where it ran, what it held, and its time per microbatch (compute, waits, sends apart)."""

    rank: int = Field(ge=0)
    replica: int = Field(default=0, ge=0)
    stage: int | None = Field(default=None, ge=0)
    """The rank's stage in its replica (an older record: its rank)."""
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
    # Where the rank's pass time went beyond compute (`pictl.run.waterfall` reads these).
    recv_post_s: float | None = None
    recv_wait_s: float | None = None
    first_wait_s: float | None = None
    send_post_s: float | None = None
    drain_s: float | None = None
    run_delay_s: float | None = None
    """CPU time the rank's threads waited for while runnable: other processes' load."""
    pass_s: float | None = None
    load_s: float | None = None
    import_rss_mb: float | None = None
    peak_rss_mb: float | None = None


class HostState(Open):
    """A host's CPUs, load, frequency and heat as its probe read them (`pictl.cluster.hoststate`)."""

    time: float | None = None
    cpus: int | None = None
    cpus_online: int | None = None
    cpu_quota: float | None = None
    cpu_list: str | None = None
    """The cores the host's processes are pinned to, as a cpuset list (`cpus` in hosts.toml, or a taskset); None
    when they may run on every CPU."""
    busy_cores: float | None = None
    busy_peak_cores: float | None = None
    runnable: float | None = None
    load1: float | None = None
    load5: float | None = None
    governor: str | None = None
    freq_mhz: float | None = None
    max_freq_mhz: float | None = None
    temperature_c: float | None = None
    throttled: Any = None
    """What the platform reports of throttling (its shape is the host's: `hoststate.throttling` reads it)."""
    boot_id: str | None = None
    mem_available_mb: int | None = None
    """Memory the kernel could give a new process (MemAvailable): what a job's weights must fit."""


class BaselineRecord(Open):
    """The serial run the speedup divides by: where and when it was measured, and whether it was reused."""

    host: str
    measured_at: Timestamp
    reused: bool
    age_s: float
    max_age_s: float | None = None
    state: HostState | None = None
    not_reused_because: str | None = None
    reference_run: str | None = None
    """A comparison's reference handed to the run (`pictl sweep`): the run that measured it."""


class PartOf(Open):
    """The comparison a run was one of (a sweep): its directory, the round and the run's role in it."""

    kind: str
    """`sweep` (or `tune`)."""
    name: str
    """The comparison's directory name, as `pictl runs` shows it."""
    dir: str
    round: int | None = None
    role: Literal["reference", "candidate"] | None = None
    configuration: str | None = None
    """The configuration it measured, as the comparison's table names it."""


class RunError(Open):
    """How a run failed; a rank's failure also says where, with the host's last lines."""

    type: str
    message: str
    host: str | None = None
    rank: int | None = None
    last_lines: list[str] = []


class RankShare(Open):
    """One rank's traced window, in percent of it and per microbatch (`pictl.run.trace_files.rank_breakdown`),
    beside the run's own counters (`against_counters`)."""

    compute_pct: float | None = None
    send_pct: float | None = None
    recv_wait_pct: float | None = None
    idle_pct: float | None = None
    window_ms: float | None = None
    microbatches: int | None = None
    compute_ms: float | None = None
    recv_wait_ms: float | None = None
    send_ms: float | None = None
    """Per traced microbatch: the units of the stage table's compute, wait and send ms."""
    drain_ms: float | None = None
    """What the profiler's stop waited for the window's sends after it (the tracing's own wait: left out)."""
    counters_ms: list[float] | None = None
    """The run's counters for the rank: compute, wait and send ms per microbatch (the stage table's)."""
    differs_points: float | None = None
    """The largest difference between the trace's and the counters' shares of a microbatch, in points."""
    agrees: bool | None = None
    """Within `pictl.run.trace_files.AGREE_POINTS`; where not, `why` says why (the profiler, the window)."""
    why: str | None = None


class TraceRecord(Open):
    """One trace grab as the run (or `pictl traces`, in `traces*/summary.json`) recorded it."""

    id: str | None = None
    directory: str | None = None
    files: dict[str, str] = {}
    missing: dict[str, str] = {}
    """Ranks that delivered no trace, with why."""
    per_rank: dict[str, RankShare] = {}
    timeline: str | None = None


class ArtifactRecord(Open):
    """The pruned model a run ran (`pictl.cluster.artifacts.artifact_summary`): the report's model table."""

    path: str
    digest: str | None = None
    base_model: str | None = None
    ratio: float | None = None
    importance: str | None = None
    params: int | None = None
    params_base: int | None = None
    macs: float | None = None
    macs_base: float | None = None
    top1_before: float | None = None
    top1_pruned: float | None = None
    top1: float | None = None
    dataset: str | None = None


class Startup(Open):
    """Seconds per part of the way to the first image (`pictl.run.timeline`)."""

    connect_s: float | None = None
    push_s: float | None = None
    prepare_s: float | None = None
    plan_s: float | None = None
    baseline_s: float | None = None
    launch_s: float | None = None
    rendezvous_s: float | None = None
    model_load_s: float | None = None
    first_image_s: float | None = None
    total_s: float | None = None
    served_warm: dict[str, bool] = {}
    """Per phase that started processes (profile, plan, baseline, launch): all forked from warm processes."""
    cold_processes: int | None = None
    warm_processes_started: int | None = None
    torch_imports: int | None = None
    """Interpreters that imported torch during the run: the cold processes and the warm processes started."""


class SampleWindow(Open):
    """A host's samples over one window of the run, folded (`pictl.cluster.monitor.summarize_samples`)."""

    samples: int = 0
    runnable_mean: float | None = None
    runnable_max: float | None = None
    cpu_wait_mean: float | None = None
    cpu_pct_mean: float | None = None
    temp_max_c: float | None = None
    throttled: list[Any] = []
    power_w_mean: float | None = None
    """The host's mean power over the window: None where it has no meter pictl can read (`power_source` None
    too), or where its meter's samples left half the window unmeasured (a window shorter than a few sampling
    intervals). `power_source` names the meter, `machine` the boot id (hosts on one machine share a meter)."""
    power_source: str | None = None
    machine: str | None = None


class HostRecord(Open):
    """One host of the run: its ranks, state and versions at the start, and what its samples saw."""

    stages: list[int] = []
    threads: int | None = None
    state: HostState | None = None
    python: str | None = None
    packages: dict[str, str | None] = {}
    checkpoint: dict[str, Any] | None = None
    """{"path", "sha256", "size", "cached"} or {"path", "error"}: the host's hash of the checkpoint it loads."""
    during_baseline: SampleWindow | None = None
    during_pipeline: SampleWindow | None = None
    power_meter: str | None = None
    """The power meter the host's samples read during the run ("pmic", "rapl"), None: it has none pictl reads."""


class RejectedSource(Open):
    host: str
    reason: str


class TelemetryRejected(Open):
    """Records hosts sent that broke the protocol: how many, per host, and the first few reasons."""

    count: int
    hosts: dict[str, int] = {}
    first: list[RejectedSource] = []


class RunSummary(Open):
    """A run's summary.json: every key `pictl.run.summarize` writes (an older record lacks the later ones)."""

    schema_version: int = Field(SUMMARY_SCHEMA, alias="schema")
    status: Literal["ok", "failed", "interrupted"]
    run_id: str
    run_dir: str | None = None
    """Where the run wrote its record; a reader trusts the directory it found the summary in instead."""
    model: str | None = None
    stages: int = Field(ge=1)
    replicas: int = Field(default=1, ge=1)
    """Copies of the pipeline (an older record: one); the run used stages x replicas ranks."""
    replica_ips: list[float] | None = None
    """With replicas: each one's own img/s (its images over its own pass times; `throughput_ips` is every
    image over the slowest replica's)."""
    policy: str | None = None
    artifact: ArtifactRecord | None = None
    split_points: list[str] = []
    images: int | None = None
    chunk: int | None = None
    threads: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    data: str | None = None
    profile: str | None = None
    code: str | None = None
    """The digest of the code the hosts ran (`pictl.cluster.push.manifest_digest` of the pushed tree): what
    `pictl bundle` and `pictl verify` hold a bundle's code to (an older record lacks it)."""
    throughput_ips: Annotated[float | None, Figure(
        "pipeline", "img/s", ips_text, "higher", "Images per second through the pipeline over the timed passes "
        "(with replicas: every image over the slowest replica's time).")] = None
    throughput_spread_ips: list[float] | None = None
    serial_ips: Annotated[float | None, Figure(
        "serial", "img/s", ips_text, "higher", "Images per second of the whole model on one host: what the speedup "
        "divides by.")] = None
    serial_reused: bool | None = None
    serial_peak_rss_mb: float | None = None
    serial_import_rss_mb: float | None = None
    serial_spread_ips: list[float] | None = None
    speedup: Annotated[float | None, Figure(
        "speedup", "x", speedup_text, "higher", "The pipeline's img/s over the serial run's.")] = None
    efficiency: Annotated[float | None, Figure(
        "efficiency", "", efficiency_text, "higher", "The speedup over the ideal one (every rank's share: 1.00 is "
        "N times).")] = None
    outputs_match: bool | None = None
    max_abs_diff: float | None = None
    compared_images: int | None = None
    wire: WireFigures | None = None
    numerics: NumericsFigures | None = None
    recuts: list[RecutFigures] = []
    pass_ips: list[float] = []
    """Each timed pass's img/s, in order (a re-cut run's passes before and after its cuts)."""
    segments: list[SegmentFigures] = []
    """The pipeline's segments: each split on its hosts over its timed passes (one unless it re-cut or lost a
    host)."""
    host_lost: list[HostLossFigures] = []
    """The hosts the run lost and went on without, in order (`stages`, `per_stage` and the split are then the
    last segment's)."""
    agreement: Annotated[float | None, Figure(
        "agreement", "%", percent_text, "higher", "Lossy wire: the share of images whose top-1 class is the serial "
        "run's.")] = None
    """Lossy wire: the share of images whose top-1 class is the serial run's (None with an exact wire)."""
    mean_abs_diff: float | None = None
    accuracy: Annotated[float | None, Figure(
        "accuracy", "%", percent_text, "higher", "The pipeline's top-1 on labelled images (n/a without labels).")] \
        = None
    serial_accuracy: float | None = None
    per_stage: list[StageFigures] = []
    plan_reused: bool | None = None
    traces: list[TraceRecord] = []
    traced_passes: int | None = None
    prediction: Prediction | None = None
    refine: Refinement | None = None
    startup: Startup | None = None
    started_at: Timestamp | None = None
    duration_s: float | None = None
    baseline: BaselineRecord | None = None
    hosts: dict[str, HostRecord] = {}
    telemetry_rejected: TelemetryRejected | None = None
    serial_timing: SerialTiming | None = None
    clocks: dict[str, ClockReading] | None = None
    latency: Latencies | None = None
    waterfall: WaterfallRecord | None = None
    energy: EnergyFigures | None = None
    flags: list[SanityFlag] = []
    verdict: Literal["ok", "suspect"] | None = None
    """A finished run's result: `suspect` when a flag invalidates it (a speedup no exact pipeline reaches, a
    serial baseline something else slowed), `ok` otherwise; None for a run that did not finish, or an older
    record (`pictl.verdict` reads it)."""
    suspect_because: str | None = None
    """Why the result is SUSPECT, in one line: the invalidating flags, the first one's message in full."""
    part_of: PartOf | None = None
    """The comparison (a sweep) the run was measured in, interleaved with the others against one reference."""
    error: RunError | None = None
