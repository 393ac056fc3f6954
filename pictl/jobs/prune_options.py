"""What `pictl prune` (and the dashboard's pruning form, and `pictl.api.prune`) takes: the options as one
checked model, the spec they become on the host, and `--model-arg` values parsed and bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pictl import errors as E
from pictl.text import shown
from pictl.validation import Namer, problem_line
from remote.floor.spec import DataSpec, PruneSpec


class PruneOptions(BaseModel):
    """A pruning job as a person asks for it; checked before anything starts."""

    model_config = ConfigDict(extra="forbid")

    # Bounds as `pictl train`'s (TrainOptions): a typo of 10**9 epochs or `--lr inf` is refused, not started.
    model: str = Field(default="deit_small_patch16_224", min_length=1, max_length=256)
    model_args: dict[str, Any] = {}
    """Extra timm constructor arguments of the base model (img_size, depth, embed_dim, ...)."""
    num_classes: int = Field(default=0, ge=0, le=100_000)
    checkpoint: str | None = Field(default=None, min_length=1, max_length=4096)
    """Base weights on the controller (.safetensors or a plain .pth state dict); None: seeded random weights."""
    ratio: float = Field(default=0.15, gt=0, lt=1, allow_inf_nan=False)
    importance: Literal["l1", "l2", "taylor", "hessian"] = "hessian"
    global_pruning: bool = False
    prune_heads: bool = False
    round_to: int = Field(default=1, ge=1, le=1024)
    """Kept widths are multiples of this (a ViT's widths are at most a few thousand channels)."""
    calib_batches: int = Field(default=4, ge=1, le=10_000)
    epochs: int = Field(default=1, ge=0, le=10_000)
    lr: float = Field(default=0.01, gt=0, le=10, allow_inf_nan=False)
    batch_size: int = Field(default=32, ge=1, le=4096)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    momentum: float = Field(default=0.9, ge=0, lt=1, allow_inf_nan=False)
    weight_decay: float = Field(default=5e-5, ge=0, allow_inf_nan=False)
    train_images: int = Field(default=0, ge=0, le=10_000_000)
    eval_images: int = Field(default=0, ge=0, le=1_000_000)
    data: Literal["cifar10", "cifar100", "imagefolder"] = "cifar10"
    data_path: str | None = Field(default=None, max_length=4096)  # (empty: `_needs_data` says what it is for)
    threads: int = Field(default=0, ge=0, le=256)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _needs_data(self) -> PruneOptions:
        if not self.data_path:
            raise ValueError(f"data '{self.data}' needs data_path (pruning fine-tunes and evaluates on real data)")
        if self.checkpoint:
            try:
                found = Path(self.checkpoint).expanduser().is_file()
            except OSError as exc:  # a name over 255 bytes, a loop of links: bad input, not a crash
                raise ValueError(f"checkpoint {shown(self.checkpoint)}: {exc.strerror or exc}") from None
            if not found:
                raise ValueError(f"checkpoint {shown(self.checkpoint)}: no such file")
        return self

    def spec(self, *, out: str, checkpoint: str | None, data_path: str) -> PruneSpec:
        fields = self.model_dump(exclude={"model_args", "data", "data_path", "checkpoint"})
        return PruneSpec(**fields, model_kwargs=dict(self.model_args), checkpoint=checkpoint, out=out,
                         data=DataSpec(kind=self.data, path=data_path))


MODEL_ARG_CHARS = 1024
"""The longest `--model-arg` value: a constructor argument is a number, a word or a short list."""
MODEL_ARG_DEPTH = 8
"""How deeply a `--model-arg` value may nest lists and objects (json's parser recurses per level)."""


def parse_model_args(values: list[str] | None) -> dict[str, Any] | None:
    """KEY=VALUE pairs; values are read as JSON where they parse (numbers, booleans), else as text."""
    items = [v.strip() for v in values or [] if v.strip()]
    if not items:
        return None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key.isascii() or not key.isidentifier():
            raise E.ConfigError(f"--model-arg {shown(item, 80)!r}: use KEY=VALUE with KEY a constructor "
                                f"argument's name, e.g. depth=6")
        if len(raw) > MODEL_ARG_CHARS:
            raise E.ConfigError(f"--model-arg {key}: the value has {len(raw)} characters (at most "
                                f"{MODEL_ARG_CHARS})")
        try:
            value = json.loads(raw)
        except RecursionError:
            raise E.ConfigError(f"--model-arg {key}: the value nests more than {MODEL_ARG_DEPTH} deep") from None
        except ValueError:
            value = raw
        if _depth(value) > MODEL_ARG_DEPTH:
            raise E.ConfigError(f"--model-arg {key}: the value nests more than {MODEL_ARG_DEPTH} deep")
        out[key] = value
    return out


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def prune_options(values: dict[str, Any], *, name_of: Namer = str) -> PruneOptions:
    """`values` (None: not given) as checked options: `pictl prune`, its dashboard form and `pictl.prune` all make
    theirs here; ConfigError names the field as the caller calls it (`name_of`: a flag, a keyword)."""
    try:
        return PruneOptions.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as exc:
        raise E.ConfigError(problem_line(exc, PruneOptions, name_of=name_of)) from None
