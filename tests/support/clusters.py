"""Local clusters for tests, the processes they leave, and skipping that CI never does silently."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest


def write_cluster(path: Path, hosts: int, *, slots: int = 1) -> Path:
    """A local inventory whose work directories live under `path` (so tests can find their processes)."""
    body = ['[cluster]\nname = "test"\n', '[defaults]\ntransport = "local"\ninterface = "lo"\n'
            f"slots = {slots}\n"]
    for i in range(hosts):
        body.append(f'[[host]]\nname = "h{i}"\nworkdir = "{path}/h{i}"\n')
    path.mkdir(parents=True, exist_ok=True)
    inv = path / "hosts.toml"
    inv.write_text("\n".join(body))
    return inv


def skip_loudly(reason: str) -> None:
    """Skip with a reason nobody can miss; under CI=true, fail instead: CI must run everything."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"must run in CI: {reason}")
    pytest.skip(reason.upper() if len(reason) < 60 else reason)


def require_netns(cluster: Any, why: str) -> None:
    """For tests that need the root cluster (own logins and addresses, cgroups, the lab image)."""
    if not cluster.netns:
        skip_loudly(f"NEEDS ROOT: the loopback SSH cluster has no {why}; this runs in CI")


def processes_under(root: Path) -> list[psutil.Process]:
    """Processes whose working directory is inside this test's cluster (ranks, torchrun agents)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if str(root) in proc.cwd():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def host_processes(cluster: Any) -> dict[str, list[str]]:
    """What every test host runs for pictl (its login's processes; on loopback, those in its workdir)."""
    # A process between exit and zombie has no command line: its pid, name and state say what it was.
    found = {f"h{i}": [" ".join(p.info["cmdline"] or [])[:100] or f"[pid {p.pid} {_name(p)}, {p.info['status']}]"
                       for p in cluster.processes(i)] for i in range(cluster.n)}
    return {host: procs for host, procs in found.items() if procs}


def _name(p: Any) -> str:
    try:
        return f"{p.name()} of {p.ppid()}"
    except Exception:  # gone meanwhile
        return "gone"


def assert_hosts_clean(cluster: Any, timeout: float = 15) -> None:
    """Nothing of pictl's is left on any host (within `timeout`: processes take a moment to go)."""
    deadline = time.monotonic() + timeout
    while host_processes(cluster) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not host_processes(cluster), f"left on the hosts: {host_processes(cluster)}"


def dead_endpoint(cluster: Any) -> dict[str, Any]:
    """Where no host answers: an unused address on the namespaces' bridge, a closed port on loopback."""
    if cluster.netns:
        return {"address": "10.231.0.99"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return {"port": s.getsockname()[1]}
