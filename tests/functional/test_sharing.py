"""Shared Pis (the SSH test cluster): two runs at once, `pictl stop` that stops only our runs, and a second
user's process groups that one user's sweep never touches."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.cli import ROOT, finished, run_pictl
from support.clusters import require_netns

from pictl.inventory import load_cluster

pytestmark = pytest.mark.slow
TINY = ["--stages", "2", "--images", "6", "--warmup", "0", "--repeats", "2", "--policy", "equal", "--headless",
        "--json"]
SLEEPER = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"


def _lease(cluster, i: int) -> dict:
    text = (cluster.workdir(i) / "lease").read_text() if (cluster.workdir(i) / "lease").exists() else ""
    return json.loads(text) if text else {}


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_two_runs_at_once_the_second_is_refused_then_queued(ssh_cluster, shared_cache_env) -> None:
    inv = str(ssh_cluster.inventory)
    first = subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", inv, *TINY], env=shared_cache_env,
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = [first]
    try:
        _two_runs(ssh_cluster, shared_cache_env, first, started)
    finally:  # a failed assertion must not leave a run holding the cluster for the tests after this one
        for proc in started:
            if proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=120)


def _two_runs(ssh_cluster, shared_cache_env, first: subprocess.Popen, started: list[subprocess.Popen]) -> None:
    inv = str(ssh_cluster.inventory)
    _wait_for(lambda: _lease(ssh_cluster, 0) and _lease(ssh_cluster, 1), "the first run's leases")
    holder = _lease(ssh_cluster, 0)
    assert holder["run_id"] and holder["login"] == ssh_cluster.user(0) and holder["pid"] > 0
    refused = run_pictl(["run", "--hosts", inv, *TINY], shared_cache_env)
    assert refused.returncode == 8, refused.stderr[-2000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("pictl: error: hosts 'h0', 'h1' busy: held by run " + holder["run_id"]), last
    assert "(--wait queues behind it)" in last and refused.stdout == ""
    queued = subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", inv, *TINY, "--wait"],
                              env=shared_cache_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    started.append(queued)
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = queued.communicate(timeout=300)
    assert finished(first.returncode, err1), err1[-3000:]
    assert finished(queued.returncode, err2), err2[-3000:]
    assert f"waiting: hosts 'h0', 'h1' busy: held by run {holder['run_id']}" in " ".join(err2.split())
    a, b = json.loads(out1), json.loads(out2)
    assert a["run_id"] == holder["run_id"] and a["outputs_match"] and b["outputs_match"]
    # Queued, not overlapped: the second run's record opened after the first one closed.
    assert (Path(b["run_dir"]) / "config.json").stat().st_mtime >= (Path(a["run_dir"]) / "summary.json").stat().st_mtime
    for i in range(2):
        assert _lease(ssh_cluster, i) == {}, "a lease outlived its run"
        assert not list((ssh_cluster.workdir(i) / "runs").glob("*")), "a host run directory was left"
    deadline = time.monotonic() + 15
    while any(ssh_cluster.processes(i) for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not any(ssh_cluster.processes(i) for i in range(2))


def _as_user(user: str | None) -> dict:
    """Popen arguments that run a process as `user` (the tests run as root on the namespaced cluster)."""
    return {"user": user, "group": user, "extra_groups": []} if user and os.geteuid() == 0 else {}


def _supervised_sleeper(run_dir: Path, code_dir: Path, user: str | None) -> subprocess.Popen:
    """What a live run leaves: `remote.host.supervise` (its controller attached: our pipe) over a group."""
    python = "/usr/bin/python3" if user else sys.executable  # (the controller's venv is root's alone)
    return subprocess.Popen([python, "-m", "remote.host.supervise", "--pgid-file", "pgid-test", "--",
                             python, "-c", SLEEPER], cwd=run_dir, stdin=subprocess.PIPE,
                            env={"PYTHONPATH": str(code_dir), "PATH": os.environ["PATH"]}, **_as_user(user))


def _group_of(run_dir: Path) -> int:
    _wait_for(lambda: (run_dir / "pgid-test").is_file(), f"{run_dir}/pgid-test", 30)
    return int((run_dir / "pgid-test").read_text())


def _alive(pgid: int) -> bool:
    try:
        return psutil.Process(pgid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _owned_run_dir(workdir: Path, name: str, owner: str, user: str | None, mode: int = 0o755) -> Path:
    run_dir = workdir / "runs" / name
    run_dir.mkdir(parents=True)
    (run_dir / "owner").write_text(owner)
    if user and os.geteuid() == 0:
        shutil.chown(run_dir, user, user)
        shutil.chown(run_dir / "owner", user, user)
    run_dir.chmod(mode)
    return run_dir


def test_pictl_stop_stops_only_this_controllers_runs(ssh_cluster, pictl_env) -> None:
    assert run_pictl(["push", "--hosts", str(ssh_cluster.inventory)], pictl_env).returncode == 0
    login = ssh_cluster.user(1) if ssh_cluster.netns else None
    workdir, code = ssh_cluster.workdir(1), ssh_cluster.workdir(1) / "code"
    ours = _owned_run_dir(workdir, "alice-run", "alice@laptop", login)
    theirs = _owned_run_dir(workdir, "bob-run", "bob@pc", login)
    sleepers = [_supervised_sleeper(d, code, login) for d in (ours, theirs)]
    try:
        groups = [_group_of(ours), _group_of(theirs)]
        proc = run_pictl(["stop", "--hosts", str(ssh_cluster.inventory)], {**pictl_env,
                                                                           "PICTL_CONTROLLER": "alice@laptop"})
        assert proc.returncode == 0, proc.stderr
        assert "h1: stopped 1 process group(s), kept 1 of other controllers' runs (bob@pc's; --all stops them)" \
            in proc.stdout, proc.stdout
        _wait_for(lambda: not _alive(groups[0]), "alice's group to stop", 20)
        assert _alive(groups[1]), "bob's run was stopped by alice's `pictl stop`"
        proc = run_pictl(["stop", "--all", "--hosts", str(ssh_cluster.inventory)],
                         {**pictl_env, "PICTL_CONTROLLER": "alice@laptop"})
        assert proc.returncode == 0 and "h1: stopped 1 process group(s) (bob@pc's)" in proc.stdout, proc.stdout
        _wait_for(lambda: not _alive(groups[1]), "bob's group to stop with --all", 20)
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
        for d in (ours, theirs):
            shutil.rmtree(d, ignore_errors=True)


def test_a_second_users_process_groups_are_never_touched(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    """Two logins share one workdir on h1. Another user's live groups cannot be inspected (EACCES on
    /proc/<pid>/cwd): they are not ours, whether their run directory is writable to us or not, and the
    sweep goes on to stop our own orphan."""
    require_netns(ssh_cluster, "second login")
    from support.sshcluster import TAG, to_toml

    other = f"pictl-{TAG}x"
    me = ssh_cluster.user(1)
    shared = Path(f"/tmp/pictl-shared-{TAG}")
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", other], capture_output=True)
    procs: list[subprocess.Popen] = []
    try:
        shutil.rmtree(shared, ignore_errors=True)
        (shared / "runs").mkdir(parents=True)
        for d in (shared, shared / "runs"):
            d.chmod(0o777)
        shutil.copytree(ROOT / "remote", shared / "code" / "remote")
        open_dir = _owned_run_dir(shared, "their-open-run", "them", other, 0o777)  # we could delete their record
        closed_dir = _owned_run_dir(shared, "their-closed-run", "them", other, 0o755)  # we cannot
        orphan_dir = _owned_run_dir(shared, "our-orphan", "us", me, 0o755)
        procs += [_supervised_sleeper(open_dir, shared / "code", other),
                  _supervised_sleeper(closed_dir, shared / "code", other),
                  _supervised_sleeper(orphan_dir, shared / "code", me)]
        theirs = [_group_of(open_dir), _group_of(closed_dir)]
        mine = _group_of(orphan_dir)
        procs[2].kill()  # our supervisor dies (as under an OOM kill): its sleeper is a true orphan
        procs[2].wait()
        inv = tmp_path / "hosts.toml"  # h1 alone, in the shared workdir
        inv.write_text(to_toml({"defaults": ssh_cluster.layout["defaults"],
                                "host": [{**ssh_cluster.layout["host"][1], "workdir": str(shared)}]}))
        host = load_cluster(inv).hosts[0]

        from pictl.cluster.commands import cleanup_host
        from pictl.cluster.transport import transport_for

        async def orphan_sweep() -> dict:  # what every run does first, as our login over SSH
            t = transport_for(host)
            await t.connect()
            try:
                return await cleanup_host(t, orphans_only=True, keep="none")
            finally:
                await t.close()

        swept = asyncio.run(orphan_sweep())
        assert [s["pgid"] for s in swept["stopped"]] == [mine], swept
        assert sorted(k["pgid"] for k in swept["kept"] if k.get("reason") == "not ours") == sorted(theirs), swept
        assert swept["removed"] == [], swept  # (a crashed run's directory goes once it is an hour old)
        assert all(_alive(g) for g in theirs), "another user's group was stopped"
        assert (open_dir / "pgid-test").is_file() and (closed_dir / "pgid-test").is_file(), "their records went"
        stop = run_pictl(["stop", "--all", "--hosts", str(inv)], pictl_env)
        assert stop.returncode == 0, stop.stderr
        assert "h1: stopped 0 process group(s), 2 not ours" in stop.stdout, stop.stdout
        assert all(_alive(g) for g in theirs) and (open_dir / "pgid-test").is_file()
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.kill()
            p.wait()
        for g in psutil.process_iter(["username"]):
            if g.info["username"] == other:
                g.kill()
        shutil.rmtree(shared, ignore_errors=True)
        subprocess.run(["userdel", other], capture_output=True)
