"""A training job as a person asks for it, checked before anything starts, and the spec the hosts get.

Every mode trains the same function (`remote.floor.spec.TrainSpec`): same seed, global batch, microbatches
and learning-rate schedule; what differs is where the work runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pictl import errors as E
from pictl.planning.options import MAX_IMAGES
from pictl.records.trackers import Tracker
from pictl.validation import Namer, problem_line
from remote.floor.spec import DataSpec, TrainSpec
from remote.floor.wire import parse_wire

Mode = Literal["single", "pipeline", "ddp"]
Schedule = Literal["gpipe", "1f1b"]
TrainPolicy = Literal["equal", "balanced", "explicit"]
LOSS_TOLERANCE = 1e-3
"""fp32: a mode's loss at each checked step may differ from `single`'s by this much, relative to
max(1, |loss|). The modes compute the same sums in other orders, so they differ by rounding only
(measured: the first steps agree to 6 decimals); a stage that trains wrongly is off by far more."""
BALANCED_MODELS = ("deit_", "deit3_", "vit_")
"""What `--policy balanced` can profile: the inference cost profiles split timm VisionTransformers only."""
AMP_LOSS_TOLERANCE = 1e-2
"""With --amp the reference is single under --amp too: the modes compute the same bf16 operations on the
same microbatches and differ by the order of fp32 sums, which bf16 rounding can amplify a little. (Against
fp32 the loss moves by far more, 7 % at step 2 for MobileNetV2 on CIFAR-10, in every mode alike: that
distance is reported as `vs_fp32`, never failed.)"""


def chunks_refusal(mode: str, schedule: str, stages: int, chunks: int) -> str | None:
    """Why `chunks` microbatches per step cannot run as `mode` on `stages` ranks, or None (a sweep leaves
    such a combination out; a job is refused)."""
    if mode == "pipeline" and schedule == "1f1b" and chunks < stages:
        return (f"1f1b keeps every stage busy with its own microbatch: chunks ({chunks}) must be at least the "
                f"{stages} stages (or use gpipe)")
    if mode == "ddp" and chunks % stages:
        return (f"ddp shares each step's {chunks} microbatch(es) among {stages} ranks: chunks must be a multiple "
                f"of {stages}")
    return None


TrainData = Literal["synthetic", "cifar10", "cifar100", "imagefolder"]
"""What a training job reads (a tokenized file is for `pictl run`'s evaluation only, not yet for training)."""

class TrainOptions(BaseModel):
    """Everything that defines one training job."""

    model_config = ConfigDict(extra="forbid")

    mode: Mode = "pipeline"
    schedule: Schedule = "gpipe"
    stages: int = Field(default=2, ge=1, le=128)
    """Pipeline stages (`pipeline`) or data-parallel ranks (`ddp`); `single` uses one."""
    policy: TrainPolicy = "equal"
    split: list[str] = []
    model: str = Field(default="deit_small_patch16_224", min_length=1, max_length=256)
    model_args: dict[str, Any] = {}
    num_classes: int = Field(default=0, ge=0, le=100_000)
    """Classifier outputs; 0: the data set's (10 for synthetic data; an ImageFolder's is counted on the host)."""
    image_size: int = Field(default=0, ge=0, le=1024)
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4096)
    """Starting weights on the hosts (the same path on each); None: seeded random weights."""
    allow_pickle: bool = False
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    batch_size: int = Field(default=8, ge=1, le=4096)
    chunks: int = Field(default=4, ge=1, le=4096)
    steps: int = Field(default=0, ge=0, le=1_000_000)
    epochs: int = Field(default=1, ge=1, le=10_000)
    warmup_steps: int = Field(default=1, ge=0, le=1000)
    lr: float = Field(default=0.01, gt=0, le=10, allow_inf_nan=False)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    momentum: float = Field(default=0.9, ge=0, lt=1, allow_inf_nan=False)
    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    amp: bool = False
    train_images: int = Field(default=256, ge=1, le=10_000_000)
    eval_images: int = Field(default=64, ge=0, le=1_000_000)
    data: TrainData = "synthetic"
    data_path: str | None = Field(default=None, min_length=1, max_length=4096)
    threads: int = Field(default=1, ge=1, le=256)
    workers: int = Field(default=0, ge=0, le=32)
    """Data-loading processes per rank that reads images (0: the step reads its own)."""
    checkpoint_activations: bool = False
    """Recompute activations in the backward pass (per stage; the whole model in single and ddp)."""
    lora: int = Field(default=0, ge=0, le=4096)
    """Fine-tune with rank-R LoRA adapters (`peft`) on the attention projections, every other weight frozen but
    the head; the merged model is written. 0: every weight trains."""
    wire: str = Field(default="fp32", min_length=1, max_length=4096)
    """Pipeline: what crosses each cut, activations forward and gradients back (fp32, fp16, bf16, int8,
    lowrank:R, convinsert:RATE; per cut as `blocks.4=fp16` with explicit split points)."""
    keep_compressor: bool = False
    """convinsert: keep the learned pairs in the merged model (it then computes what the pipeline trained to
    compute, and a run cut there sends the code); default: leave them out (a model for one host)."""
    error_feedback: bool = True
    """lowrank cuts: send each image's change since the receiver's copy of it (AQ-SGD), not the state."""
    check_steps: int = Field(default=3, ge=0, le=100)
    """Steps whose loss is checked against a `single` run of the same job (0: no check)."""
    check_images: int = Field(default=8, ge=0, le=MAX_IMAGES)
    save: bool = True
    break_rank: int | None = Field(default=None, ge=0)
    """Fault injection (tests): this rank never applies its optimizer step."""
    track: list[Tracker] = []
    """Experiment trackers the finished job is written to; empty: the inventory's `[cluster] track`."""

    @model_validator(mode="after")
    def _fits(self) -> TrainOptions:
        if self.batch_size % self.chunks:
            raise ValueError(f"chunks {self.chunks} do not divide the batch of {self.batch_size} "
                             f"(every microbatch has the same size)")
        if self.mode == "single" and self.stages != 1:
            self.stages = 1
        if self.mode == "pipeline" and self.stages < 2:
            raise ValueError("pipeline needs at least 2 stages (use --mode single for one)")
        if self.mode == "ddp" and self.stages < 2:
            raise ValueError("ddp needs at least 2 ranks, one per host (use --mode single for one)")
        refused = chunks_refusal(self.mode, self.schedule, self.stages, self.chunks)
        if refused:
            raise ValueError(refused)
        if self.policy == "balanced" and self.mode != "pipeline":
            self.policy = "equal"  # one stage: nothing to balance
        if self.split:
            if self.mode != "pipeline":
                raise ValueError("split points apply to --mode pipeline only")
            self.policy = "explicit"
        if self.policy == "balanced" and not self.model.startswith(BALANCED_MODELS):
            raise ValueError(f"policy balanced profiles timm ViTs ({', '.join(p + '*' for p in BALANCED_MODELS)}), "
                             f"not {self.model}: give --split or --policy equal")
        if self.policy == "balanced" and self.model_args:
            raise ValueError("policy balanced profiles the timm model by name: with --model-arg, give --split "
                             "or --policy equal")
        if self.train_images < self.batch_size:
            raise ValueError(f"train_images {self.train_images} is less than one batch of {self.batch_size}")
        if self.data != "synthetic" and not self.data_path:
            raise ValueError(f"data '{self.data}' needs data_path (a directory on the hosts)")
        if self.data == "synthetic" and self.data_path:
            raise ValueError("data_path is for cifar10, cifar100 and imagefolder, not synthetic data")
        if self.checkpoint is not None and not self.checkpoint.strip():
            raise ValueError("checkpoint is empty (leave it out for random weights)")
        if self.mode == "single" and self.break_rank:
            raise ValueError("break_rank: single has only rank 0")
        self._check_wire()
        return self

    def _check_wire(self) -> None:
        wire = parse_wire(self.wire)  # a ValueError names the bad part
        self.wire = str(wire)
        if self.mode != "pipeline" and self.wire != "fp32":
            raise ValueError(f"wire {self.wire}: a wire format is what crosses a pipeline's cuts (--mode pipeline)")
        wire.check_cuts(self.split, "job")
        if self.keep_compressor and not wire.learned:
            raise ValueError(f"keep_compressor: wire {self.wire} has no learned compressor to keep (convinsert:RATE)")

    @property
    def lossy_wire(self) -> bool:
        return not parse_wire(self.wire).lossless

    @property
    def learned_wire(self) -> bool:
        """A compressor pair trained with the model (convinsert) sits at some cut."""
        return parse_wire(self.wire).learned

    @property
    def classes(self) -> int:
        if self.num_classes:
            return self.num_classes
        return {"cifar100": 100}.get(self.data, 10) if self.data != "imagefolder" else 0

    def spec(self, run_id: str, *, mode: Mode | None = None, stop_after: int = 0,
             split: list[str] | None = None) -> TrainSpec:
        """The hosts' spec (`mode`, `stop_after` given: the same job run another way, e.g. the first steps of
        its `single` reference, on the same learning-rate schedule)."""
        mode = mode or self.mode
        fields = self.model_dump(include={"model", "image_size", "allow_pickle", "seed", "schedule", "batch_size",
                                          "chunks", "epochs", "warmup_steps", "lr", "optimizer", "momentum",
                                          "weight_decay", "amp", "train_images", "eval_images", "threads", "workers",
                                          "checkpoint_activations", "wire", "error_feedback", "keep_compressor",
                                          "check_images", "save", "break_rank", "lora"})
        checkpoint = str(Path(self.checkpoint).expanduser()) if self.checkpoint else None
        return TrainSpec(**fields, model_kwargs=dict(self.model_args), num_classes=self.classes,
                         checkpoint=checkpoint, mode=mode, stages=self.stages if mode != "single" else 1,
                         policy="explicit" if split else ("equal" if self.policy == "balanced" else self.policy),
                         split_points=list(split or self.split) if mode == "pipeline" else [],
                         steps=self.steps, stop_after=stop_after,
                         data=DataSpec(kind=self.data, path=self.data_path, split="train"), run_id=run_id)


def train_options(values: dict[str, Any], *, name_of: Namer = str) -> TrainOptions:
    """`values` (None: not given) as checked options: `pictl train`, its dashboard form and `pictl.train` all make
    theirs here; ConfigError names the field as the caller calls it (`name_of`: a flag, a keyword)."""
    try:
        return TrainOptions.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise E.ConfigError(problem_line(exc, TrainOptions, name_of=name_of)) from None
