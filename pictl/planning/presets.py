"""Named run presets (`profiles/*.toml`, `--profile NAME`, `pictl profiles`) and how a run's options are resolved.

A run's options come from, lowest to highest: `RunOptions`' defaults (`planning.options`), the preset
(`--profile NAME`), then command-line flags. Profiles are found by name only, first in the user's presets
directory (`user_presets_dir`: $PICTL_PROFILES_DIR, else ~/.config/pictl/profiles on Linux), then in
`./profiles`, then among the shipped ones; a file that hides another of its name is announced
(`shadowed_preset`), and no profile may turn on what only a flag should (`--allow-pickle`). A preset is saved
(`pictl tune`) into the user's presets directory, only where `preset_target` allows: never into the shipped
folder, never over a shipped name without `force`; it keeps the user's protocol (`protocol_of`). Sizes are
capped: a typo of 500000 images is refused, not allocated. A profile's `[rules]` (`planning.rules`) are checked
against the resolved options here, so every front end refuses a graded run that breaks them before it starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import platformdirs
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pictl.errors import ConfigError
from pictl.inventory import read_toml
from pictl.planning.options import RunOptions, as_flag
from pictl.planning.rules import GradingRules, broken_rule, parse_rules
from pictl.shipped import shipped_path
from pictl.validation import Namer, problem_line

__all__ = ["RunOptions", "SweepSettings", "available_presets", "describe_preset", "preset_keys", "preset_path",
           "preset_rules", "preset_target", "protocol_of", "resolve_options", "shadowed_preset", "sweep_settings",
           "user_presets_dir"]

SHIPPED_PRESETS = shipped_path("profiles")  # the folder keeps its name: users have theirs
PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""A profile is named, never a path: `--profile ../x` must not read any TOML file it points at."""
FLAG_ONLY = {"allow_pickle": "--allow-pickle", "artifact": "--model FILE.safetensors"}
"""Options a profile may not set: a profile file lying in the working directory must not opt in to
running code from a pickle, or name an artifact behind `model`'s back."""


PROFILES_DIR_ENV = "PICTL_PROFILES_DIR"
PROTOCOL = ("images", "warmup", "repeats")
"""How a configuration is measured, apart from what it is: a tune measures briefly, its preset keeps the user's."""


def user_presets_dir() -> Path:
    """The user's own presets, where a tune saves its winner: $PICTL_PROFILES_DIR, else `profiles` in the user's
    config directory (platformdirs: ~/.config/pictl/profiles on Linux), found from any working directory."""
    return Path(os.environ.get(PROFILES_DIR_ENV) or platformdirs.user_config_path("pictl") / "profiles")


def _is_shipped(folder: Path) -> bool:
    try:
        return folder.exists() and folder.resolve() == SHIPPED_PRESETS.resolve()
    except (OSError, RuntimeError):  # a loop or a name too long: no folder of ours
        return False


def preset_dirs(extra: Path | None = None) -> list[Path]:
    """Where `--profile NAME` looks, in order: `extra`, the user's presets directory, ./profiles (a project's
    own; left out where it is the shipped folder, as a checkout's link is, so the user's still come first),
    then the shipped presets."""
    dirs = [extra] if extra else []
    local = Path.cwd() / "profiles"
    return [*dirs, user_presets_dir(), *([] if _is_shipped(local) else [local]), SHIPPED_PRESETS]


def available_presets(extra: Path | None = None) -> list[str]:
    names: set[str] = set()
    for d in preset_dirs(extra):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.toml") if PRESET_NAME.fullmatch(p.stem))
    return sorted(names)


def preset_path(name: str, extra: Path | None = None) -> Path:
    """The file `--profile NAME` reads: the first directory that has it."""
    if not isinstance(name, str) or not PRESET_NAME.fullmatch(name):
        raise ConfigError(f"--profile: {name!r} is not a profile name (letters, digits, '-' and '_'; "
                          f"see `pictl profiles`)")
    for d in preset_dirs(extra):
        path = d / f"{name}.toml"
        if path.is_file():
            return path
    known = ", ".join(available_presets(extra)) or "none"
    raise ConfigError(f"unknown profile '{name}' (available: {known})")


