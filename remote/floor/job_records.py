"""The records of a prune (`remote.pruning.prune`), a training job (`remote.training.train`) and a generation job
(`remote.generation.generate`).

Each field's kind is declared on its annotation (see `remote.floor.records`); the parser checks a line against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from remote.floor import protocol as P
from remote.floor.records import Bool, Count, Num, Real, Record, Str, Table


@dataclass(frozen=True, kw_only=True)
class PruneStart(Record):
    """The base model's size and the data set's, before pruning."""

    EVENT: ClassVar[str] = P.PRUNE_START
    model: Str
    device: Str
    params: Count
    macs: Count
    train_images: Count
    eval_images: Count
    classes: Count
    ratio: Num | None = None
    importance: Str | None = None
    torch: Str | None = None


@dataclass(frozen=True, kw_only=True)
class PruneProgress(Record):
    """One fine-tuning step."""

    EVENT: ClassVar[str] = P.PRUNE_PROGRESS
    epoch: Count
    epochs: Count
    step: Count
    steps: Count
    loss: Real
    ips: Num


@dataclass(frozen=True, kw_only=True)
class PruneAccuracy(Record):
    """Top-1 before pruning (`phase` "before"), right after ("pruned"), after each epoch ("epoch")."""

    EVENT: ClassVar[str] = P.PRUNE_ACCURACY
    phase: Str
    top1: Num
    epoch: Count | None = None
    params: Count | None = None
    macs: Count | None = None
    widths: Table | None = None
    seconds: Num | None = None


@dataclass(frozen=True, kw_only=True)
class PruneDone(Record):
    """The artifact is complete: its path and its metadata (`remote.toolkit.artifact.ArtifactMeta`)."""

    EVENT: ClassVar[str] = P.PRUNE_DONE
    artifact: Str
    meta: Table


@dataclass(frozen=True, kw_only=True)
class TrainStart(Record):
    EVENT: ClassVar[str] = P.TRAIN_START
    mode: Str
    schedule: Str | None = None
    world_size: Count
    model: Str | None = None
    num_classes: Count | None = None
    model_kwargs: Table | None = None
    batch_size: Count
    chunks: Count
    steps: Count
    steps_per_epoch: Count | None = None
    amp: Bool | None = None
    threads: Count | None = None
    torch: Str | None = None
    pid: Count | None = None


@dataclass(frozen=True, kw_only=True)
class TrainStep(Record):
    """One optimizer step on one rank: its time by category (`times`), and the loss on the loss rank."""

    EVENT: ClassVar[str] = P.TRAIN_STEP
    stage: Count | None = None
    step: Count
    epoch: Count
    seconds: Num
    timed: Bool | None = None
    samples: Count
    lr: Num | None = None
    times: Table | None = None
    loss: Real | None = None


@dataclass(frozen=True, kw_only=True)
class TrainEval(Record):
    EVENT: ClassVar[str] = P.TRAIN_EVAL
    epoch: Count
    step: Count | None = None
    correct: Count
    total: Count
    top1: Num
    seconds: Num | None = None


@dataclass(frozen=True, kw_only=True)
class TrainEnd(Record):
    """A rank finished: its totals by category and the file its weights went to."""

    EVENT: ClassVar[str] = P.TRAIN_END
    stage: Count | None = None
    status: Str | None = None
    steps: Count
    seconds: Num
    times: Table
    bytes_sent: Count | None = None
    grad_bytes_sent: Count | None = None
    """Pipeline: the gradients this rank sent back to the previous stage, in bytes."""
    allreduce_s: Num | None = None
    part_file: Str | None = None
    heads: Table | None = None
    peak_rss_mb: Num | None = None


@dataclass(frozen=True, kw_only=True)
class GenStart(Record):
    """A generation stage (or the serial run) built its layers: which, their parameters, memory and load time."""

    EVENT: ClassVar[str] = P.GEN_START
    stage: Count
    stages: Count
    first_layer: Count
    end_layer: Count
    layers: Count
    """The model's decoder layers in all."""
    params: Count
    load_s: Num
    rss_mb: Num | None = None
    arch: Str | None = None
    numerics: Str | None = None
    engine: Str | None = None
    """The quantised engine an int8 stage runs on (x86, fbgemm, qnnpack)."""
    torch: Str | None = None
    transformers: Str | None = None


@dataclass(frozen=True, kw_only=True)
class GenEnd(Record):
    """A stage finished the timed pass: where its time went over the tokens it handled, what it sent."""

    EVENT: ClassVar[str] = P.GEN_END
    stage: Count
    tokens: Count
    """Positions this stage computed one token's step for (every sequence's every new token)."""
    seconds: Num
    """The timed pass, start to this stage's last step."""
    compute_s: Num
    wait_s: Num
    """Blocked on a receive: the stage before it (or, on the first stage, the next token) was not there yet."""
    send_s: Num
    bytes_sent: Count
    peak_rss_mb: Num | None = None
    tokens_file: Str | None = None
    """The first stage: the generated ids and their arrival times."""
