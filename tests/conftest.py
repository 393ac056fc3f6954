"""Shared fixtures: an isolated local cluster, run and cache dirs, a `pictl` runner."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


@pytest.fixture
def cluster4(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "cluster", 4)


def run_pictl(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


@pytest.fixture(scope="session")
def ssh_cluster():
    """The real sshd cluster (4 hosts in network namespaces). Skips loudly on a laptop, fails in CI."""
    from sshcluster import SshCluster, Unavailable, down

    cluster = SshCluster(4)
    try:
        cluster.inventory = cluster.up()
    except Unavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SSH test cluster must run in CI: {exc}")
        pytest.skip(f"SSH TEST CLUSTER UNAVAILABLE ({exc}); these tests run in CI")
    yield cluster
    down()