def shadowed_preset(name: str | None, extra: Path | None = None) -> str | None:
    """A note when `name` resolves to a file that hides another profile of that name further down the lookup
    (the shipped one, or one in ./profiles)."""
    if name is None:
        return None
    path = preset_path(name, extra)
    hidden = [d / f"{name}.toml" for d in preset_dirs(extra)[preset_dirs(extra).index(path.parent) + 1:]]
    hidden = [p for p in hidden if p.is_file() and p.resolve() != path.resolve()]
    if not hidden:
        return None
    which = "the shipped one" if hidden[0].parent == SHIPPED_PRESETS else "another"
    return f"profile '{name}' is {path}, which shadows {which} ({hidden[0]})"


def protocol_of(profile: str | None, extra: Path | None = None) -> dict[str, int]:
    """The protocol a run of `profile` measures with (its images, warm-up and timed passes; `pictl run`'s
    defaults without one): what a preset a tune saves keeps, not the tune's own shorter measuring protocol."""
    options = resolve_options(profile, {}, extra)
    return {key: getattr(options, key) for key in PROTOCOL}


def preset_target(name: str, directory: Path | None = None, *, force: bool = False,
                  what: str = "--save-as") -> Path:
    """Where a preset called `name` is saved (`directory`, default the user's presets directory), checked before
    anything is measured; ConfigError (naming `what` and the path) for a name that is not a profile name, a
    folder pictl cannot make or write in, the shipped presets' own folder ($PICTL_PROFILES_DIR pointing there: a
    tune writes nothing into pictl itself), something other than a file at NAME.toml, or, without `force`, the
    name of a shipped preset (the saved one would shadow it for every `--profile NAME` run)."""
    from pictl.records.runs import writable_dir

    if not isinstance(name, str) or not PRESET_NAME.fullmatch(name):
        raise ConfigError(f"{what}: {name!r} is not a profile name (letters, digits, '-' and '_')")
    folder = directory or user_presets_dir()
    path = folder / f"{name}.toml"
    writable_dir(folder, f"{what} {name} ({path})")
    if _is_shipped(folder):
        raise ConfigError(f"{what} {name}: {folder} is pictl's shipped presets folder ({SHIPPED_PRESETS}); a "
                          f"tuned preset goes in a profiles folder of your own: set {PROFILES_DIR_ENV} to another")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ConfigError(f"{what} {name}: {path} is not a regular file; move it away or choose another name")
    if (SHIPPED_PRESETS / f"{name}.toml").is_file() and not force:
        raise ConfigError(f"{what} {name}: '{name}' is a shipped preset, and {path} would shadow it for every "
                          f"--profile {name} run; give --force to save it anyway, or another name")
    return path


def _preset_document(name: str, extra: Path | None) -> tuple[dict[str, Any], Path]:
    path = preset_path(name, extra)
    raw = read_toml(path, "profile")
    for key, flag in FLAG_ONLY.items():
        if key in raw:
            raise ConfigError(f"{path}: {key}: a profile cannot set this; give {flag} on the command line")
    return raw, path


def describe_preset(name: str, extra: Path | None = None) -> tuple[str, Path]:
    """A profile's `description` line and the file it comes from (`pictl profiles`)."""
    raw, path = _preset_document(name, extra)
    return str(raw.get("description", "")), path


def load_preset(name: str, extra: Path | None = None) -> tuple[dict[str, Any], Path]:
    raw, path = _preset_document(name, extra)
    raw.pop("description", None)
    raw.pop("sweep", None)  # what `pictl sweep` varies; see sweep_settings()
    raw.pop("rules", None)  # what a run under it must keep to; see preset_rules()
    return raw, path


