"""What one run is made of, said once for every front end.

`RunOptions` is every option with its default and bounds; `POLICIES` and `DATASETS` are the choices;
`parse_split` reads split points; `RUN_FLAGS` says which options a person sets (on the command line,
`pictl run` and `pictl sweep`, and in the dashboard's forms), with their help, and `given_options` turns
what was given into the overrides `presets.resolve_options` takes. `pictl run` hands on the options of its
groups that `RUN_FLAGS` names (`pictl.cli.option_groups`), and the CLI's help and the forms read their choices and
defaults here, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pictl.cluster.push import user_files
from pictl.errors import ConfigError
from pictl.records.trackers import Tracker
from remote.floor.wire import parse_wire

MAX_IMAGES = 2000
"""Images per pass: the first host holds them all (about 0.6 MB each at 224x224) before the timed passes."""


Policy = Literal["balanced", "equal", "explicit"]
Dataset = Literal["synthetic", "cifar10", "cifar100", "imagefolder", "tokens"]
POLICIES: tuple[str, ...] = get_args(Policy)
DATASETS: tuple[str, ...] = get_args(Dataset)


class RunOptions(BaseModel):
    """Everything that defines one experiment."""

    # strict: a profile's `images = "48"` is named as a mistake, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)

    stages: int = Field(default=2, ge=1, le=128)
    """Number of pipeline stages (1 = the serial model alone)."""
    replicas: int = Field(default=1, ge=1, le=128)
    """Copies of the S-stage pipeline over replicas x stages ranks (`remote.runtime.replicas`): a pass's
    microbatches are dealt among them, every replica's outputs checked against the serial run. One pipeline's
    split is shared by all; `balanced` splits once from the cost model (no refinement or re-cut: those
    watch one pipeline)."""
    policy: Policy = "balanced"
    """How split points are chosen when `split` is empty: `equal` parameter counts per stage, or `balanced`:
    the smallest slowest-stage time over measured per-piece costs on the hosts."""
    split: list[str] = []
    """Module names where stages 2..N begin, e.g. ["blocks.3", "blocks.6"]. Implies `explicit`."""
    model: str = Field(default="deit_small_patch16_224", min_length=1, max_length=4096)
    """timm model name (deit_small_patch16_224, deit3_small_patch16_224, resnet50, ...), a Hugging Face encoder
    classifier (`hf:bert-base`, `hf:roberta-base`, or `hf:/dir` with a config.json and optionally
    model.safetensors, on the hosts), or a pruned-model artifact (`.safetensors` written by `pictl prune`): it
    brings its architecture, weights and class count."""
    artifact: str | None = None
    """Set from `model` when that names an artifact: its absolute path on the controller."""
    num_classes: int = Field(default=1000, ge=1, le=100_000)
    tokens: int = Field(default=128, ge=1, le=8192)
    """Token ids per input of a text model (`hf:...`): its sequence length. Images ignore it."""
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4096)
    """State-dict file (.safetensors, or .pth read with weights_only=True). None: seeded random weights.
    A relative path is taken from the controller's working directory (made absolute here)."""
    allow_pickle: bool = False
    """Allow a checkpoint that is a whole pickled model (runs code from the file)."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    data: Dataset = "synthetic"
    data_path: str | None = Field(default=None, min_length=1, max_length=4096)
    """Directory of the data set on the hosts (CIFAR python layout or ImageFolder)."""
    data_split: Literal["train", "test"] = "test"
    images: int = Field(default=48, ge=1, le=MAX_IMAGES)
    """Images per pass."""
    chunk: int = Field(default=1, ge=1, le=256)
    """Microbatch size in the pipeline; batch size of the serial baseline."""
    warmup: int = Field(default=1, ge=0, le=100)
    repeats: int = Field(default=3, ge=1, le=1000)
    """Timed passes; throughput is their mean, with the spread reported."""
    threads: int = Field(default=1, ge=0, le=256)
    """torch threads per rank (and for the serial run); 0: each host's cores divided among the stages it runs
    (the serial run gets all of its host's cores)."""
    check_images: int = Field(default=8, ge=1, le=MAX_IMAGES)
    """How many images' logits are compared against the serial run."""
    atol: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    """Largest absolute logit difference still counted as a match (0: bit-identical)."""
    master_port: int | None = Field(default=None, ge=1024, le=65535)
    """Rendezvous port on the first host; default: one the host says is free when the run starts."""
    wire: str = Field(default="fp32", min_length=1, max_length=4096)
    """What travels between stages (`remote.floor.wire`): `fp32` (exact), `fp16`, `bf16`, `int8`, `lowrank:R`, for
    every cut or per cut (`blocks.4=fp16,blocks.8=int8`, explicit splits only)."""
    numerics: Literal["fp32", "int8-dynamic"] = "fp32"
    """Every stage's numerics, and its serial baseline's (`remote.toolkit.numerics`): the pipeline is held to a
    serial run in the same numerics (bit for bit); beside it an fp32 serial run measures what the numerics
    gain (speedup against fp32) and cost (top-1 agreement with fp32, over every image)."""
    min_agreement: float = Field(default=0.99, ge=0.0, le=1.0)
    """A lossy wire passes when at least this share of images gets the serial run's top-1 class."""
    refine: bool = True
    """`balanced` only: after the warm-up pass, correct the cost model from each stage's measured compute
    and split again while that promises a gain of a few percent (at most 3 splits measured); False keeps
    the one-shot split from the profiles."""
    recut: bool = True
    """`balanced` with refinement: watch every timed pass and re-cut between passes when a host slows down
    or recovers enough that another split wins by a margin (`remote.floor.recut`); False keeps the refined split."""
    max_recuts: int = Field(default=2, ge=0, le=20)
    slowdown: list[float] | None = Field(default=None, min_length=3, max_length=4)
    """Fault injection (tests): [rank, timed pass, factor]: from that pass on the rank computes factor times
    slower, as a throttled host would."""
    on_host_loss: Literal["continue", "fail"] = "continue"
    """A host lost mid-run (a rank that died without a word, its link gone): `continue` ends the segment, re-plans
    for the hosts left (the same policy; `explicit`'s cuts no longer fit: `equal`) and runs the remaining timed
    passes there (`pictl.run.continuation`); `fail` ends the run (exit 3), as any failure does."""
    trace_steps: int = Field(default=0, ge=0, le=10_000)
    """Profile this many pipeline steps on every rank in one extra untimed pass (0: no traces)."""
    pg_timeout_s: float = Field(default=300.0, gt=0, le=86_400)
    """Gloo process-group timeout: how long a rank waits for a silent peer."""
    baseline_max_age: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds a cached serial baseline may be reused for; None: the inventory's `[cluster] baseline_max_age`,
    else any age (a baseline is still measured again whenever its host's state changed). Finite: infinity
    would say "any age" in a record that strict JSON cannot hold."""
    track: list[Tracker] = []
    """Experiment trackers the finished run is written to (`pictl.records.trackers`); empty: the inventory's
    `[cluster] track`. Not part of the experiment: the hosts never see it."""

    @model_validator(mode="after")
    def _split_implies_explicit(self) -> RunOptions:
        if self.split:
            self.policy = "explicit"
        if self.data != "synthetic" and not self.data_path:
            raise ValueError(f"data '{self.data}' needs data_path")
        # Relative paths mean "from where pictl runs": resolved here, not in the host's run directory.
        for name in ("checkpoint", "data_path"):
            value = getattr(self, name)
            if value and not value.startswith(("/", "~")):
                setattr(self, name, str(Path.cwd() / value))
        if self.model.endswith(".safetensors"):
            self._take_artifact()
        user_files(self.model)  # a user's model whose module is not here is refused now, not on a host
        self._check_wire()
        if self.replicas > 1:
            microbatches = -(-self.images // self.chunk)
            if microbatches % self.replicas:
                raise ValueError(f"replicas: {self.replicas} replicas need the {microbatches} microbatches of a pass "
                                 f"(images / chunk) to divide evenly among them")
            self.refine = self.recut = False
        return self

    @field_validator("wire")
    @classmethod
    def _parse_wire(cls, text: str) -> str:
        return str(parse_wire(text))  # a ValueError names the bad part; the flag or field is named with it

    def _check_wire(self) -> None:
        wire = parse_wire(self.wire)
        if wire.learned:
            raise ValueError("wire: convinsert is a compressor learned in training (pictl train --wire); a run "
                             "has none to apply")
        wire.check_cuts(self.split, "run")

    @property
    def ranks(self) -> int:
        """Processes the pipeline runs: every replica's stages (1: the serial run alone)."""
        return self.stages * self.replicas

    @property
    def lossy_wire(self) -> bool:
        return self.stages > 1 and not parse_wire(self.wire).lossless

    def _take_artifact(self) -> None:
        from pictl.cluster.artifacts import open_artifact

        if self.checkpoint:
            raise ValueError("model: an artifact carries its own weights; drop checkpoint")
        try:
            artifact = open_artifact(self.model)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        self.artifact = str(artifact.path)
        self.model, self.num_classes = artifact.meta.base_model, artifact.meta.num_classes


def parse_split(text: str | None, name: str = "--split") -> list[str] | None:
    """Split points from `blocks.3,blocks.6` (None: none given). An empty point is a typo to name, not to drop;
    `name` is what the message blames (the flag, or the form's field)."""
    if text is None:
        return None
    points = [p.strip() for p in text.split(",")]
    if not any(points):
        raise ConfigError(f"{name}: {text!r} names no split point (give module names, e.g. blocks.4,blocks.8)")
    if not all(points):
        raise ConfigError(f"{name}: {text!r} has an empty split point")
    return points


def default_of(field: str) -> Any:
    """A run option's default (what help and the forms' placeholders show)."""
    return RunOptions.model_fields[field].default


EXPERIMENT, MEASUREMENT, MODEL_AND_DATA, OUTPUT_AND_HOSTS = ("Experiment", "Measurement", "Model and data",
                                                             "Output and hosts")
"""The groups `pictl run -h` shows its options in."""


@dataclass(frozen=True)
class RunFlag:
    """One run option a person sets: the `RunOptions` field, what help says, the group it is shown in."""

    field: str
    help: str
    group: str
    decls: tuple[str, ...] = ()
    """Spellings when not `--field-name` (a `--refine/--no-refine` pair, a flag that takes no value)."""
    show_default: bool = True

    @property
    def value_type(self) -> Any:
        """What the flag's value is: int, float, str, bool, or a tuple of choices (a Literal field).
        Split points are text (`parse_split` reads them)."""
        annotation = RunOptions.model_fields[self.field].annotation
        if get_origin(annotation) in (Union, UnionType):
            annotation = next(a for a in get_args(annotation) if a is not NoneType)
        if get_origin(annotation) is Literal:
            return get_args(annotation)
        return str if get_origin(annotation) is list else annotation

    @property
    def help_text(self) -> str:
        if not self.show_default:
            return self.help
        default = default_of(self.field)
        return f"{self.help} \\[default: {default if default is not None else 'none'}]"  # escaped for Rich


RUN_FLAGS: dict[str, RunFlag] = {flag.field: flag for flag in (
    RunFlag("stages", "Pipeline stages (1 = serial only).", EXPERIMENT),
    RunFlag("replicas", "Copies of the pipeline (replicas x stages ranks over the hosts); images are dealt among "
            "them, every replica's outputs checked.", EXPERIMENT),
    RunFlag("split", "Split points: blocks.3,blocks.6 (stage starts); implies --policy explicit.", EXPERIMENT,
            show_default=False),
    RunFlag("policy", "balanced: measured costs, corrected by the run; equal: parameter counts; explicit: --split.",
            EXPERIMENT),
    RunFlag("chunk", "Microbatch size.", EXPERIMENT),
    RunFlag("refine", "balanced: correct the split from the stages' measured compute before the timed passes "
            "(default) or keep the profiles' one-shot split.", EXPERIMENT, ("--refine/--no-refine",),
            show_default=False),
    RunFlag("recut", "balanced: re-cut between timed passes when a host slows down or recovers (default), or keep "
            "the refined split.", EXPERIMENT, ("--recut/--no-recut",), show_default=False),
    RunFlag("max_recuts", "balanced: re-cuts per run at most.", EXPERIMENT),
    RunFlag("wire", "What travels between stages: fp32 (exact), fp16, bf16, int8, lowrank:R; for every cut, or per "
            "cut (blocks.4=fp16,blocks.8=int8).", EXPERIMENT),
    RunFlag("numerics", "Every stage's numerics: fp32, or int8-dynamic (int8 Linear layers). The pipeline is checked "
            "against a serial run in the same numerics; an fp32 serial run measures their gain and loss.", EXPERIMENT),
    RunFlag("min_agreement", "A lossy --wire passes when this share of images gets the serial run's top-1 class.",
            EXPERIMENT),
    RunFlag("images", "Images per pass.", MEASUREMENT),
    RunFlag("warmup", "Untimed warm-up passes.", MEASUREMENT),
    RunFlag("repeats", "Timed passes.", MEASUREMENT),
    RunFlag("threads", "torch threads per rank (0: the host's cores shared among its stages).", MEASUREMENT),
    RunFlag("trace_steps", "Profile K steps on every rank (extra untimed pass); traces land in the run directory.",
            MEASUREMENT, show_default=False),
    RunFlag("baseline_max_age", "Reuse a cached serial baseline only if it is younger than this many seconds.",
            MEASUREMENT, show_default=False),
    RunFlag("atol", "Largest logit difference that still matches.", MEASUREMENT),
    RunFlag("model", "timm model name, hf:bert-base / hf:roberta-base / hf:DIR (Hugging Face classifiers), or an "
            "artifact from `pictl prune`.", MODEL_AND_DATA),
    RunFlag("num_classes", "Classifier outputs.", MODEL_AND_DATA),
    RunFlag("tokens", "Token ids per input of a text model (hf:...).", MODEL_AND_DATA),
    RunFlag("checkpoint", "State dict (.safetensors / .pth).", MODEL_AND_DATA, show_default=False),
    RunFlag("allow_pickle", "Trust a pickled checkpoint.", MODEL_AND_DATA, ("--allow-pickle",), show_default=False),
    RunFlag("data", "Inputs to run: images, or token ids (tokens) for a text model.", MODEL_AND_DATA),
    RunFlag("data_path", "Data set directory on the hosts (--data tokens: a .safetensors file of input_ids and "
            "labels).", MODEL_AND_DATA, show_default=False),
    RunFlag("master_port", "Rendezvous port on host 0 (default: a free one).", OUTPUT_AND_HOSTS, show_default=False),
    RunFlag("on_host_loss", "A host lost mid-run: continue on the hosts left (re-planned, the rest of the timed "
            "passes there), or fail (exit 3).", OUTPUT_AND_HOSTS),
)}
"""Every run option a person sets, in the order help shows them; the rest (seed, check_images, ...) come from
defaults and presets."""

SWEEP_FLAGS = ("images", "warmup", "repeats", "threads", "trace_steps")
"""The run options `pictl sweep` takes as flags (what it varies has flags of its own)."""


def as_flag(field_name: str) -> str:
    return f"--{field_name.replace('_', '-')}"


def given_options(values: Mapping[str, Any], *, name_of: Callable[[str], str] = as_flag) -> dict[str, Any]:
    """The overrides `resolve_options` takes, from what the command line or a form was given for `RUN_FLAGS`
    (None: not given). Choices arrive as Enum members or text; split points as text (`name_of(field)` is what
    a bad one is blamed on)."""
    unknown = set(values) - set(RUN_FLAGS)
    if unknown:  # a caller's mistake, not the user's
        raise KeyError(f"not run flags: {', '.join(sorted(unknown))}")
    overrides: dict[str, Any] = {}
    for field, value in values.items():
        if isinstance(value, Enum):
            value = value.value
        if field == "split":
            value = parse_split(value, name_of(field))
        overrides[field] = value
    return overrides
