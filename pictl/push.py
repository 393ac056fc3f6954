"""Sync what the hosts need (`remote/`, `profiles/`) with a content-hash manifest.

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
from pathlib import Path

from pictl.errors import TransportError
from pictl.transport import Transport

PROJECT = Path(__file__).resolve().parent.parent
MANIFEST = ".pictl-manifest.json"


@dataclass(frozen=True)
class PushResult:
    host: str
    sent: int
    bytes_sent: int
    removed: int
    unchanged: int


def local_tree() -> dict[str, bytes]:
    """What every host gets: the `remote/` package and the run presets."""
    files = {f"remote/{p.name}": p.read_bytes() for p in sorted((PROJECT / "remote").glob("*.py"))}
    files.update({f"profiles/{p.name}": p.read_bytes() for p in sorted((PROJECT / "profiles").glob("*.toml"))})
    return files


def manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def tree_digest() -> str:
    return hashlib.sha256(json.dumps(manifest_of(local_tree()), sort_keys=True).encode()).hexdigest()[:16]


async def _remote_manifest(t: Transport, base: str) -> dict[str, str]:
    try:
        raw = await t.get_bytes(f"{base}/{MANIFEST}")
    except TransportError:
        return {}  # first push, or a manifest we cannot read: send everything
    try:
        data = json.loads(raw)
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except ValueError:
        return {}


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
    placed = await _remote_manifest(t, base)
    changed = [name for name, digest in wanted.items() if placed.get(name) != digest]
    gone = [name for name in placed if name not in wanted]
    # SFTP serves several requests at once on one channel: overlap the round trips.
    await _bounded(t.put_bytes(files[name], f"{base}/{name}") for name in changed)
    await _bounded(t.remove_file(f"{base}/{name}") for name in gone)
    if changed or gone or placed != wanted:
        await t.put_bytes(json.dumps(wanted, sort_keys=True, indent=1).encode(), f"{base}/{MANIFEST}")
    return PushResult(t.host.name, len(changed), sum(len(files[n]) for n in changed), len(gone),
                      len(wanted) - len(changed))


async def push_all(transports: list[Transport]) -> list[PushResult | BaseException]:
    """Push to every host in parallel; one result (or exception) per host, in order."""
    files = local_tree()
    return await asyncio.gather(*(push_to(t, files) for t in transports), return_exceptions=True)