def preset_rules(name: str | None, extra: Path | None = None) -> GradingRules | None:
    """A profile's grading rules (`[rules]`; `planning.rules`), None without a profile or without the table."""
    if name is None:
        return None
    raw, path = _preset_document(name, extra)
    return parse_rules(raw.get("rules"), str(path))


def preset_keys(name: str | None, extra: Path | None = None) -> set[str]:
    """The options a profile sets (none without one): what `pictl tune` keeps fixed instead of searching."""
    return set(load_preset(name, extra)[0]) if name is not None else set()


class SweepSettings(BaseModel):
    """The values a sweep combines: a profile's [sweep] table, `pictl sweep`'s lists and `pictl.sweep`'s
    (`sweep_axes`). Each value's own bounds are the run's (`RunOptions`: every point is checked as a run)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # At least one of each: an empty list would be a sweep of nothing, "done" without a word.
    stages: list[int] = Field(default=[1, 2, 3, 4], min_length=1, max_length=64)
    chunks: list[int] = Field(default=[1], min_length=1, max_length=64)
    policy: list[Literal["equal", "balanced"]] = Field(default=["equal"], min_length=1, max_length=2)
    slots: int | None = Field(default=None, ge=1, le=64)
    """Stages a host may run in this sweep where the inventory's `slots` are too few for a stage count: the
    course's 6 stages on 4 Pis put 2 on some (`lab6-stages` sets 2). None: the inventory's slots only."""


def sweep_settings(profile: str | None, extra: Path | None = None) -> SweepSettings:
    if profile is None:
        return SweepSettings()
    raw, path = _preset_document(profile, extra)
    sweep = raw.get("sweep", {})
    if not isinstance(sweep, dict):
        raise ConfigError(f"{path}: 'sweep' must be a table ([sweep]), not a {type(sweep).__name__}")
    try:
        return SweepSettings(**sweep)
    except ValidationError as exc:
        raise ConfigError(problem_line(exc, SweepSettings, source=f"{path}: sweep")) from exc


def sweep_axes(stages: Any, chunks: Any, policy: Any, *, name_of: Namer = str, slots: Any = None) -> SweepSettings:
    """What a sweep combines, given on the command line or in Python, checked by the model a profile's [sweep]
    table is; ConfigError names the value as the caller calls it (`name_of`: `--policy`, `policies`)."""
    try:
        return SweepSettings.model_validate({"stages": stages, "chunks": chunks, "policy": policy, "slots": slots})
    except ValidationError as exc:
        raise ConfigError(problem_line(exc, SweepSettings, name_of=name_of)) from None


def resolve_options(profile: str | None, overrides: dict[str, Any], extra: Path | None = None, *,
                    source: str = "command line", name_of: Callable[[str], str] = as_flag) -> RunOptions:
    """Defaults < profile < flags; flags left at None do not override. Errors name the flag (`name_of`: the
    dashboard's form names its fields instead, the Python API its keywords) or the profile file, else `source`.
    Every front end's options are made here, and only here, so each is checked by the same model and bounds."""
    base: dict[str, Any] = {}
    if profile is not None:  # `--profile ''` is a mistake to name (preset_path does), not "no profile"
        base, path = load_preset(profile, extra)
        source = str(path)
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        options = RunOptions.model_validate({**base, **given})
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        if loc and loc[0] in given:  # the flag is to blame, not the profile
            raise ConfigError(problem_line(exc, RunOptions, name_of=name_of)) from None
        raise ConfigError(problem_line(exc, RunOptions, source=source)) from None
    rules = preset_rules(profile, extra)
    broken = broken_rule(rules, options) if rules is not None else None
    if broken:  # a graded preset's protocol is not the user's to change: refused before anything starts
        raise ConfigError(f"profile '{profile}' ({source}): breaks its rule {broken}")
    return options
