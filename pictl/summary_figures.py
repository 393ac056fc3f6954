"""The measured figures nested in a run's summary (`pictl.summary_models.RunSummary`): what each link carried,
the numerics against fp32, the re-cuts, `balanced`'s prediction and refinement, the latencies and the speedup
waterfall. Like every summary model, each lets through keys it does not name (`Open`)."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict

from pictl.figure_text import Figure, joules_text, ms_text, watts_text


class Open(BaseModel):
    """A record pictl wrote: its fields typed, keys a newer pictl adds let through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def written(self) -> dict[str, Any]:
        """The record as it was written (summary.json, `--json`): the keys it held, none a default adds."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    @classmethod
    def view(cls, data: dict[str, Any] | None) -> Self:
        """A dict the run is building, read through this model's fields: its own values, neither coerced nor
        checked (an int stays an int in what is written; the summary is checked whole when written), a key it
        lacks read as the field's default. A nested record stays the dict it is: view it through its own model."""
        return cls.model_construct(**(data or {}))

    @classmethod
    def of(cls, value: Any) -> Self:
        """A part of a record read from disk, by field, when it is an object (else every field its default); a
        model of `Any` fields takes each value as written, to be checked where it is used."""
        return cls.model_validate(value) if isinstance(value, dict) else cls()


class LinkFigures(Open):
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


class WireFigures(Open):
    format: str
    lossy: bool
    min_agreement: float | None = None
    links: list[LinkFigures] = []


class NumericsFigures(Open):
    """A run under other numerics than fp32 (`--numerics`): the gain of the numerics and of the parallelism,
    apart, and what the numerics cost against fp32."""

    kind: str
    engines: list[str] = []
    """The quantised engines the pipeline's ranks ran on (fbgemm / x86 on x86, qnnpack on ARM)."""
    serial_ips: float | None = None
    """The serial run in these numerics: what `speedup` and the output check compare with."""
    fp32_serial_ips: float | None = None
    fp32_serial_reused: bool | None = None
    fp32_serial_accuracy: float | None = None
    """The fp32 serial run's top-1 on labelled images (None without labels)."""
    numerics_gain: float | None = None
    """Serial in these numerics over serial in fp32: the numerics alone, on one host."""
    speedup_vs_fp32: float | None = None
    """This run's throughput over the fp32 serial run: numerics and parallelism together."""
    agreement_vs_fp32: float | None = None
    """The share of images whose top-1 class is the fp32 serial run's."""
    mean_abs_diff_vs_fp32: float | None = None
    compared_images: int | None = None


class RecutFigures(Open):
    """One decision of the watch over the timed passes (`remote.floor.recut`)."""

    after_pass: int
    reason: str
    moved: bool
    split_points: list[str] = []
    next_split: list[str] = []
    measured_ms: list[float] = []
    expected_ms: list[float] = []
    predicted_ms: list[float] = []
    next_predicted_ms: list[float] = []
    factors: list[float] = []
    ips_before: float | None = None
    ips_after: float | None = None
    measured_after_ms: list[float] | None = None
    """Each stage's compute per microbatch in the first warm pass on the new split."""


class SegmentFigures(Open):
    """One segment of a run (`pictl.run.segments`): a split on its hosts over a window of timed passes."""

    index: int
    hosts: list[str] = []
    split_points: list[str] = []
    passes: list[int] | None = None
    """[first, last] timed pass (0-based, inclusive); None: it ran none."""
    pass_ips: list[float] = []
    images: int = 0
    """Images through the pipeline in its timed passes."""
    ips: float | None = None
    speedup: float | None = None
    """Its img/s over the run's one serial reference."""
    ended_by: str | None = None
    """`re-cut`, `host-lost`, or None: it ran to the run's end."""
    lost_host: str | None = None
    """The host whose loss ended it (`host-lost`)."""


class HostLossFigures(Open):
    """A host the run lost and went on without (`pictl.run.continuation`)."""

    host: str
    rank: int | None = None
    message: str | None = None
    completed_passes: int = 0
    """Timed passes finished before the loss: the next segment began at this one."""
    stages_before: int | None = None
    stages_after: int | None = None
    hosts_after: list[str] = []
    recomputed_images: int = 0
    """The images of the timed pass in flight, computed again by the next segment."""
    failed_at: float | None = None
    replan_s: float | None = None
    """From the failure seen to the next segment's launch (re-planned and staged)."""
    lost_s: float | None = None
    """From the failure seen to the next segment's first output: the time the loss cost outside any timed pass."""


class LinkCost(Open):
    latency_ms: float | None = None
    MB_per_s: float | None = None
    send_ns_per_byte: float | None = None
    """What a byte sent over the link cost the sender's compute, in ns (measured with the link)."""
    recv_ns_per_byte: float | None = None
    """... and what a byte received cost the receiver's."""


class Prediction(Open):
    """What `--policy balanced` predicted for the split the timed passes ran (`pictl.run.split`)."""

    stage_ms: list[float] = []
    link_ms: list[float] = []
    bottleneck_ms: float | None = None
    profiled: list[str] = []
    """The hosts whose costs were measured for this prediction (the others' came from the cache)."""
    shared_machine: list[list[str]] = []
    """Groups of hosts that are one machine (they share its CPUs)."""
    corrections: dict[str, float] = {}
    """Measured over profiled time, per host, before the run."""
    corrections_age_s: dict[str, float] = {}
    """How old each host's correction was when this run used it (seconds)."""
    links: dict[str, LinkCost] = {}
    links_measured: list[str] = []
    first_split: list[str] = []
    refine: bool | None = None
    corrections_after: dict[str, float] | None = None
    """The corrections the run's refinement found, per host."""


