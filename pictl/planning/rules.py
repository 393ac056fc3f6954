"""Grading rules a preset carries (`[rules]` in a profile) and the check of a run's options against them.

A course fixes how a result is measured: the lab's pipeline runs chunk 1 on 4 stages over 500 images, its output
must be the serial run's bit for bit, and a pruned model must keep 88 % top-1. A profile states that as a table:

    [rules]
    chunk = 1          # fixed values: the run's option must equal each one given
    images = 500
    stages = 4
    exact = true       # an exact wire (fp32), fp32 numerics, atol 0: outputs identical to the serial run's
    min_accuracy = 0.88  # a floor on top-1: the run must measure accuracy (a labelled data set)

`pictl run --profile NAME` checks its options here before anything starts (`planning.presets.resolve_options`:
a broken rule is exit 2, one line naming the profile and the rule); `pictl verify` checks a bundle's options and
its measured accuracy again (`broken_rule`, `below_floor`). No torch, no hosts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pictl.errors import ConfigError
from pictl.planning.options import RunOptions
from pictl.validation import problem_line

__all__ = ["FIXED", "GradingRules", "below_floor", "broken_rule", "parse_rules"]

FIXED = ("chunk", "images", "stages", "replicas", "warmup", "repeats", "threads")
"""The options a rule may fix to one value (the batch of the serial run is the chunk: they run the same batches)."""


class GradingRules(BaseModel):
    """A profile's `[rules]`: what a run under it must keep to. Every field left out is no rule."""

    model_config = ConfigDict(extra="forbid", strict=True)

    chunk: int | None = Field(default=None, ge=1)
    """The pipeline's microbatch (and the serial run's batch): the lab's is 1."""
    images: int | None = Field(default=None, ge=1)
    """Images per pass."""
    stages: int | None = Field(default=None, ge=1)
    """Pipeline stages."""
    replicas: int | None = Field(default=None, ge=1)
    """Copies of the pipeline."""
    warmup: int | None = Field(default=None, ge=0)
    """Untimed warm-up passes."""
    repeats: int | None = Field(default=None, ge=1)
    """Timed passes."""
    threads: int | None = Field(default=None, ge=0)
    """torch threads per rank."""
    exact: bool = False
    """The outputs must equal the serial run's bit for bit: an exact wire, fp32 numerics, `atol` 0."""
    min_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    """The least top-1 accuracy the run may measure (a share, 0.88): it needs a labelled data set."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_defaults=True)


def parse_rules(raw: Any, source: str) -> GradingRules | None:
    """A profile's `[rules]` table as GradingRules (None: it has none); ConfigError naming `source` and the key."""
    if raw is None:
        return None
    try:
        return GradingRules.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(problem_line(exc, GradingRules, name_of=lambda f: f"rules.{f}", source=source)) from None


def broken_rule(rules: GradingRules, options: RunOptions) -> str | None:
    """The first rule `options` break, as `RULE: what the rule asks, what was given`; None when they keep every one."""
    for name in FIXED:
        wanted = getattr(rules, name)
        if wanted is not None and getattr(options, name) != wanted:
            return f"{name} = {wanted} (this run: {getattr(options, name)})"
    if rules.exact:
        if options.lossy_wire:
            return f"exact = true (this run's wire {options.wire} is lossy)"
        if options.numerics != "fp32":
            return f"exact = true (this run's numerics are {options.numerics})"
        if options.atol != 0:
            return f"exact = true (this run allows --atol {options.atol})"
    if rules.min_accuracy is not None and options.data == "synthetic":
        return (f"min_accuracy = {rules.min_accuracy} (this run's data is synthetic: accuracy needs a labelled "
                f"data set, --data cifar10/cifar100/imagefolder)")
    return None


def below_floor(rules: GradingRules, accuracy: float | None, floor: float | None = None) -> str | None:
    """Why a measured `accuracy` misses the floor (the rules' `min_accuracy`, or a stricter `floor` given), or
    None."""
    floors = [f for f in (rules.min_accuracy, floor) if f is not None]
    if not floors:
        return None
    least = max(floors)
    if accuracy is None:
        return f"min_accuracy = {least} (the run measured no accuracy)"
    if accuracy < least:
        return f"min_accuracy = {least} (the run measured {accuracy:.4f})"
    return None
