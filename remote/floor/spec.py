"""The run specification the controller writes and every host reads (torch-free).

One JSON file per run (`protocol.SPEC_FILE`), so a host never parses command-line
strings built from user values.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

DATA_KINDS = ("synthetic", "cifar10", "cifar100", "imagefolder")
POLICIES = ("explicit", "equal")


@dataclass
class DataSpec:
    """Where the images come from."""

    kind: str = "synthetic"
    """synthetic | cifar10 | cifar100 | imagefolder | tokens (`remote.data.images.TOKENS`)"""
    path: str | None = None
    """Directory holding the data set, or a tokenized file (not used for synthetic data)."""
    split: str = "test"
    """Which part of CIFAR to read: train or test."""


@dataclass
class RefineSpec:
    """`balanced` refines its split during the run: the cost table the first split came from."""

    compute_s: list[list[float]]
    """Per stage, the seconds each piece takes on that stage's host (as profiled and corrected)."""
    cut_bytes: list[float]
    links: list[list[float]]
    """Per link (stage s to s + 1): [latency_s, bytes_per_s, send_s_per_byte, recv_s_per_byte] (`balance.Link`)."""
    comm_s_per_byte: list[float]
    max_rounds: int = 3
    """Splits measured at most (the first included); each after the first costs one calibration pass."""
    min_gain: float = 0.03
    """Try or adopt a new split only when its bottleneck is at least this much better (`remote.floor.refinement`)."""
    max_repeats: int = 2
    """Calibration passes that measure a split again when two splits' intervals overlap."""
    pass_noise: float = 0.10
    """How far one pass's median may sit from the next on an unchanged host (relative), until passes show it."""
    recut: bool = True
    """Watch the timed passes and re-cut between them when a host drifts (`remote.floor.recut`)."""
    max_recuts: int = 2
    recut_threshold: float = 0.15
    recut_patience: int = 2
    recut_margin: float = 0.10


HF_PREFIX = "hf:"
"""A Hugging Face classifier: `hf:NAME` (an architecture's base sizes) or `hf:/a/model/dir`
(`remote.toolkit.text_models`)."""


_FACTORY = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)")
RESERVED_MODULES = ("remote", "pictl", "hf")
"""Top-level names a user's module may not take: pictl's own packages, and the Hugging Face prefix."""


def factory_of(model: str) -> tuple[str, str] | None:
    """(module, function) when `model` names a user's own model, `package.module:factory`; else None."""
    found = _FACTORY.fullmatch(model)
    return (found[1], found[2]) if found and found[1].split(".")[0] != "hf" else None


def hf_model_dir(model: str) -> str | None:
    """The directory a Hugging Face classifier is read from on the hosts, if `model` names one."""
    rest = model[len(HF_PREFIX):] if model.startswith(HF_PREFIX) else ""
    return rest if rest.startswith(("/", "~")) else None


