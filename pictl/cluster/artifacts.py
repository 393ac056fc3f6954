"""Pruned-model artifacts on the controller: identify them, and put them on the hosts once.

An artifact goes to `<workdir>/models/<digest>.safetensors` on each host. The name is
the file's content hash and the upload is atomic (temporary name, then rename), so a
file with that name is complete and current: a second run sends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pictl import errors as E
from pictl.cluster.transport.base import Transport
from pictl.inventory import Host
from remote.floor.artifact_meta import ArtifactMeta, read_artifact_meta
from remote.floor.errors import BadInput

MODELS_DIR = "models"


@lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:20]


@dataclass(frozen=True)
class Artifact:
    path: Path
    digest: str
    meta: ArtifactMeta

    @property
    def file_name(self) -> str:
        return f"{self.digest}.safetensors"

    def host_path(self, host: Host) -> str:
        """Where it lives on `host` (for commands that do not run in a run directory)."""
        return f"{host.workdir.rstrip('/')}/{MODELS_DIR}/{self.file_name}"

    @property
    def run_relative_path(self) -> str:
        # Run directories are <workdir>/runs/<id> on every host, so one relative path serves
        # hosts whose workdirs differ, and the single spec file stays the same for all.
        return f"../../{MODELS_DIR}/{self.file_name}"


def open_artifact(path: str | Path) -> Artifact:
    """A pictl artifact, or one ConfigError naming the file."""
    p = Path(path).expanduser().resolve()
    try:
        meta = read_artifact_meta(p)
    except BadInput as exc:
        raise E.ConfigError(str(exc)) from None
    if meta is None:
        raise E.ConfigError(f"model artifact {p}: a plain state dict, not a pruned-model artifact "
                            f"(pass it as --checkpoint with its timm --model name)")
    st = p.stat()
    return Artifact(p, _digest(str(p), st.st_size, st.st_mtime_ns), meta)


async def ship(t: Transport, artifact: Artifact) -> bool:
    """Make sure the host has the artifact; True when it had to be sent."""
    # Relative to the workdir (a cwd is expanded on every transport; a `~` argument is not, locally).
    present = await t.run(["test", "-s", f"{MODELS_DIR}/{artifact.file_name}"], cwd=t.host.workdir, timeout_s=30)
    if present.returncode == 0:
        return False
    await t.put_file(artifact.path, artifact.host_path(t.host))  # streamed: never whole in memory (weights)
    return True


async def ship_all(transports: list[Transport], artifact: Artifact) -> list[bool | BaseException]:
    return await asyncio.gather(*(ship(t, artifact) for t in transports), return_exceptions=True)


def artifact_summary(artifact: Artifact) -> dict:
    """What a run summary records of the pruned model it ran (the report's model table reads it)."""
    m = artifact.meta
    return {"path": str(artifact.path), "digest": artifact.digest, "base_model": m.base_model, "ratio": m.ratio,
            "importance": m.importance, "params": m.params, "params_base": m.params_base, "macs": m.macs,
            "macs_base": m.macs_base, "top1_before": m.accuracy.get("before"),
            "top1_pruned": m.accuracy.get("pruned"), "top1": m.accuracy.get("best"), "dataset": m.dataset}
