"""Named run presets (`profiles/*.toml`) and the options a run is made of.

A run's options come from, lowest to highest: the defaults below, the profile
(`--profile NAME`), then command-line flags. Profiles are found by name only
(`./profiles/NAME.toml`, then the shipped one); a local file that shadows a
shipped profile is announced (`shadowed_profile`), and no profile may turn on
what only a flag should (`--allow-pickle`). Sizes are capped: a typo of 500000
images is refused, not allocated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pictl.errors import ConfigError
from pictl.inventory import format_validation_error, read_toml
from pictl.shipped import shipped_path
from remote.wire import parse_wire

SHIPPED_PROFILES = shipped_path("profiles")
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""A profile is named, never a path: `--profile ../x` must not read any TOML file it points at."""
FLAG_ONLY = {"allow_pickle": "--allow-pickle", "artifact": "--model FILE.safetensors"}
"""Options a profile may not set: a profile file lying in the working directory must not opt in to
running code from a pickle, or name an artifact behind `model`'s back."""
MAX_IMAGES = 2000
"""Images per pass: the first host holds them all (about 0.6 MB each at 224x224) before the timed passes."""


Policy = Literal["balanced", "equal", "explicit"]
Dataset = Literal["synthetic", "cifar10", "cifar100", "imagefolder"]
POLICIES: tuple[str, ...] = get_args(Policy)
DATASETS: tuple[str, ...] = get_args(Dataset)


class RunOptions(BaseModel):
    """Everything that defines one experiment."""

    # strict: a profile's `images = "48"` is named as a mistake, not coerced.
    model_config = ConfigDict(extra="forbid", strict=True)

    stages: int = Field(default=2, ge=1, le=128)
    """Number of pipeline stages (1 = the serial model alone)."""
    policy: Policy = "balanced"
    """How split points are chosen when `split` is empty: `equal` parameter counts per stage, or `balanced`:
    the smallest slowest-stage time over measured per-piece costs on the hosts."""
    split: list[str] = []
    """Module names where stages 2..N begin, e.g. ["blocks.3", "blocks.6"]. Implies `explicit`."""
    model: str = Field(default="deit_small_patch16_224", min_length=1, max_length=4096)
    """timm model name (deit_small_patch16_224, deit3_small_patch16_224, ...), or a pruned-model artifact
    (`.safetensors` written by `pictl prune`): it brings its architecture, weights and class count."""
    artifact: str | None = None
    """Set from `model` when that names an artifact: its absolute path on the controller."""
    num_classes: int = Field(default=1000, ge=1, le=100_000)
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
    """What travels between stages (`remote.wire`): `fp32` (exact), `fp16`, `bf16`, `int8`, `lowrank:R`, for
    every cut or per cut (`blocks.4=fp16,blocks.8=int8`, explicit splits only)."""
    min_agreement: float = Field(default=0.99, ge=0.0, le=1.0)
    """A lossy wire passes when at least this share of images gets the serial run's top-1 class."""
    refine: bool = True
    """`balanced` only: after the warm-up pass, correct the cost model from each stage's measured compute
    and split again while that promises a gain of a few percent (at most 3 splits measured); False keeps
    the one-shot split from the profiles."""
    trace_steps: int = Field(default=0, ge=0, le=10_000)
    """Profile this many pipeline steps on every rank in one extra untimed pass (0: no traces)."""
    pg_timeout_s: float = Field(default=300.0, gt=0, le=86_400)
    """Gloo process-group timeout: how long a rank waits for a silent peer."""
    baseline_max_age: float | None = Field(default=None, gt=0)
    """Seconds a cached serial baseline may be reused for; None: the inventory's `[cluster] baseline_max_age`,
    else any age (a baseline is still measured again whenever its host's state changed)."""

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
        self._check_wire()
        return self

    @field_validator("wire")
    @classmethod
    def _parse_wire(cls, text: str) -> str:
        return str(parse_wire(text))  # a ValueError names the bad part; the flag or field is named with it

    def _check_wire(self) -> None:
        wire = parse_wire(self.wire)
        cuts = [cut for cut, _ in wire.per_cut]
        if cuts and not self.split:
            raise ValueError(f"wire: per-cut formats ({', '.join(cuts)}) need explicit split points (--split); "
                             f"give one format for every cut instead")
        unknown = [c for c in cuts if c not in self.split]
        if unknown:
            raise ValueError(f"wire: {', '.join(unknown)} is not a cut of this run (split points: "
                             f"{', '.join(self.split)})")

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