class RefineRound(Open):
    """One calibration pass of `balanced`'s refinement (`remote.floor.refinement`)."""

    round: int | None = None
    split_points: list[str] | None = None
    predicted_ms: list[float] | None = None
    measured_ms: list[float] | None = None
    """Per stage: the median microbatch over every pass of this split so far."""
    low_ms: list[float] | None = None
    high_ms: list[float] | None = None
    """Per stage: the interval the noise leaves around the median."""
    first_round: int | None = None
    """The round in which this split was first measured."""
    passes: int | None = None
    link_ms: list[float] | None = None
    factors: list[float] | None = None
    next_split: list[str] | None = None
    adopted_round: int | None = None
    """The round whose split was adopted after this pass's decision."""
    reason: str | None = None


class Refinement(Open):
    rounds: list[RefineRound] = []
    chosen_round: int | None = None
    """The round whose split the timed passes began on (a re-cut may move it later: `recuts`)."""
    chosen_split: list[str] | None = None
    measured_ms: list[float] | None = None
    low_ms: list[float] | None = None
    high_ms: list[float] | None = None
    passes: int | None = None
    calibration_passes: int | None = None
    """Untimed passes refinement added to start-up (the warm-up's not counted)."""
    calibration_s: float | None = None
    """Seconds refinement added to start-up (its passes and stage rebuilds)."""
    reason: str | None = None


class LatencyFigures(Open):
    """Latency per microbatch, in ms (`pictl.run.latency.summary_ms`)."""

    p50_ms: Annotated[float | None, Figure(
        "p50", "ms", ms_text, "lower", "The median latency of an image, entering the first stage to leaving the "
        "last.")] = None
    p95_ms: Annotated[float | None, Figure(
        "p95", "ms", ms_text, "lower", "The latency 95% of images stay under.")] = None
    p99_ms: Annotated[float | None, Figure(
        "p99", "ms", ms_text, "lower", "The latency 99% of images stay under.")] = None
    mean_ms: float | None = None
    microbatches: int | None = None


class EnergyFigures(Open):
    """Energy per image (`pictl.run.energy`): the run's hosts' mean power over a window, over the images per
    second of that window; None where a host has no meter pictl can read, with the reason beside it."""

    pipeline_j_per_image: Annotated[float | None, Figure(
        "pipeline", "J/img", joules_text, "lower", "Joules per image through the pipeline: its machines' mean "
        "power over its img/s (n/a without a meter).")] = None
    serial_j_per_image: Annotated[float | None, Figure(
        "serial", "J/img", joules_text, "lower", "Joules per image of the serial run on its one host.")] = None
    pipeline_power_w: Annotated[float | None, Figure(
        "pipeline", "W", watts_text, None, "The pipeline's machines' mean power over its timed passes.")] = None
    """All the pipeline's machines together (hosts on one machine counted once: they share its meter)."""
    serial_power_w: Annotated[float | None, Figure(
        "serial", "W", watts_text, None, "The serial run's host's mean power over its timed passes.")] = None
    source: str | None = None
    """The meters read: "pmic" (`vcgencmd pmic_read_adc`, a Pi 5's rails), "rapl" (x86 package counters)."""
    machines: int | None = None
    pipeline_unmeasured: str | None = None
    serial_unmeasured: str | None = None


class SerialTiming(Open):
    """Where the serial run's time went, per image, and its latency per microbatch."""

    compute_per_image_s: float | None = None
    run_delay_per_image_s: float | None = None
    threads: int | None = None
    latency: LatencyFigures | None = None


class ClockReading(Open):
    """A host's clock against the controller's (offset = host clock - ours), or why it could not be read."""

    offset_ns: int | None = None
    uncertainty_ns: int | None = None
    error: str | None = None


class Latencies(Open):
    pipeline: LatencyFigures | None = None
    serial: LatencyFigures | None = None
    clock_aligned: bool | None = None
    traced: LatencyFigures | None = None
    """The --trace-steps pass, for checking against the merged trace."""


class WaterfallTerm(Open):
    term: str
    points: float
    share: float | None = None


class WaterfallRecord(Open):
    """Why the speedup is not N (`pictl.run.waterfall`): the gap split into terms, the dominant one and advice."""

    stages: int | None = None
    """Every rank: replicas x stages (the ideal speedup)."""
    replicas: int | None = None
    speedup: float | None = None
    gap: float | None = None
    settled_from_pass: int | None = None
    """A re-cut run: the first timed pass of its last split (the terms are taken over the passes from it)."""
    bottleneck_rank: int | None = None
    microbatches: int | None = None
    terms: list[WaterfallTerm] = []
    dominant: str | None = None
    advice: str | None = None
    per_image_ms: dict[str, float | None] = {}


class SweepRowRecord(Open):
    """A row of a sweep's sweep.json as the records' readers take it (the trackers, the report): each value as
    written, checked where it is used (a sweep from another pictl, or edited by hand, may hold anything)."""

    status: Any = None
    stages: Any = None
    chunk: Any = None
    policy: Any = None
    wire: Any = "fp32"
    """(A row from before `--wire` has none: it sent fp32.)"""
    throughput_ips: Any = None
    speedup: Any = None
    efficiency: Any = None
    latency_p50_ms: Any = None
    latency_p95_ms: Any = None
    dominant: Any = None


class SweepRecord(Open):
    """A sweep's sweep.json: its rows (`SweepRowRecord`) and options, each as written."""

    rows: Any = None
    options: Any = None
