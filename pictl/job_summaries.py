"""The summaries of training and pruning jobs (`summary.json` of a `pictl train` / `pictl prune` job): their models.

A pruning job builds its summary as the model; a training job's is checked against its model where it is
written (`checked_train`: the dict written stays the one the job built, key for key). Both are read back
through them (`parse_job_summary`): a record of another shape is `RecordInvalid` naming the file and the field,
never a KeyError in a report. Like the run summary's (`pictl.summary_models`), every key pictl writes is typed
and keys a newer pictl adds pass through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from pictl.summary import RecordInvalid, validation_problem
from pictl.summary_models import SUMMARY_SCHEMA, Open, RunError, Timestamp

Status = Literal["ok", "failed", "interrupted"]


# -- training ------------------------------------------------------------------------------------------

class RankPlacement(Open):
    host: str
    ranks: list[int] = []


class LossPoint(Open):
    step: int
    loss: float | None = None


class EvalPoint(Open):
    """Held-out top-1 after an epoch."""

    epoch: int
    step: int | None = None
    top1: float
    correct: int | None = None
    total: int | None = None
    seconds: float | None = None


class TrainPrediction(Open):
    """What `--policy balanced` predicted per microbatch, forward and backward (`pictl.jobs.training.split`)."""

    stage_ms: list[float] = []
    link_ms: list[float] = []
    bottleneck_ms: float | None = None
    profiled: list[str] = []
    backward_factor: float | None = None


class RankBreakdown(Open):
    """One rank's timed steps: seconds per category, their mean per step (ms) and their shares."""

    rank: int
    host: str | None = None
    modules: list[str] = []
    params: int | None = None
    steps: int = 0
    seconds: dict[str, float] = {}
    per_step_ms: dict[str, float | None] = {}
    share: dict[str, float | None] = {}
    bytes_sent: int | None = None
    grad_bytes_sent: int | None = None
    """Pipeline: gradients sent back to the previous stage, in bytes."""
    allreduce_s: float | None = None
    peak_rss_mb: float | None = None


class LossCheckStep(Open):
    step: int
    loss: float | None = None
    reference: float | None = None
    rel_diff: float | None = None


class Fp32Drift(Open):
    """How far bf16 autocast moved the loss from an fp32 single run's: reported, never a failure."""

    steps: int
    max_rel_diff: float | None = None
    per_step: list[LossCheckStep] = []


class LossAgreement(Open):
    """The first steps' losses against a single run's (`pictl.jobs.training.telemetry.agreement`)."""

    steps: int
    tolerance: float
    max_rel_diff: float | None = None
    passed: bool
    per_step: list[LossCheckStep] = []
    reference_host: str | None = None
    reference_reused: bool | None = None
    reference_job: str | None = None
    against: str | None = None
    vs_fp32: Fp32Drift | None = None
    enforced: bool | None = None
    """False: reported, not a failure (a lossy wire moves the loss by design)."""


class TrainedCheckpoint(Open):
    """The trained model, merged from the ranks' parts (`pictl.jobs.training.checkpoint.merge_parts`)."""

    path: str
    tensors: int | None = None
    params: int | None = None
    bytes: int | None = None
    compressor: Literal["removed", "kept"] | None = None
    """A convinsert job: its learned compressor pairs left out of the merged model, or kept in it."""


class TrainWaterfallTerm(Open):
    term: str
    points: float


class TrainWaterfall(Open):
    """Why not every rank was busy (`pictl.jobs.training.waterfall`)."""

    ranks: int | None = None
    efficiency: float | None = None
    bottleneck_rank: int | None = None
    terms: list[TrainWaterfallTerm] = []
    dominant: str | None = None
    step_ms: float | None = None
    ideal_step_ms: float | None = None


class LinkSide(Open):
    avg_MBps: float | None = None
    peak_MBps: float | None = None


class TrainLink(Open):
    """A pipeline link (stage r to r + 1), per step: bytes each way and each side's bandwidth."""

    link: str
    cut: str | None = None
    format: str
    forward_bytes_per_step: int
    backward_bytes_per_step: int
    sender: LinkSide
    receiver: LinkSide


