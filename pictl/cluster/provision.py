"""`pictl provision`: a venv with the pinned torch stack on every host, in parallel.

Per host: one quick command reads the host python's version and the fingerprint
left by the last successful provisioning; when it matches, the host is "up to
date" and nothing else happens. Otherwise the requirements (and, offline, the
wheelhouse) go up and `remote/host/provision.py` (stdlib only, sent as `python -c`)
builds the venv with uv or pip, streaming progress. The fingerprint covers the
requirements, the interpreter, the system-site-packages choice and the wheel
files, so changing any of them provisions again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path

from pydantic import ValidationError

import remote
from pictl import PROJECT_ROOT
from pictl import errors as E
from pictl.cluster.leases import release_all, take_leases
from pictl.cluster.push import file_digests, push_files
from pictl.cluster.transport import Transport
from pictl.inventory import Host
from pictl.summary_figures import Open

PROJECT = PROJECT_ROOT
PROVISION_SOURCE = remote.source("host/provision.py")
# The installer runs under the supervisor too: if the controller goes away, so does pip.
SUPERVISE_SOURCE = remote.source("host/supervise.py")
FINGERPRINT_FILE = ".pictl-provisioned"
MIN_PYTHON = (3, 11)

# Fixed snippet (no user values): the interpreter's version and the venv's fingerprint.
# Written for any python 3, so a too-old host gets a clear answer rather than a SyntaxError.
_STATE_SNIPPET = (
    "import sys, os, json\n"
    "p = os.path.join(os.path.expanduser(sys.argv[1]), sys.argv[2])\n"
    "fp = open(p).read() if os.path.isfile(p) else None\n"
    "print(json.dumps({'version': list(sys.version_info[:3]), 'fingerprint': fp}))\n"
)



class HostPython(Open):
    """What `_STATE_SNIPPET` prints: the host python's version and the fingerprint its venv was provisioned to."""

    version: list[int]
    fingerprint: str | None
    """None: never provisioned there."""


class ProvisionEvent(Open):
    """A line of the provisioner's (`remote.host.provision.emit`): a step it started (`step`, `argv`), an
    installer's line (`line`), and at the end `done` or an `error` with the installer's last lines (`tail`). A line
    that is none of these (its stderr) is read as `line`."""

    step: str | None = None
    argv: list[str] | None = None
    line: str | None = None
    done: bool | None = None
    installer: str | None = None
    """With `done`: uv or pip."""
    seconds: float | None = None
    error: str | None = None
    tail: list[str] = []


Progress = Callable[[str, str], None]
"""(host name, message): a step started, an installer line, the outcome."""


class ProvisionError(E.PictlError):
    """A host's venv could not be made: its python, its paths or its installer."""

    exit_code = E.EXIT_NOT_READY


def remote_requirements() -> list[str]:
    """The one pinned list: pyproject's `remote` extra (from the source tree, else the installed metadata)."""
    pyproject = PROJECT / "pyproject.toml"
    if pyproject.is_file():
        return list(tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["remote"])
    marker = 'extra == "remote"'
    return [r.split(";")[0].strip() for r in metadata.requires("pictl") or [] if marker in r]


@dataclass(frozen=True)
class Wheelhouse:
    """Wheels gathered on the controller for hosts with no package index."""

    path: Path

    def files(self) -> list[Path]:
        return sorted(self.path.glob("*.whl"))

    @cached_property
    def digests(self) -> dict[str, str]:
        """Hashed once, on first need, a block at a time: an up-to-date cluster never reads the wheels,
        and no host's push holds more than one block of one wheel in memory."""
        return file_digests({f.name: f for f in self.files()})

    def identity(self) -> list[tuple[str, int]]:
        # Wheel names carry name, version and platform: name and size identify the set.
        return [(f.name, f.stat().st_size) for f in self.files()]


@dataclass(frozen=True)
class ProvisionResult:
    host: str
    state: str
    """"up to date", "installed" or "skipped" (a local host that uses the controller's own Python)."""
    installer: str | None
    seconds: float


def fingerprint(host: Host, requirements: list[str], wheels: Wheelhouse | None,
                extra_index_url: str | None = None) -> str:
    identity = {"requirements": requirements, "python": host.base_python(), "extra_index_url": extra_index_url,
                "system_site_packages": host.system_site_packages,
                "wheels": wheels.identity() if wheels else None}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _where(host: Host) -> str:
    return f"host '{host.name}'"


async def _host_state(t: Transport) -> tuple[tuple[int, ...], str | None]:
    h = t.host
    result = await t.run([h.base_python(), "-c", _STATE_SNIPPET, h.venv_path(), FINGERPRINT_FILE], timeout_s=30)
    if result.returncode != 0:
        reason = "not found" if result.returncode == 127 else (result.stderr.strip().splitlines() or ["failed"])[-1]
        raise ProvisionError(f"{_where(h)}: python '{h.base_python()}' {reason} (set `python` in the inventory)")
    state = HostPython.model_validate(json.loads(result.stdout.strip().splitlines()[-1]))
    return tuple(state.version), state.fingerprint


