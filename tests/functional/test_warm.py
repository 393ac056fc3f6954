"""Warm processes (`remote.host.warm`): jobs forked from one interpreter that imported torch once. Outputs
bit-identical to a cold run's; only this login served; the warm process ends when idle, when the code it
loaded is replaced and on `pictl stop`; killed under a run, the run fails cleanly and the next one works.
(Ctrl-C and a killed controller during a warm run: `test_faults.py`, which runs warm like the rest of the
suite.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from support.cli import ROOT, run_pictl
from support.clusters import processes_under, skip_loudly, write_cluster

from remote import protocol as P

pytestmark = pytest.mark.slow

RUN = ["run", "--stages", "2", "--split", "blocks.6", "--images", "8", "--warmup", "0", "--repeats", "1",
       "--headless", "--json"]


@pytest.fixture
def warm_env(pictl_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A warm directory of this test's own: the warm processes it sees are the ones it started."""
    return {**pictl_env, "PICTL_WARM_DIR": str(tmp_path / "warm")}


def _servers(warm_dir: Path) -> list[psutil.Process]:
    """The warm processes serving `warm_dir` (not the jobs they forked, which carry the same command line)."""
    def warm(proc: psutil.Process) -> bool:
        try:
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        return "remote.host.warmserve --socket" in cmd and str(warm_dir) in cmd

    found = []
    for proc in psutil.process_iter():
        try:
            if warm(proc) and not warm(proc.parent() or proc):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def _until(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _stop_servers(warm_dir: Path) -> None:
    for proc in _servers(warm_dir):
        proc.kill()


def test_warm_and_cold_give_the_same_bits_and_the_record_says_how_each_started(tmp_path: Path, warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    try:
        cold = run_pictl([*RUN, "--hosts", str(hosts), "--cold", "--fresh-baseline"], warm_env)
        assert cold.returncode == 0, cold.stderr[-2000:]
        assert not _servers(tmp_path / "warm")  # --cold starts none
        warm = run_pictl([*RUN, "--hosts", str(hosts), "--fresh-baseline"], warm_env)
        assert warm.returncode == 0, warm.stderr[-2000:]
        a, b = json.loads(cold.stdout), json.loads(warm.stdout)
        for run in (a, b):
            assert run["outputs_match"] is True and run["max_abs_diff"] == 0.0
        for name in (P.LOGITS_FILE_PIPELINE, P.LOGITS_FILE_SERIAL):
            assert (Path(a["run_dir"]) / name).read_bytes() == (Path(b["run_dir"]) / name).read_bytes(), name
        # cold: the serial run (it plans too), and two torchrun agents with a rank each, all imported torch
        assert set(a["startup"]["served_warm"].values()) == {False}
        assert a["startup"]["torch_imports"] == a["startup"]["cold_processes"] == 5
        # warm: the one warm process this run started is the only interpreter that imported torch
        assert set(b["startup"]["served_warm"].values()) == {True}
        assert b["startup"]["cold_processes"] == 0 and b["startup"]["torch_imports"] == 1
        assert len(_servers(tmp_path / "warm")) == 1  # both hosts share it: one login, one machine
        again = run_pictl([*RUN, "--hosts", str(hosts)], warm_env)
        assert json.loads(again.stdout)["startup"]["torch_imports"] == 0  # the hot path
    finally:
        _stop_servers(tmp_path / "warm")


def test_the_warm_process_ends_when_idle_when_its_code_is_replaced_and_on_stop(tmp_path: Path, warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    hosts.write_text(hosts.read_text().replace('interface = "lo"\n', 'interface = "lo"\nwarm_idle_s = 4\n'))
    warm_dir = tmp_path / "warm"
    try:
        first = run_pictl(["warm", "--hosts", str(hosts), "--json"], warm_env)
        assert first.returncode == 0, first.stderr
        states = json.loads(first.stdout)["hosts"]
        assert states["h0"]["running"] and states["h0"]["pid"] == states["h1"]["pid"]
        assert "torch" in states["h0"]["preloaded"] and states["h0"]["rss_mb"] > 50
        check = run_pictl(["check", "--hosts", str(hosts), "--json"], warm_env)
        assert json.loads(check.stdout)["hosts"][0]["warm"]["pid"] == states["h0"]["pid"]
        _until(lambda: not _servers(warm_dir), 30, "the warm process outlived its idle timeout")
        assert "idle for 4 s: ending" in next(warm_dir.glob("*.log")).read_text()

        run_pictl(["warm", "--hosts", str(hosts)], warm_env)
        assert len(_servers(warm_dir)) == 1
        manifest = tmp_path / "cluster" / "h0" / "code" / ".pictl-manifest.json"
        manifest.write_text(manifest.read_text().replace("}", ', "remote/new.py": "0"}', 1))  # what a push writes
        _until(lambda: not _servers(warm_dir), 30, "the warm process kept serving replaced code")

        run_pictl(["push", "--hosts", str(hosts)], warm_env)  # the code back as it was
        run_pictl(["warm", "--hosts", str(hosts)], warm_env)
        assert len(_servers(warm_dir)) == 1
        stop = run_pictl(["stop", "--hosts", str(hosts)], warm_env)
        assert stop.returncode == 0 and "ended its warm process" in stop.stdout, stop.stdout
        _until(lambda: not _servers(warm_dir), 15, "pictl stop left the warm process")
    finally:
        _stop_servers(warm_dir)


def test_a_warm_process_killed_under_a_run_fails_it_cleanly_and_the_next_run_works(tmp_path: Path,
                                                                                  warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    warm_dir = tmp_path / "warm"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "pictl", *RUN[:-1], "--images", "24", "--repeats", "6",
                                 "--hosts", str(hosts)], env=warm_env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        runs = Path(warm_env["PICTL_RUNS_DIR"])
        _until(lambda: any('"event":"progress"' in p.read_text() for p in runs.glob("*/events/h1.jsonl")), 240,
               "the pipeline never reported progress")
        (server,) = _servers(warm_dir)
        server.kill()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, err[-2000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("pictl: error:") and ("host 'h0'" in last or "host 'h1'" in last), last
        _until(lambda: not processes_under(tmp_path / "cluster"), 15,
               f"left behind: {[' '.join(p.cmdline())[:100] for p in processes_under(tmp_path / 'cluster')]}")
        again = run_pictl([*RUN, "--hosts", str(hosts)], warm_env)
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["startup"]["warm_processes_started"] == 1  # a fresh one
    finally:
        _stop_servers(warm_dir)


RAW_CLIENT = """
import socket, sys
from remote.host import warm as W
s = socket.socket(socket.AF_UNIX)
try:
    W.connect_path(s, sys.argv[1])
except OSError as exc:
    print("cannot connect:", exc.strerror)
    sys.exit(0)
try:
    W.send_message(s, {"op": "status"})
    print("answered:", W.read_message(s))
except OSError as exc:
    print("closed:", exc.strerror)
"""


def test_another_login_is_never_served(tmp_path: Path) -> None:
    """The socket's directory is this login's alone (0700); opened up by mistake, the warm process still checks
    each client's credentials and answers nothing to another user's."""
    if os.geteuid() != 0:
        skip_loudly("NEEDS ROOT: the test connects as another user (nobody)")
    warm_dir = Path(tempfile.mkdtemp(prefix="pictl-warm-test-"))  # in /tmp: nobody can reach the path
    env = {**os.environ, "PICTL_WARM_DIR": str(warm_dir), "PYTHONPATH": str(ROOT)}
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", sys.executable, "-c",
                 RAW_CLIENT]
    try:
        started = subprocess.run([sys.executable, "-m", "remote.host.warmclient", "--ensure"], env=env,
                                 capture_output=True, text=True, timeout=300)
        assert json.loads(started.stdout)["running"], started.stderr
        (sock,) = warm_dir.glob("*.sock")
        assert warm_dir.stat().st_mode & 0o777 == 0o700 and sock.stat().st_mode & 0o777 == 0o600
        blocked = subprocess.run([*as_nobody, str(sock)], env=env, capture_output=True, text=True, timeout=60)
        assert blocked.stdout.strip() == "cannot connect: Permission denied", blocked

        warm_dir.chmod(0o777)  # a careless chmod: the server's own check still holds
        sock.chmod(0o777)
        refused = subprocess.run([*as_nobody, str(sock)], env=env, capture_output=True, text=True, timeout=60)
        assert refused.stdout.strip() in ("answered: None", "closed: Broken pipe",
                                          "closed: Connection reset by peer"), refused
        assert "refused a client of uid 65534" in next(warm_dir.glob("*.log")).read_text()
        mine = subprocess.run([sys.executable, "-c", RAW_CLIENT, str(sock)], env=env, capture_output=True,
                              text=True, timeout=60)
        assert "'pid'" in mine.stdout  # this login is answered
    finally:
        _stop_servers(warm_dir)
        shutil.rmtree(warm_dir, ignore_errors=True)
