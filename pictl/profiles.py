"""Named run presets (`profiles/*.toml`) and the options a run is made of.

A run's options come from, lowest to highest: the defaults below, the profile
(`--profile NAME`), then command-line flags.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pictl.errors import ConfigError
from pictl.inventory import format_validation_error

SHIPPED_PROFILES = Path(__file__).resolve().parent.parent / "profiles"


class RunOptions(BaseModel):
    """Everything that defines one experiment."""

    model_config = ConfigDict(extra="forbid")

    stages: int = Field(default=2, ge=1)
    """Number of pipeline stages (1 = the serial model alone)."""
    policy: Literal["equal", "explicit", "balanced"] = "balanced"
    """How split points are chosen when `split` is empty: `equal` parameter counts per stage, or `balanced`:
    the smallest slowest-stage time over measured per-piece costs on the hosts."""
    split: list[str] = []
    """Module names where stages 2..N begin, e.g. ["blocks.3", "blocks.6"]. Implies `explicit`."""
    model: str = "deit_small_patch16_224"
    """timm model name (deit_small_patch16_224, deit3_small_patch16_224, ...), or a pruned-model artifact
    (`.safetensors` written by `pictl prune`): it brings its architecture, weights and class count."""
    artifact: str | None = None
    """Set from `model` when that names an artifact: its absolute path on the controller."""
    num_classes: int = Field(default=1000, ge=1)
    checkpoint: str | None = None
    """State-dict file (.safetensors, or .pth read with weights_only=True). None: seeded random weights."""
    allow_pickle: bool = False
    """Allow a checkpoint that is a whole pickled model (runs code from the file)."""
    seed: int = 0
    data: Literal["synthetic", "cifar10", "cifar100", "imagefolder"] = "synthetic"
    data_path: str | None = None
    """Directory of the data set on the hosts (CIFAR python layout or ImageFolder)."""
    data_split: Literal["train", "test"] = "test"
    images: int = Field(default=48, ge=1)
    """Images per pass."""
    chunk: int = Field(default=1, ge=1)
    """Microbatch size in the pipeline; batch size of the serial baseline."""
    warmup: int = Field(default=1, ge=0)
    repeats: int = Field(default=3, ge=1)
    """Timed passes; throughput is their mean, with the spread reported."""
    threads: int = Field(default=1, ge=0)
    """torch threads per rank (and for the serial run); 0: each host's cores divided among the stages it runs
    (the serial run gets all of its host's cores)."""
    check_images: int = Field(default=8, ge=1)
    """How many images' logits are compared against the serial run."""
    atol: float = Field(default=0.0, ge=0.0)
    """Largest absolute logit difference still counted as a match (0: bit-identical)."""
    master_port: int | None = Field(default=None, ge=1024, le=65535)
    """Rendezvous port on the first host; default: one the host says is free when the run starts."""
    trace_steps: int = Field(default=0, ge=0)
    """Profile this many pipeline steps on every rank in one extra untimed pass (0: no traces)."""
    pg_timeout_s: float = Field(default=300.0, gt=0)
    """Gloo process-group timeout: how long a rank waits for a silent peer."""

    @model_validator(mode="after")
    def _split_implies_explicit(self) -> RunOptions:
        if self.split:
            self.policy = "explicit"
        if self.data != "synthetic" and not self.data_path:
            raise ValueError(f"data '{self.data}' needs data_path")
        if self.model.endswith(".safetensors"):
            self._take_artifact()
        return self

    def _take_artifact(self) -> None:
        from pictl.artifacts import open_artifact

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
            names.update(p.stem for p in d.glob("*.toml"))
    return sorted(names)


def load_profile(name: str, extra: Path | None = None) -> tuple[dict[str, Any], Path]:
    for d in profile_dirs(extra):
        path = d / f"{name}.toml"
        if path.is_file():
            try:
                raw = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
            raw.pop("description", None)
            raw.pop("sweep", None)  # what `pictl sweep` varies; see sweep_settings()
            return raw, path
    known = ", ".join(available_profiles(extra)) or "none"
    raise ConfigError(f"unknown profile '{name}' (available: {known})")


class SweepSettings(BaseModel):
    """A profile's [sweep] table: the values `pictl sweep` combines."""

    model_config = ConfigDict(extra="forbid")

    stages: list[int] = [1, 2, 3, 4]
    chunks: list[int] = [1]
    policy: list[Literal["equal", "balanced"]] = ["equal"]


def sweep_settings(profile: str | None, extra: Path | None = None) -> SweepSettings:
    if not profile:
        return SweepSettings()
    _, path = load_profile(profile, extra)
    raw = tomllib.loads(path.read_text()).get("sweep", {})
    try:
        return SweepSettings(**raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(f"{path}: sweep", exc)) from exc


def resolve_options(profile: str | None, overrides: dict[str, Any], extra: Path | None = None) -> RunOptions:
    """Defaults < profile < flags; flags left at None do not override."""
    base: dict[str, Any] = {}
    source = "command line"
    if profile:
        base, path = load_profile(profile, extra)
        source = str(path)
    merged = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return RunOptions(**merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from exc
