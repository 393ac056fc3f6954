"""The records of an inference run (`remote.runtime`) and of cost profiling (`remote.profiling.costs`).

Each field's kind is declared on its annotation (see `remote.floor.records`); the parser checks a line against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from remote.floor import protocol as P
from remote.floor.records import Bool, Count, Counters, Counts, Int, List, Num, Nums, Record, Str, Strs


@dataclass(frozen=True, kw_only=True)
class RunStart(Record):
    EVENT: ClassVar[str] = P.RUN_START
    world_size: Count | None = None
    stages: Count | None = None
    model: Str | None = None
    images: Count | None = None
    chunk: Count | None = None
    threads: Count | None = None
    torch: Str | None = None
    import_rss_mb: Num | None = None
    pid: Count | None = None


@dataclass(frozen=True, kw_only=True)
class StageReady(Record):
    """A rank built its stage (and for `stage_moved`, rebuilt it after refinement)."""

    EVENT: ClassVar[str] = P.STAGE_READY
    stage: Count | None = None
    modules: Strs
    pieces: Strs | None = None
    params: Count
    load_s: Num | None = None
    rss_mb: Num | None = None
    peak_rss_mb: Num | None = None
    rendezvous_s: Num | None = None
    engine: Str | None = None
    """The quantised engine an int8-dynamic stage runs on (`remote.toolkit.numerics`); None: fp32."""


@dataclass(frozen=True, kw_only=True)
class StageMoved(StageReady):
    EVENT: ClassVar[str] = P.STAGE_MOVED


@dataclass(frozen=True, kw_only=True)
class Progress(Record, Counters):
    EVENT: ClassVar[str] = P.PROGRESS
    stage: Count | None = None
    phase: Str
    repeat: Int
    microbatches_total: Count


@dataclass(frozen=True, kw_only=True)
class Throughput(Record):
    EVENT: ClassVar[str] = P.THROUGHPUT
    repeat: Int
    images: Count | None = None
    seconds: Num | None = None
    ips: Num
    traced: Bool | None = None
    replica_seconds: Nums | None = None
    """With replicas: each replica's pass time (the pass's `seconds` is the largest)."""


@dataclass(frozen=True, kw_only=True)
class Accuracy(Record):
    EVENT: ClassVar[str] = P.ACCURACY
    applicable: Bool
    correct: Count | None = None
    total: Count | None = None
    top1: Num | None = None


@dataclass(frozen=True, kw_only=True)
class Outputs(Record):
    EVENT: ClassVar[str] = P.OUTPUTS
    logits_file: Str
    logits_shape: List | None = None


@dataclass(frozen=True, kw_only=True)
class FirstOutput(Record):
    EVENT: ClassVar[str] = P.FIRST_OUTPUT
    stage: Count | None = None


@dataclass(frozen=True, kw_only=True)
class RunEnd(Record, Counters):
    EVENT: ClassVar[str] = P.RUN_END
    stage: Count | None = None
    status: Str | None = None
    peak_rss_mb: Num | None = None


@dataclass(frozen=True, kw_only=True)
class Error(Record):
    EVENT: ClassVar[str] = P.ERROR
    message: Str
    kind: Str | None = None
    traceback: Str | None = None


@dataclass(frozen=True, kw_only=True)
class Plan(Record):
    """The model's pieces cut into stages, before anything is built (`remote.runtime.plan`)."""

    EVENT: ClassVar[str] = P.PLAN
    model: Str | None = None
    split_points: Strs | None = None
    total_params: Count | None = None
    max_stages: Count | None = None
    num_classes: Count | None = None
    stages: List | None = None
    spec_file: Str | None = None
    cuts: Strs | None = None
    """Every place a stage may begin (the model's pieces after its first): `pictl run --list-splits`."""


