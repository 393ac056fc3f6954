"""Options declared once and composed into commands: an option group is a dataclass whose fields are the
options (`Annotated[..., typer.Option(...)]`: flag names, help, panel, parser, and the field's default), and
`@grouped` lets a command take the group as one parameter.

Typer has no parameter groups: it builds a command's options from `inspect.signature` of the function. So
`@grouped` hands Typer a signature with every group's fields in the group's place (`__signature__`), and on
a call packs the values back into one group object per group: `sweep(measure: MeasureFlags, where: HostFlags, ...)`
reads `measure.images`. The groups here are the ones several commands share; a group only one command takes
lives with that command.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar, get_type_hints

from pictl.cli.common import (
    ColdOpt,
    HeadlessOpt,
    HostsOpt,
    ImagesOpt,
    JsonOpt,
    RepeatsOpt,
    RunsDirOpt,
    ThreadsOpt,
    TrackOpt,
    VerboseOpt,
    WaitOpt,
    WarmupOpt,
)

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Options a command takes together; subclasses are dataclasses whose fields are the options."""

    def values(self) -> dict[str, Any]:
        """Every option by its field name, a choice as its text (None: not given): what the options' models
        (`given_options`, `train_options`, `prune_options`) take."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, OptionGroup)


def grouped(command: Callable[..., R]) -> Callable[..., R]:
    """`command` as Typer reads it: each `OptionGroup` parameter spread into its fields, in its place and order
    (so `--help` lists them where the parameter stands); called with the fields, it calls `command` with one
    group object per group. `__wrapped__` is the function as written."""
    signature = inspect.signature(command)
    hints = get_type_hints(command, include_extras=True)
    spread: list[inspect.Parameter] = []
    groups: dict[str, tuple[type[OptionGroup], tuple[str, ...]]] = {}
    for param in signature.parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if not _is_group(annotation):
            spread.append(param.replace(annotation=annotation))
            continue
        fields = dataclasses.fields(annotation)
        field_hints = get_type_hints(annotation, include_extras=True)
        spread += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=field_hints[f.name],
                                     default=f.default) for f in fields]
        groups[param.name] = (annotation, tuple(f.name for f in fields))
    names = [p.name for p in spread]
    clash = sorted({n for n in names if names.count(n) > 1} | (set(groups) & set(names)))
    if clash:  # a programming mistake: two options would fight over one flag, or a group over an option's name
        raise TypeError(f"{command.__name__}: {', '.join(clash)} named twice")

    @functools.wraps(command)
    def call(**values: Any) -> R:
        for name, (group, fields) in groups.items():
            values[name] = group(**{f: values.pop(f) for f in fields})
        return command(**values)

    # Keyword-only throughout: Typer calls with keywords, and defaults may now precede parameters without.
    call.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in spread],
        return_annotation=hints.get("return", inspect.Signature.empty))
    # Typer also reads the annotations (get_type_hints): the spread ones, already evaluated.
    call.__annotations__ = {p.name: p.annotation for p in spread}
    return call


@dataclasses.dataclass(frozen=True)
class MeasureFlags(OptionGroup):
    """How a run is measured: `pictl run` and `pictl sweep`."""

    images: ImagesOpt = None
    warmup: WarmupOpt = None
    repeats: RepeatsOpt = None
    threads: ThreadsOpt = None


@dataclasses.dataclass(frozen=True)
class HostFlags(OptionGroup):
    """Which hosts, in what state, and where the records go: `pictl sweep`, `train` and `tune`."""

    hosts: HostsOpt = None
    wait: WaitOpt = False
    cold: ColdOpt = False
    runs_dir: RunsDirOpt = None


@dataclasses.dataclass(frozen=True)
class OutputFlags(OptionGroup):
    """What a job prints and where else its result goes: `pictl sweep` and `train`."""

    headless: HeadlessOpt = False
    verbose: VerboseOpt = False
    as_json: JsonOpt = False
    track: TrackOpt = None
