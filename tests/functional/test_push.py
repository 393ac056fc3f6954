"""The manifest sync: only changes travel, renames are atomic, only pictl's own files are removed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.cli import run_pictl

from pictl.cluster.push import MANIFEST, local_tree, push_to
from pictl.cluster.transport.local import LocalTransport
from pictl.inventory import Host


def _push(host: Host, files: dict[str, bytes]):
    return asyncio.run(push_to(LocalTransport(host), files))


def test_manifest_sync(tmp_path: Path) -> None:
    host = Host(name="h", transport="local", workdir=str(tmp_path))
    code = tmp_path / "code"
    first = _push(host, {"remote/a.py": b"a", "remote/b.py": b"b", "profiles/q.toml": b"q"})
    assert (first.sent, first.removed, first.unchanged) == (3, 0, 0)
    (code / "users-own-file.txt").write_text("not pictl's")
    again = _push(host, {"remote/a.py": b"a", "remote/b.py": b"b", "profiles/q.toml": b"q"})
    assert (again.sent, again.bytes_sent, again.removed, again.unchanged) == (0, 0, 0, 3)
    changed = _push(host, {"remote/a.py": b"A2", "profiles/q.toml": b"q"})
    assert (changed.sent, changed.bytes_sent, changed.removed) == (1, 2, 1)
    assert (code / "remote/a.py").read_bytes() == b"A2" and not (code / "remote/b.py").exists()
    assert (code / "users-own-file.txt").read_text() == "not pictl's"  # never placed by pictl: untouched
    assert not list(code.rglob("*.pictl-tmp"))
    assert (code / MANIFEST).is_file()


def test_the_shipped_tree_is_the_remote_package() -> None:
    names = set(local_tree())
    assert {"remote/runtime/pipeline.py", "remote/host/supervise.py"} <= names
    assert all(n.startswith("remote/") and n.endswith(".py") for n in names)  # the presets stay here


@pytest.mark.slow
def test_push_to_ssh_hosts_then_unchanged_repush(ssh_cluster, pictl_env) -> None:
    for home in (ssh_cluster.workdir(i) / "code" for i in range(ssh_cluster.n)):
        if home.exists():
            (home / MANIFEST).unlink(missing_ok=True)  # as if never pushed
    first = run_pictl(["push", "--hosts", str(ssh_cluster.inventory)], pictl_env)
    assert first.returncode == 0, first.stderr
    assert all(f"h{i}: sent {len(local_tree())} file(s)" in first.stdout for i in range(4)), first.stdout
    start = time.monotonic()
    again = run_pictl(["push", "--hosts", str(ssh_cluster.inventory)], pictl_env)
    assert again.returncode == 0 and again.stdout.count("up to date") == 4, again.stdout
    assert time.monotonic() - start < 10
    placed = ssh_cluster.workdir(3) / "code" / "remote" / "runtime" / "pipeline.py"
    assert placed.read_bytes() == local_tree()["remote/runtime/pipeline.py"]


def test_a_crafted_manifest_never_removes_a_file_outside_the_code_dir(tmp_path: Path) -> None:
    """The manifest is the host's file: names that climb out (`..`), absolute ones and odd ones are never
    taken as paths, through the real CLI on the local cluster (where the host's files are the controller's)."""
    import json
    import os
    import subprocess
    import sys

    from support.cli import ROOT
    from support.clusters import write_cluster

    inv = write_cluster(tmp_path / "cluster", 1)
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp_path / "runs"), "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-m", "pictl", "push", "--hosts", str(inv)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    code = tmp_path / "cluster" / "h0" / "code"
    manifest = json.loads((code / MANIFEST).read_text())
    hostile = {os.path.relpath(victim, code): "0" * 64, str(victim): "0" * 64, "remote/../../../victim.txt": "0",
               "": "0", "a\nb": "0", "remote/\0x": "0"}
    (code / MANIFEST).write_text(json.dumps({**manifest, **hostile}))
    again = subprocess.run([sys.executable, "-m", "pictl", "push", "--hosts", str(inv)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert victim.read_text() == "the user's own file"
    assert "removed" not in again.stdout, again.stdout
    assert json.loads((code / MANIFEST).read_text()) == manifest  # rewritten with pictl's own names only


def test_a_workdir_under_home_runs_the_pushed_code_not_the_controllers(tmp_path: Path, monkeypatch) -> None:
    """The shipped inventory's workdirs are `~/...`: a job's PYTHONPATH (its host's code directory) must mean the
    home directory there, as it does over SSH, or Python skips it and imports `remote` from the controller's
    install (and a warm root keyed on that install's missing manifest never saw the code change)."""
    import sys

    from pictl.cluster.commands import worker_env

    monkeypatch.setenv("HOME", str(tmp_path))
    host = Host(name="h", transport="local", workdir="~/pictl/h")
    _push(host, {"remote/__init__.py": b"WHERE = 'pushed'\n"})
    result = asyncio.run(LocalTransport(host).run(
        [sys.executable, "-c", "import remote; print(remote.WHERE, remote.__file__)"], cwd="~/pictl",
        env=worker_env(host, 1)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["pushed", str(tmp_path / "pictl/h/code/remote/__init__.py")]