async def provision_host(t: Transport, requirements: list[str], wheels: Wheelhouse | None, *,
                         force: bool = False, installer: str = "auto", extra_index_url: str | None = None,
                         progress: Progress = lambda host, msg: None, wait: bool = False) -> ProvisionResult:
    """Install where the fingerprint differs; the host's lease is held while its venv is rebuilt, so a
    live run's environment is never replaced under it (HostBusy, or with `wait`, once it is free)."""
    h = t.host
    start = time.perf_counter()
    if h.transport == "local" and h.venv is None:
        return ProvisionResult(h.name, "skipped", None, 0.0)
    version, placed = await _host_state(t)
    if version < MIN_PYTHON:
        raise ProvisionError(f"{_where(h)}: python '{h.base_python()}' is {'.'.join(map(str, version))}; "
                             f"pictl needs >= 3.11 (set `python` in the inventory)")
    wanted = fingerprint(h, requirements, wheels, extra_index_url)
    if placed == wanted and not force:
        return ProvisionResult(h.name, "up to date", None, time.perf_counter() - start)
    leases = await take_leases([t], f"provision-{time.strftime('%Y%m%d-%H%M%S')}", wait=wait, check_python=False,
                               on_wait=lambda message: progress(h.name, f"{message} ..."))
    try:
        return await _install(t, requirements, wheels, wanted, start, installer=installer,
                              extra_index_url=extra_index_url, progress=progress)
    finally:
        await asyncio.shield(release_all(leases))


async def _install(t: Transport, requirements: list[str], wheels: Wheelhouse | None, wanted: str, start: float, *,
                   installer: str, extra_index_url: str | None, progress: Progress) -> ProvisionResult:
    h = t.host
    base = f"{h.workdir.rstrip('/')}/provision"
    await t.put_bytes(("\n".join(requirements) + "\n").encode(), f"{base}/requirements.txt")
    argv = [h.base_python(), "-c", PROVISION_SOURCE, "--venv", h.venv_path(),
            "--requirements", f"{base}/requirements.txt", "--fingerprint", wanted, "--installer", installer]
    if wheels:
        progress(h.name, f"sending {len(wheels.files())} wheel(s)")
        await t.makedirs(f"{base}/wheels")
        await push_files(t, {f.name: f for f in wheels.files()}, wheels.digests, base=f"{base}/wheels")
        argv += ["--wheels", f"{base}/wheels"]
    if extra_index_url:
        argv += ["--extra-index-url", extra_index_url]
    if h.system_site_packages:
        argv.append("--system-site-packages")
    proc = await t.start([h.base_python(), "-c", SUPERVISE_SOURCE, "--pgid-file", "pgid-provision", "--", *argv],
                         cwd=base)
    outcome = ProvisionEvent()
    try:
        async for stream, line in proc.lines():
            try:
                event = ProvisionEvent.model_validate_json(line) if stream == "stdout" else ProvisionEvent(line=line)
            except ValidationError:
                event = ProvisionEvent(line=line)
            if event.step is not None and event.argv is not None:
                progress(h.name, f"{event.step}: {' '.join(event.argv[:3])} ...")
            elif event.line is not None:
                progress(h.name, event.line)
            elif event.done is not None or event.error is not None:
                outcome = event
        rc = await proc.wait()
    except BaseException:
        await asyncio.shield(proc.stop(grace_s=3))  # Ctrl-C: no installer left running on the host
        raise
    if rc != 0 or outcome.done is None:
        tail = "\n".join(f"    {line}" for line in outcome.tail)
        reason = outcome.error or f"the provisioner exited with {rc}"
        if rc == 2:  # the host cannot hold the venv where the inventory puts it
            reason += " (set `venv` in the inventory)"
        raise ProvisionError(f"{_where(h)}: {reason}" + (f"\n{tail}" if tail else ""))
    return ProvisionResult(h.name, "installed", outcome.installer, time.perf_counter() - start)


async def provision_all(transports: list[Transport], wheels: Wheelhouse | None = None, *, force: bool = False,
                        installer: str = "auto", extra_index_url: str | None = None,
                        progress: Progress = lambda host, msg: None,
                        wait: bool = False) -> list[ProvisionResult | BaseException]:
    """Every host in parallel; one result (or exception) per host, in order."""
    requirements = remote_requirements()
    return await asyncio.gather(*(provision_host(t, requirements, wheels, force=force, installer=installer,
                                                 extra_index_url=extra_index_url, progress=progress, wait=wait)
                                  for t in transports), return_exceptions=True)