@dataclass(frozen=True, kw_only=True)
class Costs(Record):
    """One host's cost profile for `balanced` (`remote.profiling.costs`)."""

    EVENT: ClassVar[str] = P.COSTS
    pieces: Strs
    compute_s: Nums
    passes: Count
    pass_ms: Num
    spread: Num
    attempts: Count
    comm_s_per_byte: Num
    cut_bytes: Counts
    piece_bytes: Counts
    chunk: Count
    threads: Count
    model: Str | None = None
    torch: Str
    measured_from: Num
    measured_until: Num


@dataclass(frozen=True, kw_only=True)
class Trace(Record):
    EVENT: ClassVar[str] = P.TRACE
    stage: Count
    id: Str
    file: Str | None = None
    message: Str | None = None
    start_step: Count | None = None
    steps: Count | None = None
    export_s: Num | None = None


@dataclass(frozen=True, kw_only=True)
class Refine(Record):
    """One calibration pass of `balanced`'s refinement (`remote.floor.refinement`): the split it measured, that
    split's stages over all its passes so far (median and interval), and the decision."""

    EVENT: ClassVar[str] = P.REFINE
    round: Count
    split_points: Strs
    predicted_ms: Nums
    measured_ms: Nums
    """Per stage: the median microbatch over every pass of this split so far."""
    low_ms: Nums | None = None
    high_ms: Nums | None = None
    """Per stage: the interval the noise leaves around the median."""
    first_round: Count | None = None
    """The round in which this split was first measured (this pass repeats it when it is smaller)."""
    passes: Count | None = None
    link_ms: Nums | None = None
    factors: Nums
    next_split: Strs | None = None
    """The split the next calibration pass measures (a new one, or one measured again); None: refinement
    is over."""
    adopted_round: Count | None = None
    """The round whose split is adopted after this decision."""
    reason: Str | None = None


@dataclass(frozen=True, kw_only=True)
class Refined(Record):
    """The split the timed passes run: after refinement (`chosen_round` set), or after a re-cut (None)."""

    EVENT: ClassVar[str] = P.REFINED
    rounds: Count
    split_points: Strs
    predicted_ms: Nums
    link_ms: Nums | None = None
    factors: Nums
    chosen_round: Count | None = None
    """The round in which the split the timed passes run was first measured."""
    measured_ms: Nums | None = None
    low_ms: Nums | None = None
    high_ms: Nums | None = None
    passes: Count | None = None
    """Calibration passes of the chosen split."""
    calibration_passes: Count | None = None
    """Untimed passes refinement added (the warm-up's not counted)."""
    calibration_s: Num | None = None
    """Seconds from the end of the warm-up to the first timed pass: what refinement added to start-up."""
    reason: Str | None = None


@dataclass(frozen=True, kw_only=True)
class Recut(Record):
    """`remote.floor.recut.Watch` decided after timed pass `after_pass`: why, the factors it corrected to, and the
    split before and after (the same when no split was better by the margin), with their predictions."""

    EVENT: ClassVar[str] = P.RECUT
    after_pass: Int
    reason: Str
    split_points: Strs
    next_split: Strs
    moved: Bool
    measured_ms: Nums
    expected_ms: Nums
    predicted_ms: Nums
    """The old split under the corrected factors (stages, then links)."""
    next_predicted_ms: Nums
    factors: Nums


@dataclass(frozen=True, kw_only=True)
class PassWatched(Record):
    """Rank 0, after timed pass `after_pass` of a run that re-cuts: every stage's median compute per microbatch in
    it. The controller's watch judges it (`pictl.run.segments`) and answers in `protocol.recut_decision_file`."""

    EVENT: ClassVar[str] = P.PASS_WATCHED
    after_pass: Int
    measured_ms: Nums


@dataclass(frozen=True, kw_only=True)
class MbTimes(Record):
    EVENT: ClassVar[str] = P.MB_TIMES
    side: Str
    phase: Str
    repeat: Int
    first: Count
    base: Num
    times: Nums
