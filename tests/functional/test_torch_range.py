"""A host whose torch lies outside the range the host code runs on (`remote.floor.torch_support`) is not ready:
`pictl check` says so, and a run refuses it before anything runs there (exit 6, one line naming the host, its
torch and the range), whichever comes first, balanced's cost profiling or the staging of the serial baseline.

The old host is a real venv whose torch is a package's metadata saying 1.13.1 (what `pictl check` and a run
read, without importing torch): an honest stand-in for the refusal, not for running. That the supported
range runs is shown by the real runs on the pinned torch and by tests/unit/test_torch_support.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import processes_under

OLD = {"torch": "1.13.1", "torchvision": "0.14.1", "timm": "1.0.31"}


def old_venv(path: Path) -> Path:
    """A venv holding only the metadata of an old torch stack."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = next(path.glob("lib/python3*/site-packages"))
    for name, version in OLD.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    """h0 on the old venv, h1 on the controller's (the pinned torch)."""
    root = tmp_path_factory.mktemp("torch-range")
    venv = old_venv(root / "old-venv")
    inventory = root / "hosts.toml"
    inventory.write_text('[cluster]\nname = "t"\n[defaults]\ntransport = "local"\ninterface = "lo"\n\n'
                         f'[[host]]\nname = "h0"\nworkdir = "{root}/h0"\nvenv = "{venv}"\n\n'
                         f'[[host]]\nname = "h1"\nworkdir = "{root}/h1"\n')
    return inventory


WHY = "has torch 1.13.1, outside the range pictl runs on (torch >= 2.13, < 2.15): run `pictl provision`"


def test_check_calls_the_old_host_not_ready(cluster: Path, pictl_env) -> None:
    proc = run_pictl(["check", "--json", "--hosts", str(cluster)], pictl_env)
    assert proc.returncode == 6, proc.stderr
    hosts = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert hosts["h1"]["ready"] is True and hosts["h0"]["ready"] is False
    why = f"its venv {cluster.parent}/old-venv {WHY}"
    assert hosts["h0"]["problems"] == [why]
    assert proc.stderr.strip().splitlines() == [f"pictl: host 'h0' is not ready: {why}"]


@pytest.mark.parametrize("policy", ["balanced", "equal"])  # refused by the cost profiling, and at staging
def test_a_run_refuses_the_old_host_before_anything_runs(policy: str, cluster: Path, pictl_env) -> None:
    proc = run_pictl(["run", "--hosts", str(cluster), "--stages", "2", "--policy", policy, "--images", "2",
                      "--headless"], pictl_env)
    assert proc.returncode == 6, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [f"pictl: error: host 'h0': its venv {cluster.parent}/old-venv {WHY}"], proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == errors[0] and proc.stdout == ""
    runs = Path(pictl_env["PICTL_RUNS_DIR"])
    assert not runs.exists() or not any(runs.iterdir()), "a refused run left a record"
    assert not list(cluster.parent.glob("h*/runs/*")), "a refused run left its directory on a host"
    assert not processes_under(cluster.parent)
