"""What pictl ships beside its code: the local-cluster inventory (`hosts.toml`) and the run presets
(`profiles/*.toml`). They are package data, so a wheel install finds them where a checkout does (the
checkout's top-level `hosts.toml` and `profiles/` are links to these)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped_path(name: str) -> Path:
    """The installed file or folder `name` under pictl/shipped (a real path: pictl installs unzipped)."""
    resource = files(__name__) / name
    if not isinstance(resource, Path):
        raise RuntimeError(f"pictl's shipped {name} is not on the file system ({resource}); install pictl unzipped")
    return resource