def profile_dirs(extra: Path | None = None) -> list[Path]:
    dirs = [extra] if extra else []
    return [*dirs, Path.cwd() / "profiles", SHIPPED_PROFILES]


def available_profiles(extra: Path | None = None) -> list[str]:
    names: set[str] = set()
    for d in profile_dirs(extra):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml") if PROFILE_NAME.fullmatch(p.stem))
    return sorted(names)


def profile_path(name: str, extra: Path | None = None) -> Path:
    """The file `--profile NAME` reads: the first directory that has it."""
    if not isinstance(name, str) or not PROFILE_NAME.fullmatch(name):
        raise ConfigError(f"--profile: {name!r} is not a profile name (letters, digits, '-' and '_'; "
                          f"see `pictl profiles`)")
    for d in profile_dirs(extra):
        path = d / f"{name}.toml"
        if path.is_file():
            return path
    known = ", ".join(available_profiles(extra)) or "none"
    raise ConfigError(f"unknown profile '{name}' (available: {known})")


def shadowed_profile(name: str | None, extra: Path | None = None) -> str | None:
    """A note when `name` resolves to a local file that hides the shipped profile of that name."""
    if name is None:
        return None
    path = profile_path(name, extra)
    shipped = SHIPPED_PROFILES / f"{name}.toml"
    if shipped.is_file() and path.resolve() != shipped.resolve():
        return f"profile '{name}' is {path}, which shadows the shipped one ({shipped})"
    return None


def _profile_document(name: str, extra: Path | None) -> tuple[dict[str, Any], Path]:
    path = profile_path(name, extra)
    raw = read_toml(path, "profile")
    for key, flag in FLAG_ONLY.items():
        if key in raw:
            raise ConfigError(f"{path}: {key}: a profile cannot set this; give {flag} on the command line")
    return raw, path


def describe_profile(name: str, extra: Path | None = None) -> tuple[str, Path]:
    """A profile's `description` line and the file it comes from (`pictl profiles`)."""
    raw, path = _profile_document(name, extra)
    return str(raw.get("description", "")), path


def load_profile(name: str, extra: Path | None = None) -> tuple[dict[str, Any], Path]:
    raw, path = _profile_document(name, extra)
    raw.pop("description", None)
    raw.pop("sweep", None)  # what `pictl sweep` varies; see sweep_settings()
    return raw, path


class SweepSettings(BaseModel):
    """A profile's [sweep] table: the values `pictl sweep` combines."""

    model_config = ConfigDict(extra="forbid", strict=True)

    stages: list[int] = Field(default=[1, 2, 3, 4], max_length=64)
    chunks: list[int] = Field(default=[1], max_length=64)
    policy: list[Literal["equal", "balanced"]] = Field(default=["equal"], max_length=2)


def sweep_settings(profile: str | None, extra: Path | None = None) -> SweepSettings:
    if profile is None:
        return SweepSettings()
    raw, path = _profile_document(profile, extra)
    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict):
        raise ConfigError(f"{path}: 'sweep' must be a table ([sweep]), not a {type(sweep).__name__}")
    try:
        return SweepSettings(**sweep)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(f"{path}: sweep", exc)) from exc


def as_flag(field_name: str) -> str:
    return f"--{field_name.replace('_', '-')}"


def resolve_options(profile: str | None, overrides: dict[str, Any], extra: Path | None = None, *,
                    source: str = "command line", name_of: Callable[[str], str] = as_flag) -> RunOptions:
    """Defaults < profile < flags; flags left at None do not override. Errors name the flag (`name_of`: the
    dashboard's form names its fields instead) or the profile file, else `source`."""
    base: dict[str, Any] = {}
    if profile is not None:  # `--profile ''` is a mistake to name (profile_path does), not "no profile"
        base, path = load_profile(profile, extra)
        source = str(path)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return RunOptions(**{**base, **given})
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        if loc and loc[0] in given:  # the flag is to blame, not the profile
            flag = name_of(str(loc[0]))
            raise ConfigError(format_validation_error("", exc).removeprefix(": ").replace(str(loc[0]), flag, 1)) \
                from None
        raise ConfigError(format_validation_error(source, exc)) from None
