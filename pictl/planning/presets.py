"""Named run presets (`profiles/*.toml`, `--profile NAME`, `pictl profiles`) and how a run's options are resolved.

A run's options come from, lowest to highest: `RunOptions`' defaults (`planning.options`), the preset
(`--profile NAME`), then command-line flags. Profiles are found by name only
(`./profiles/NAME.toml`, then the shipped one); a local file that shadows a
shipped profile is announced (`shadowed_preset`), and no profile may turn on
what only a flag should (`--allow-pickle`). Sizes are capped: a typo of 500000
images is refused, not allocated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pictl.errors import ConfigError
from pictl.inventory import format_validation_error, read_toml
from pictl.planning.options import RunOptions, as_flag
from pictl.shipped import shipped_path

__all__ = ["RunOptions", "SweepSettings", "available_presets", "describe_preset", "preset_keys", "preset_path",
           "resolve_options", "shadowed_preset", "sweep_settings"]

SHIPPED_PRESETS = shipped_path("profiles")  # the folder keeps its name: users have theirs
PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""A profile is named, never a path: `--profile ../x` must not read any TOML file it points at."""
FLAG_ONLY = {"allow_pickle": "--allow-pickle", "artifact": "--model FILE.safetensors"}
"""Options a profile may not set: a profile file lying in the working directory must not opt in to
running code from a pickle, or name an artifact behind `model`'s back."""


def preset_dirs(extra: Path | None = None) -> list[Path]:
    dirs = [extra] if extra else []
    return [*dirs, Path.cwd() / "profiles", SHIPPED_PRESETS]


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
    """A note when `name` resolves to a local file that hides the shipped profile of that name."""
    if name is None:
        return None
    path = preset_path(name, extra)
    shipped = SHIPPED_PRESETS / f"{name}.toml"
    if shipped.is_file() and path.resolve() != shipped.resolve():
        return f"profile '{name}' is {path}, which shadows the shipped one ({shipped})"
    return None


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
    return raw, path


def preset_keys(name: str | None, extra: Path | None = None) -> set[str]:
    """The options a profile sets (none without one): what `pictl tune` keeps fixed instead of searching."""
    return set(load_preset(name, extra)[0]) if name is not None else set()


class SweepSettings(BaseModel):
    """A profile's [sweep] table: the values `pictl sweep` combines."""

    model_config = ConfigDict(extra="forbid", strict=True)

    stages: list[int] = Field(default=[1, 2, 3, 4], max_length=64)
    chunks: list[int] = Field(default=[1], max_length=64)
    policy: list[Literal["equal", "balanced"]] = Field(default=["equal"], max_length=2)


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
        raise ConfigError(format_validation_error(f"{path}: sweep", exc)) from exc


def resolve_options(profile: str | None, overrides: dict[str, Any], extra: Path | None = None, *,
                    source: str = "command line", name_of: Callable[[str], str] = as_flag) -> RunOptions:
    """Defaults < profile < flags; flags left at None do not override. Errors name the flag (`name_of`: the
    dashboard's form names its fields instead) or the profile file, else `source`."""
    base: dict[str, Any] = {}
    if profile is not None:  # `--profile ''` is a mistake to name (preset_path does), not "no profile"
        base, path = load_preset(profile, extra)
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
