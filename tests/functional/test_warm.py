"""Warm processes (`remote.host.warm`): jobs forked from one interpreter that imported torch once, through a
server per workdir. Outputs bit-identical to a cold run's; only this login served; the warm processes end
when idle, when the code they loaded is replaced and on `pictl stop`, which ends only this controller's jobs
in its own workdirs; killed under a run, the run fails cleanly and the next one works; a stopped (SIGSTOP)
warm process is reported, never waited for. (Ctrl-C and a killed controller during a warm run:
`test_faults.py`, which runs warm like the rest of the suite.)"""

from __future__ import annotations

import contextlib
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
from support.cli import ROOT, finished, run_pictl
from support.clusters import processes_under, skip_loudly, write_cluster

from remote.floor import protocol as P

pytestmark = pytest.mark.slow

RUN = ["run", "--stages", "2", "--split", "blocks.6", "--images", "8", "--warmup", "0", "--repeats", "1",
       "--model", "deit_tiny_patch16_224", "--headless", "--json"]
"""DeiT-Ti: how a job starts is the subject, not the model; each process builds a quarter of DeiT-S's weights, and a
serial baseline (measured again whenever other work loaded the machine) costs a quarter as much."""


@pytest.fixture
def warm_env(pictl_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A warm directory of this test's own: the warm processes it sees are the ones it started."""
    return {**pictl_env, "PICTL_WARM_DIR": str(tmp_path / "warm")}


def _warm(proc: psutil.Process, warm_dir: Path) -> bool:
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "remote.host.warmroot --socket" in cmd and str(warm_dir) in cmd


def _servers(warm_dir: Path) -> list[psutil.Process]:
    """The roots serving `warm_dir` (not the workdir servers and jobs forked from them, which carry the same
    command line): each imported torch."""
    found = []
    for proc in psutil.process_iter():
        try:
            if _warm(proc, warm_dir) and not _warm(proc.parent() or proc, warm_dir):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def _workdir_server(warm_dir: Path, pid: int) -> psutil.Process:
    """The workdir server with this pid (what `pictl warm --json` names per host), checked to be one."""
    proc = psutil.Process(pid)
    assert _warm(proc, warm_dir) and proc.parent() in _servers(warm_dir), proc
    return proc


def _until(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _stop_servers(warm_dir: Path) -> None:
    """Kill the roots, then the workdir servers that outlived them (as they do a root killed under them)."""
    for _ in range(3):
        roots = _servers(warm_dir)
        for proc in roots:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(roots, timeout=5)


def test_warm_and_cold_give_the_same_bits_and_the_record_says_how_each_started(tmp_path: Path, warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    try:
        cold = run_pictl([*RUN, "--hosts", str(hosts), "--cold", "--fresh-baseline"], warm_env)
        assert finished(cold.returncode, cold.stderr), cold.stderr[-2000:]
        assert not _servers(tmp_path / "warm")  # --cold starts none
        warm = run_pictl([*RUN, "--hosts", str(hosts), "--fresh-baseline"], warm_env)
        assert finished(warm.returncode, warm.stderr), warm.stderr[-2000:]
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
        assert len(_servers(tmp_path / "warm")) == 1  # both hosts' servers are forks of it: one login, one machine
        again = run_pictl([*RUN, "--hosts", str(hosts)], warm_env)
        assert json.loads(again.stdout)["startup"]["torch_imports"] == 0  # the hot path
    finally:
        _stop_servers(tmp_path / "warm")


def test_the_warm_process_ends_when_idle_when_its_code_is_replaced_and_on_stop(tmp_path: Path, warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    inventory = hosts.read_text()
    hosts.write_text(inventory.replace('interface = "lo"\n', 'interface = "lo"\nwarm_idle_s = 2\n'))
    warm_dir = tmp_path / "warm"
    try:
        first = run_pictl(["warm", "--hosts", str(hosts), "--json"], warm_env)
        assert first.returncode == 0, first.stderr
        states = json.loads(first.stdout)["hosts"]
        # a server per workdir, both forked from one root (one torch import); the root outlives its last server
        # by its own idle time, so it is still there to be named
        assert states["h0"]["running"] and states["h0"]["pid"] != states["h1"]["pid"]
        assert states["h0"]["root_pid"] == states["h1"]["root_pid"] == _servers(warm_dir)[0].pid
        assert "torch" in states["h0"]["preloaded"] and states["h0"]["rss_mb"] > 50
        _until(lambda: not _servers(warm_dir), 30, "the warm process outlived its idle timeout")
        assert "idle for 2 s: ending" in next(warm_dir.glob("*.log")).read_text()

        # From here on the default idle time (600 s): nothing below ends for being idle.
        hosts.write_text(inventory)
        warmed = json.loads(run_pictl(["warm", "--hosts", str(hosts), "--json"], warm_env).stdout)["hosts"]
        assert len(_servers(warm_dir)) == 1
        check = run_pictl(["check", "--hosts", str(hosts), "--json"], warm_env)
        assert json.loads(check.stdout)["hosts"][0]["warm"]["pid"] == warmed["h0"]["pid"]
        stop = run_pictl(["stop", "--hosts", str(hosts)], warm_env)
        assert stop.returncode == 0 and "ended its warm process" in stop.stdout, stop.stdout
        _until(lambda: not _servers(warm_dir), 15, "pictl stop left the warm process")

        warmed = json.loads(run_pictl(["warm", "--hosts", str(hosts), "--json"], warm_env).stdout)["hosts"]
        assert len(_servers(warm_dir)) == 1
        servers = [_workdir_server(warm_dir, warmed[h]["pid"]) for h in ("h0", "h1")]
        for host in ("h0", "h1"):  # what a push writes (both: the root loaded one of the two)
            manifest = tmp_path / "cluster" / host / "code" / ".pictl-manifest.json"
            manifest.write_text(manifest.read_text().replace("}", ', "remote/new.py": "0"}', 1))
        _until(lambda: not any(s.is_running() for s in servers), 15, "a warm server kept serving replaced code")
        _until(lambda: not _servers(warm_dir), 30, "the root outlived the code it loaded")
    finally:
        _stop_servers(warm_dir)


def test_a_warm_process_killed_under_a_run_fails_it_cleanly_and_the_next_run_works(tmp_path: Path,
                                                                                  warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    warm_dir = tmp_path / "warm"
    try:
        # Cut before the last block (the last --split given is taken), the pipeline takes about as long as the
        # serial run, not half as long: it is still running when its server is killed, after a serial baseline of
        # half the images.
        proc = subprocess.Popen([sys.executable, "-m", "pictl", *RUN[:-1], "--images", "24", "--repeats", "3",
                                 "--split", "blocks.11", "--hosts", str(hosts)], env=warm_env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        runs = Path(warm_env["PICTL_RUNS_DIR"])
        _until(lambda: any('"event":"progress"' in p.read_text() for p in runs.glob("*/events/h1.jsonl")), 240,
               "the pipeline never reported progress")
        # the server of h0's jobs (the parent of what runs in h0's workdir): they die with it
        roots = _servers(warm_dir)
        (server,) = {p.parent() for p in processes_under(tmp_path / "cluster" / "h0")
                     if _warm(p.parent(), warm_dir) and p.parent().parent() in roots}
        server.kill()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, err[-2000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("pictl: error:") and ("host 'h0'" in last or "host 'h1'" in last), last
        _until(lambda: not processes_under(tmp_path / "cluster"), 15,
               f"left behind: {[' '.join(p.cmdline())[:100] for p in processes_under(tmp_path / 'cluster')]}")
        again = run_pictl([*RUN, "--hosts", str(hosts)], warm_env)
        assert finished(again.returncode, again.stderr), again.stderr[-2000:]
        # h0's fresh server is forked from the root, which lived on: no torch import
        assert json.loads(again.stdout)["startup"]["warm_processes_started"] == 0
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
        sockets = sorted(warm_dir.glob("*.sock"))  # the root's and this workdir's server's
        assert len(sockets) == 2 and warm_dir.stat().st_mode & 0o777 == 0o700
        for sock in sockets:
            assert sock.stat().st_mode & 0o777 == 0o600
            blocked = subprocess.run([*as_nobody, str(sock)], env=env, capture_output=True, text=True, timeout=60)
            assert blocked.stdout.strip() == "cannot connect: Permission denied", blocked

        warm_dir.chmod(0o777)  # a careless chmod: the servers' own check still holds
        for sock in sockets:
            sock.chmod(0o777)
            refused = subprocess.run([*as_nobody, str(sock)], env=env, capture_output=True, text=True, timeout=60)
            assert refused.stdout.strip() in ("answered: None", "closed: Broken pipe",
                                              "closed: Connection reset by peer"), refused
            mine = subprocess.run([sys.executable, "-c", RAW_CLIENT, str(sock)], env=env, capture_output=True,
                                  text=True, timeout=60)
            assert "'pid'" in mine.stdout  # this login is answered
        assert next(warm_dir.glob("*.log")).read_text().count("refused a client of uid 65534") == 2
    finally:
        _stop_servers(warm_dir)
        shutil.rmtree(warm_dir, ignore_errors=True)


def _held_rank(runs: Path, proc: subprocess.Popen, before: set[str]) -> psutil.Process:
    """Rank 1 of the run `proc` started (a run in `runs` not in `before`) once it has started, stopped with SIGSTOP:
    the run is alive, its jobs on both hosts, until the test resumes it, however fast this machine is."""
    found: list[int] = []

    def started() -> bool:
        assert proc.poll() is None, proc.communicate()
        for events in runs.glob("*/events/h1.jsonl"):
            if events.parent.parent.name not in before:
                found.extend(json.loads(line)["pid"] for line in events.read_text().splitlines()
                             if '"event":"run_start"' in line and line.endswith("}"))
        return bool(found)

    _until(started, 240, "the pipeline's rank 1 never started")
    rank = psutil.Process(found[0])
    rank.suspend()
    return rank


def _resume(rank: psutil.Process) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        rank.resume()


def test_one_teams_stop_never_ends_another_teams_run(tmp_path: Path, warm_env) -> None:
    """Two teams on one login: `pictl stop` from other workdirs, and from another controller in the same
    workdirs, leave a run finishing with exit 0; only --all ends another controller's jobs, and it names them."""
    ours, theirs = write_cluster(tmp_path / "ours", 2), write_cluster(tmp_path / "theirs", 2)
    warm_dir, runs = tmp_path / "warm", Path(warm_env["PICTL_RUNS_DIR"])
    team_a, team_b = {**warm_env, "PICTL_CONTROLLER": "teamA"}, {**warm_env, "PICTL_CONTROLLER": "teamB"}
    # A short run: its rank 1 is held stopped while the `pictl stop`s are made beside it (`_held_rank`), so it
    # outlasts them on any machine however short it is; resumed, it must still finish.
    args = [*RUN[:-1], "--images", "16", "--repeats", "2", "--hosts", str(ours)]
    try:
        assert run_pictl(["warm", "--hosts", str(theirs)], team_b).returncode == 0
        proc = subprocess.Popen([sys.executable, "-m", "pictl", *args, "--json"], env=team_a, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rank = _held_rank(runs, proc, set())
        try:
            other_workdirs = run_pictl(["stop", "--hosts", str(theirs)], team_a)  # same controller, other workdirs
            assert other_workdirs.returncode == 0, other_workdirs.stderr
            assert other_workdirs.stdout.count("ended its warm process") == 2, other_workdirs.stdout
            assert "root" not in other_workdirs.stdout  # the root still serves teamA's workdirs
            same_workdirs = run_pictl(["stop", "--hosts", str(ours)], team_b)  # another controller, same workdirs
            assert same_workdirs.returncode == 0, same_workdirs.stderr
            for host in ("h0", "h1"):
                line = next(x for x in same_workdirs.stdout.splitlines() if x.startswith(f"{host}:"))
                assert "kept its warm process" in line and "of teamA (--all ends them)" in line, line
        finally:
            _resume(rank)
        out, err = proc.communicate(timeout=300)
        assert finished(proc.returncode, err), err[-2000:]
        assert json.loads(out)["outputs_match"] is True

        first = {d.name for d in runs.iterdir()}
        proc = subprocess.Popen([sys.executable, "-m", "pictl", *args], env=team_a, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rank = _held_rank(runs, proc, first)
        try:
            every = run_pictl(["stop", "--all", "--hosts", str(ours)], team_b)
        finally:
            _resume(rank)  # (a signal `stop --all` sent it is delivered now; left stopped, it would wait)
        assert every.returncode == 0, every.stderr
        assert "warm job(s), of teamA" in every.stdout and "ended its warm process" in every.stdout, every.stdout
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, "a run survived `pictl stop --all`"
        _until(lambda: not processes_under(tmp_path / "ours"), 15, "pictl stop --all left processes")
    finally:
        _stop_servers(warm_dir)


def test_a_stopped_warm_process_is_reported_and_never_waited_for(tmp_path: Path, warm_env) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    warm_dir = tmp_path / "warm"
    env = {**warm_env, "PICTL_WARM_REPLY_TIMEOUT": "5"}
    warmed = json.loads(run_pictl(["warm", "--hosts", str(hosts), "--json"], env).stdout)["hosts"]
    server = _workdir_server(warm_dir, warmed["h0"]["pid"])
    server.suspend()
    try:
        check = run_pictl(["check", "--hosts", str(hosts)], env)
        assert check.returncode == 6, check.stderr
        assert check.stderr.strip() == (f"pictl: host 'h0' is not ready: its warm process does not answer: the warm "
                                        f"process (pid {server.pid}) is stopped (SIGSTOP or a debugger): `kill -CONT "
                                        f"{server.pid}` resumes it"), check.stderr
        started = time.monotonic()
        run = run_pictl([*RUN, "--hosts", str(hosts)], env)
        assert finished(run.returncode, run.stderr), run.stderr[-2000:]
        notes = [line for line in run.stderr.splitlines() if "pictl-warm:" in line]
        assert len(notes) == 1 and f"pid {server.pid}) is stopped" in notes[0] and "cold" in notes[0], notes
        summary = json.loads(run.stdout)
        assert summary["outputs_match"] is True and False in summary["startup"]["served_warm"].values()
        assert time.monotonic() - started < 240
        stop = run_pictl(["stop", "--hosts", str(hosts)], env)
        assert stop.returncode == 6, stop.stdout
        assert f"h0: stopped 0 process group(s); its warm process does not answer: the warm process (pid " \
               f"{server.pid}) is stopped (SIGSTOP or a debugger): `kill -CONT {server.pid}` resumes it; left as it " \
               "is" in stop.stdout, stop.stdout
        assert "h1: stopped 0 process group(s); ended its warm process" in stop.stdout, stop.stdout
    finally:
        server.resume()
        _stop_servers(warm_dir)


SILENT_SERVER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
os.chdir(os.path.dirname(sys.argv[1]))  # (a socket address holds 108 bytes)
s.bind(os.path.basename(sys.argv[1]))
s.listen(8)
print("listening", flush=True)
conns = []
while True:
    conns.append(s.accept()[0])  # takes every request, answers none
"""


def _client(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "remote.host.warmclient", *args], env=env, cwd="/",
                          capture_output=True, text=True, timeout=timeout)


def test_warm_files_never_follow_links_and_a_silent_server_times_out(tmp_path: Path) -> None:
    """The warm directory's own files through the real client (no torch imported unless a job runs cold): a
    shared directory keeps its mode; links where a lock or a log goes, or a directory where a socket goes, are
    refused with the job run cold; a warm process that takes a request and never answers is given up on."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PICTL_WARM_DIR": str(shared), "PICTL_WARM_REPLY_TIMEOUT": "2"}
    paths = subprocess.run([sys.executable, "-c", "from remote.host import warm as W; p = W.socket_path(); "
                            "print(W.warm_dir()); print(p); print(W.workdir_socket_path(p))"],
                           env=env, capture_output=True, text=True, check=True).stdout.split()
    private, root, workdir = (Path(p) for p in paths)
    assert private == shared / f"pictl-warm-{os.getuid()}" and private.stat().st_mode & 0o777 == 0o700
    assert shared.stat().st_mode & 0o7777 == 0o1777  # never chmod-ed: not a directory pictl made

    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    for link in (f"{root}.lock", f"{root}.log"):
        os.symlink(outside, link)
        status = json.loads(_client(["--ensure"], env).stdout)
        assert status["running"] is False and "cannot open" in status["error"] and link in status["error"], status
        os.unlink(link)
    lock = f"{root.name}.lock"  # (the start-up lock stays, as it does after every start)
    assert outside.read_text() == "precious\n" and {p.name for p in private.iterdir()} <= {lock}, "left behind"

    workdir.mkdir()  # a directory where this workdir's socket goes
    status = json.loads(_client(["--ensure"], env).stdout)
    assert status["running"] is False and status["error"] == f"{workdir} is not a socket", status
    job = _client(["torch.distributed.run", "--help"], env)
    assert job.returncode == 0 and "usage:" in job.stdout, job.stderr[-1000:]
    assert f"pictl-warm: no warm process ({workdir} is not a socket); running the job cold" in job.stderr
    assert {p.name for p in private.iterdir()} - {lock} == {workdir.name}  # no server, no temporary socket
    workdir.rmdir()

    silent = subprocess.Popen([sys.executable, "-c", SILENT_SERVER, str(workdir)], stdout=subprocess.PIPE, text=True)
    try:
        assert silent.stdout is not None and silent.stdout.readline().strip() == "listening"
        started = time.monotonic()
        status = json.loads(_client(["--status"], env).stdout)
        assert status["running"] is True and status["answering"] is False, status
        assert status["error"] == f"the warm process (pid {silent.pid}) did not answer within 2 s", status
        job = _client(["torch.distributed.run", "--help"], env)
        assert job.returncode == 0 and "usage:" in job.stdout, job.stderr[-1000:]
        assert f"pictl-warm: the warm process (pid {silent.pid}) did not answer within 2 s; running the job " \
               "cold" in job.stderr, job.stderr
        assert time.monotonic() - started < 60
    finally:
        silent.kill()
        silent.wait()