class TrainSummary(Open):
    """A training job's summary.json (`pictl.jobs.training.session`)."""

    kind: Literal["train"]
    schema_version: int = Field(SUMMARY_SCHEMA, alias="schema")
    status: Status
    job_id: str
    job_dir: str | None = None
    mode: Literal["single", "pipeline", "ddp"]
    schedule: str | None = None
    stages: int | None = None
    placement: list[RankPlacement] = []
    model: str | None = None
    model_args: dict[str, Any] = {}
    """timm keyword arguments, as given (`--model-arg`)."""
    data: str | None = None
    amp: bool = False
    batch_size: int
    chunks: int
    microbatch: int
    steps: int | None = None
    steps_done: int = 0
    steps_per_epoch: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    threads: int | None = None
    workers: int | None = None
    """Data-loading processes per image-reading rank (older records: none)."""
    checkpoint_activations: bool | None = None
    lora: int | None = None
    """The LoRA adapters' rank (None: every weight trained, or an older record)."""
    wire: str | None = None
    error_feedback: bool | None = None
    """lowrank cuts sent each image's change (None: no lowrank cut, or an older record)."""
    links: list[TrainLink] = []
    samples_per_s: float | None = None
    losses: list[LossPoint] = []
    evals: list[EvalPoint] = []
    top1: float | None = None
    policy: str | None = None
    split_points: list[str] = []
    prediction: TrainPrediction | None = None
    breakdown: list[RankBreakdown] = []
    agreement: LossAgreement | None = None
    trained_logits: str | None = None
    """Where the trained model's logits on the check images were saved (the run-back check reads them)."""
    checkpoint: TrainedCheckpoint | None = None
    started_at: Timestamp | None = None
    duration_s: float | None = None
    waterfall: TrainWaterfall | None = None
    run_with: str | None = None
    """The command that runs the trained model through the pipeline."""
    error: RunError | None = None


# -- pruning -------------------------------------------------------------------------------------------

class AccuracyPoint(Open):
    """One held-out top-1 the pruning job measured (`remote.pruning`: before, after pruning, per epoch)."""

    phase: str | None = None
    epoch: int | None = None
    top1: float | None = None


class BlockWidths(Open):
    heads: int
    head_dim: int
    mlp: int


class PrunedWidths(Open):
    """The pruned model's widths (`remote.toolkit.artifact.pruned_widths`): uneven under global pruning."""

    embed_dim: int | None = None
    blocks: list[BlockWidths] = []


class PruneSummary(Open):
    """A pruning job's summary.json (`pictl.jobs.prune`): the figures of the Part 3 model table."""

    status: Status
    job_id: str
    job_dir: str | None = None
    where: str | None = None
    """The host that pruned, or "controller"."""
    options: dict[str, Any] = {}
    """The job's options as given (`pictl.jobs.prune.PruneOptions`)."""
    artifact: str | None = None
    base_model: str | None = None
    ratio: float | None = None
    importance: str | None = None
    params_base: int | None = None
    params: int | None = None
    macs_base: float | None = None
    macs: float | None = None
    top1_before: float | None = None
    top1_pruned: float | None = None
    top1_epochs: list[float] = []
    top1: float | None = None
    best_epoch: int | None = None
    widths: PrunedWidths | None = None
    duration_s: float | None = None
    accuracy_trace: list[AccuracyPoint] = []
    error: RunError | None = None


def checked_train(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` as written, once it is known to keep `TrainSummary` (pydantic's ValidationError if not)."""
    TrainSummary.model_validate(summary)
    return summary


def parse_job_summary(path: Path, data: dict[str, Any]) -> TrainSummary | PruneSummary:
    """`data` (read from `path`) as a training job's summary (`kind: "train"`) or a pruning job's, checked;
    RecordInvalid naming the file and the field if it keeps neither."""
    model: type[TrainSummary] | type[PruneSummary] = TrainSummary if data.get("kind") == "train" else PruneSummary
    what = "a training job's summary" if model is TrainSummary else "a pruning job's summary"
    try:
        summary = model.model_validate(data)
    except ValidationError as exc:
        raise RecordInvalid(path, f"not {what} ({validation_problem(exc)})") from None
    if isinstance(summary, TrainSummary) and summary.schema_version > SUMMARY_SCHEMA:
        raise RecordInvalid(path, f"written by a newer pictl (schema {summary.schema_version}; this one reads "
                                  f"{SUMMARY_SCHEMA} and older)")
    return summary
