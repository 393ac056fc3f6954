"""Sync what the hosts need (the `remote/` package) with a content-hash manifest.

The manifest (`<code dir>/.pictl-manifest.json`, {path: sha256}) is what pictl
placed last time. A push sends only files whose hash changed, each to a
temporary name renamed into place, removes files it placed earlier that no longer
exist, and never touches anything it did not place. An unchanged re-push reads
one small file per host and sends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pictl import PROJECT_ROOT
from pictl.cluster.transport import Transport
from pictl.errors import ConfigError, TransportError
from remote.floor.spec import RESERVED_MODULES, factory_of

PROJECT = PROJECT_ROOT
MANIFEST = ".pictl-manifest.json"
MANIFEST_LIMIT = 16 << 20
"""A manifest of a few hundred files is tens of kB; a larger one is not pictl's (and is sent anew)."""


@dataclass(frozen=True)
class PushResult:
    host: str
    sent: int
    bytes_sent: int
    removed: int
    unchanged: int


def local_tree(model: str | None = None) -> dict[str, bytes]:
    """What every host gets: the `remote/` package (the presets stay on the controller), and the module of a
    user's own model (`package.module:factory`) when `model` names one."""
    remote = PROJECT / "remote"
    files = {f"remote/{p.relative_to(remote).as_posix()}": p.read_bytes() for p in sorted(remote.rglob("*.py"))
             if "__pycache__" not in p.parts}
    return {**files, **user_tree(model)} if model else files


USER_CODE_LIMIT = (500, 32 << 20)
"""The most files and bytes a user's model package may push: more is not a model's code."""


def user_tree(model: str, root: Path | None = None) -> dict[str, bytes]:
    """The code of a user's own model (`package.module:factory`), read from `root` (the directory pictl runs in),
    by the names it takes beside `remote/` on the hosts (where their interpreter finds it). Empty for any other
    model; ConfigError when it cannot be found."""
    return {name: path.read_bytes() for name, path in user_files(model, root).items()}


def user_files(model: str, root: Path | None = None) -> dict[str, Path]:
    """Which files `user_tree` pushes, checked without reading them: the file `package.py`, or every `.py` file of
    the package `package/` (what options validation asks: the module is there, and is a model's code)."""
    named = factory_of(model)
    if named is None:
        return {}
    root = root or Path.cwd()
    top = named[0].split(".")[0]
    if top in RESERVED_MODULES:
        raise ConfigError(f"model '{model}': '{top}' is pictl's own name; give your module another")
    if (root / f"{top}.py").is_file() and "." not in named[0]:
        return {f"{top}.py": root / f"{top}.py"}
    package = root / top
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts) if package.is_dir() else []
    if not files:
        raise ConfigError(f"model '{model}': no {top}.py or package {top}/ in {root} (a model's module is pushed "
                          f"from the directory pictl runs in)")
    if len(files) > USER_CODE_LIMIT[0] or sum(p.stat().st_size for p in files) > USER_CODE_LIMIT[1]:
        raise ConfigError(f"model '{model}': package {package} holds more than {USER_CODE_LIMIT[0]} files or "
                          f"{USER_CODE_LIMIT[1] >> 20} MB; pictl pushes a model's code, not a project")
    return {f"{top}/{p.relative_to(package).as_posix()}": p for p in files}


def manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def manifest_digest(files: dict[str, bytes]) -> str:
    """One short digest of a tree: what keys every cache that depends on the code the hosts run."""
    return hashlib.sha256(json.dumps(manifest_of(files), sort_keys=True).encode()).hexdigest()[:16]


def tree_digest() -> str:
    """The digest of the tree as it is now (a run reads it once: `RunContext.code`)."""
    return manifest_digest(local_tree())


async def _remote_manifest(t: Transport, base: str) -> tuple[dict[str, str], bool]:
    """What pictl placed last time, and whether the file held anything else (then it is rewritten)."""
    try:
        raw = await t.get_bytes(f"{base}/{MANIFEST}", limit=MANIFEST_LIMIT)
    except TransportError:
        return {}, False  # first push, or a manifest we cannot read: send everything
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}, True
    if not isinstance(data, dict):
        return {}, True
    # The host wrote this file: a name in it is only ever a path pictl itself could have placed there
    # (`../../x` would remove a file outside the code dir; on the local cluster, a file on the controller).
    placed = {k: v for k, v in data.items() if placed_name(k) and isinstance(v, str)}
    return placed, len(placed) != len(data)


def placed_name(name: object) -> bool:
    """Whether `name` is a relative path that stays inside the directory it is joined to."""
    if not isinstance(name, str) or not name or len(name) > 1024 or "\\" in name:
        return False
    if any(ch in name for ch in "\0\n\r") or name.startswith("/"):
        return False
    parts = PurePosixPath(name).parts
    return bool(parts) and all(p not in ("", ".", "..") for p in parts)


async def _bounded(jobs: Iterable[Awaitable[None]], limit: int = 16) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(job: Awaitable[None]) -> None:
        async with gate:
            await job

    await asyncio.gather(*(one(j) for j in jobs))


async def push_to(t: Transport, files: dict[str, bytes] | None = None, *, base: str | None = None) -> PushResult:
    """Make `base` (default: the host's code dir) hold exactly `files`, sending only what changed."""
    files = files if files is not None else local_tree()
    base = base or t.host.code_dir
    wanted = manifest_of(files)
    placed, foreign = await _remote_manifest(t, base)
    changed = [name for name, digest in wanted.items() if placed.get(name) != digest]
    gone = [name for name in placed if name not in wanted]
    # SFTP serves several requests at once on one channel: overlap the round trips.
    await _bounded(t.put_bytes(files[name], f"{base}/{name}") for name in changed)
    await _bounded(t.remove_file(f"{base}/{name}") for name in gone)
    if changed or gone or foreign or placed != wanted:
        await t.put_bytes(json.dumps(wanted, sort_keys=True, indent=1).encode(), f"{base}/{MANIFEST}")
    return PushResult(t.host.name, len(changed), sum(len(files[n]) for n in changed), len(gone),
                      len(wanted) - len(changed))


def file_digests(paths: dict[str, Path]) -> dict[str, str]:
    """sha256 of each file, read in blocks (a wheelhouse is gigabytes: never whole in memory)."""
    out = {}
    for name, path in paths.items():
        with path.open("rb") as fh:
            out[name] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


async def push_files(t: Transport, paths: dict[str, Path], digests: dict[str, str], *, base: str) -> PushResult:
    """Like `push_to`, for large local files: streamed one at a time, each file read as it is sent."""
    placed, foreign = await _remote_manifest(t, base)
    changed = [name for name, digest in digests.items() if placed.get(name) != digest]
    gone = [name for name in placed if name not in digests]
    for name in changed:
        await t.put_file(paths[name], f"{base}/{name}")
    await _bounded(t.remove_file(f"{base}/{name}") for name in gone)
    if changed or gone or foreign or placed != digests:
        await t.put_bytes(json.dumps(digests, sort_keys=True, indent=1).encode(), f"{base}/{MANIFEST}")
    return PushResult(t.host.name, len(changed), sum(paths[n].stat().st_size for n in changed), len(gone),
                      len(digests) - len(changed))