@dataclass
class RunSpec:
    """Everything a host needs to run its part of one experiment."""

    model: str = "deit_small_patch16_224"
    num_classes: int = 1000
    tokens: int = 128
    """Token ids per input of a text model (`remote.toolkit.text_models`); images ignore it."""
    seed: int = 0
    checkpoint: str | None = None
    allow_pickle: bool = False
    stages: int = 1
    replicas: int = 1
    """Copies of the S-stage pipeline, over replicas x stages ranks (`remote.runtime.replicas`)."""
    policy: str = "equal"
    split_points: list[str] = field(default_factory=list)
    chunk: int = 1
    images: int = 48
    warmup: int = 1
    repeats: int = 3
    first_pass: int = 0
    """The first timed pass this launch runs (0 but in a run that continued on the hosts it had left: the timed
    passes before were measured by the launch that lost a host). Passes are numbered for the whole run."""
    threads: int = 1
    data: DataSpec = field(default_factory=DataSpec)
    check_images: int = 8
    progress_interval_s: float = 1.0
    trace_steps: int = 0
    """Profile this many steps in one extra untimed pass after the timed ones (0: none)."""
    pg_timeout_s: float = 300.0
    run_id: str = ""
    wire: str = "fp32"
    """What travels between stages (`remote.floor.wire`): one format, or per cut."""
    numerics: str = "fp32"
    """Every stage's (and the serial run's) numerics: `remote.toolkit.numerics`."""
    refine: RefineSpec | None = None
    """Set by `balanced` (unless --no-refine): correct the split from what the first passes measure."""
    slowdown: list[float] | None = None
    """Fault injection (tests): [rank, timed pass, factor] (and a 4th, 1: the rank is killed as the re-cut
    begins): from that pass on, the rank's every microbatch takes factor times its compute, as if its host
    had slowed down."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict) -> RunSpec:
        raw = dict(raw)
        raw["data"] = DataSpec(**raw.get("data", {}))
        raw["refine"] = RefineSpec(**raw["refine"]) if raw.get("refine") else None
        return cls(**raw)

    @classmethod
    def load(cls, path: str | Path) -> RunSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))


IMPORTANCES = ("l1", "l2", "taylor", "hessian")
OPTIMIZERS = ("sgd", "adamw")


@dataclass
class PruneSpec:
    """One pruning job: prune, fine-tune, evaluate, write the artifact (`remote.pruning.prune`)."""

    model: str = "deit_small_patch16_224"
    model_kwargs: dict = field(default_factory=dict)
    num_classes: int = 0
    """Classifier outputs; 0: the data set's class count."""
    checkpoint: str | None = None
    """Weights of the base model (safetensors or a plain .pth state dict); None: seeded random weights."""
    seed: int = 0
    ratio: float = 0.15
    importance: str = "hessian"
    global_pruning: bool = False
    prune_heads: bool = False
    """Remove whole heads (at `ratio`) instead of narrowing every head."""
    round_to: int = 1
    calib_batches: int = 4
    """Batches whose gradients score channels for taylor and hessian."""
    epochs: int = 1
    lr: float = 0.01
    batch_size: int = 32
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-5
    train_images: int = 0
    """Fine-tune on at most this many training images (0: all)."""
    eval_images: int = 0
    """Measure top-1 on at most this many test images (0: all)."""
    data: DataSpec = field(default_factory=lambda: DataSpec(kind="cifar10"))
    threads: int = 0
    """torch threads (0: torch's default)."""
    device: str = "auto"
    """auto (CUDA when present), cpu or cuda."""
    out: str = "pruned.safetensors"
    progress_interval_s: float = 1.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> PruneSpec:
        raw = json.loads(Path(path).read_text())
        raw["data"] = DataSpec(**raw.get("data", {}))
        return cls(**raw)


TRAIN_MODES = ("single", "pipeline", "ddp")
TRAIN_SCHEDULES = ("gpipe", "1f1b")


