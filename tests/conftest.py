"""Shared fixtures: an isolated local cluster, run and cache dirs, a `pictl` runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.fixture
def pictl_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PICTL_RUNS_DIR=str(tmp_path / "runs"), PICTL_CACHE_DIR=str(tmp_path / "cache"),
               COLUMNS="200")
    return env


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    """A cache dir shared by a module's tests: long runs whose faults are in the pipeline measure the
    serial baseline once, not once per test."""
    return tmp_path_factory.mktemp("module-cache")


@pytest.fixture
def shared_cache_env(pictl_env: dict[str, str], module_cache: Path) -> dict[str, str]:
    return {**pictl_env, "PICTL_CACHE_DIR": str(module_cache)}


@pytest.fixture
def cluster4(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "cluster", 4)


def run_pictl(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


def skip_loudly(reason: str) -> None:
    """Skip with a reason nobody can miss; under CI=true, fail instead: CI must run everything."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"must run in CI: {reason}")
    pytest.skip(reason.upper() if len(reason) < 60 else reason)


def require_netns(cluster, why: str) -> None:  # noqa: ANN001
    """For tests that need the root cluster (own logins and addresses, cgroups, the lab image)."""
    if not cluster.netns:
        skip_loudly(f"NEEDS ROOT: the loopback SSH cluster has no {why}; this runs in CI")


@pytest.fixture(scope="session")
def ssh_cluster():
    """The real sshd cluster: 4 hosts in network namespaces as root, else on loopback ports."""
    from sshcluster import Unavailable, start_cluster

    try:
        cluster = start_cluster(4)
    except Unavailable as exc:
        skip_loudly(f"SSH TEST CLUSTER UNAVAILABLE ({exc})")
    yield cluster
    cluster.down()


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