@dataclass
class TrainSpec:
    """One training job (`remote.training.train`): the same step, seed, global batch and learning-rate
    schedule in every mode, so `single`, `pipeline` and `ddp` compute the same function.

    A step takes `batch_size` images as `chunks` microbatches of `batch_size // chunks`: the microbatch is
    what a BatchNorm sees in every mode. `single` accumulates the microbatches' gradients, `pipeline`
    streams them through the stages, `ddp` gives each rank `chunks // world` of them.
    """

    model: str = "deit_small_patch16_224"
    model_kwargs: dict = field(default_factory=dict)
    num_classes: int = 10
    image_size: int = 0
    """Square input side (0: the model's own, e.g. 224)."""
    checkpoint: str | None = None
    """Starting weights (safetensors or a plain .pth state dict); None: seeded random weights."""
    allow_pickle: bool = False
    seed: int = 0
    mode: str = "single"
    schedule: str = "gpipe"
    stages: int = 1
    """Ranks: pipeline stages, or data-parallel replicas under ddp."""
    policy: str = "equal"
    split_points: list[str] = field(default_factory=list)
    batch_size: int = 8
    """The global batch of one optimizer step, in every mode."""
    chunks: int = 1
    steps: int = 0
    """Optimizer steps in all (0: `epochs` passes over the training images)."""
    epochs: int = 1
    stop_after: int = 0
    """Run only the first N of the `steps` (0: all), on the same learning-rate schedule: the reference."""
    warmup_steps: int = 1
    """Steps left out of the throughput (imports, allocator and caches settle)."""
    lr: float = 0.01
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    amp: bool = False
    """bf16 autocast on CPU (fp16 on CUDA); the weights, optimizer and wire stay fp32."""
    train_images: int = 256
    eval_images: int = 64
    """Top-1 after every epoch on this many held-out images (0: no evaluation)."""
    data: DataSpec = field(default_factory=DataSpec)
    threads: int = 1
    workers: int = 0
    """Data-loading processes per rank that reads images (torch's DataLoader); 0: read in the step itself."""
    wire: str = "fp32"
    """What crosses each cut of a pipeline job, activations forward and their gradients back (`remote.floor.wire`;
    fp32, fp16, bf16, int8, lowrank:R or convinsert:RATE)."""
    keep_compressor: bool = False
    """convinsert: save each learned pair with the weights (`remote.toolkit.kept_pair`), not drop it."""
    error_feedback: bool = True
    """A lowrank cut compresses each image's change since the receiver's copy of it (`remote.toolkit.feedback`)."""
    lora: int = 0
    """LoRA adapters of this rank on the attention projections, the rest frozen but the head (`remote.training.lora`);
    0: every weight trains."""
    checkpoint_activations: bool = False
    """Recompute each piece's activations in the backward pass instead of keeping them (less memory, more
    compute): per stage in the pipeline mode, the whole model in single and ddp."""
    save: bool = True
    """Write each rank's weights (`protocol.train_part_file`) for the controller to assemble."""
    check_images: int = 8
    """The trained model's logits on this many evaluation images are kept (checkpoint checks)."""
    break_rank: int | None = None
    """Fault injection for tests: this rank never applies its optimizer step (its loss drifts)."""
    progress_interval_s: float = 1.0
    pg_timeout_s: float = 300.0
    run_id: str = ""

    @property
    def microbatch(self) -> int:
        return self.batch_size // self.chunks

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> TrainSpec:
        raw = json.loads(Path(path).read_text())
        raw["data"] = DataSpec(**raw.get("data", {}))
        return cls(**raw)


DECODER_ARCHS = ("llama", "qwen2", "qwen3", "mistral")
"""Decoder-only Hugging Face architectures `pictl generate` builds from a configuration: each lays its model out
as `model.embed_tokens`, `model.layers`, `model.norm` and `lm_head`, the layout a stage is cut from."""


@dataclass
class GenerateSpec:
    """One generation job (`remote.generation.generate`): the same model, prompts and greedy decoding on the
    serial run and on every stage, so their token ids must be identical.

    The model is a local directory (`config.json` and safetensors, as `save_pretrained` writes) or an
    architecture built from its default configuration with `sizes` over it and seeded random weights; each
    stage builds only its own layers (a weight's values depend on its name and the seed, not on the stage)."""

    model_dir: str | None = None
    arch: str = "llama"
    sizes: dict = field(default_factory=dict)
    """Configuration fields over the architecture's defaults (num_hidden_layers, hidden_size, ...)."""
    split: list = field(default_factory=list)
    """The first decoder layer of stages 2..N (empty: one stage, the serial run)."""
    prompts: list = field(default_factory=list)
    """Token ids of each sequence's prompt (one list per sequence)."""
    new_tokens: int = 16
    warmup_tokens: int = 2
    """Tokens per sequence generated before the timed pass (its caches thrown away): first-call costs."""
    seed: int = 0
    threads: int = 1
    numerics: str = "fp32"
    """`fp32`, or `int8-dynamic`: every Linear layer (the head's too) int8 with its input quantised per call."""
    tokens_file: str = "tokens.json"
    """Where the first stage writes the generated ids and their arrival times (too long for a telemetry line)."""
    pg_timeout_s: float = 300.0
    run_id: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> GenerateSpec:
        return cls(**json.loads(Path(path).read_text()))
