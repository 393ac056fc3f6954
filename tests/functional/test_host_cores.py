"""A host's cores as pictl sees them: local hosts pinned to cores of their own (`cpus` in hosts.toml), and a host
under a CFS quota, whose throttling is not other work."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from support.cli import ROOT, run_pictl
from support.clusters import skip_loudly

from pictl import errors as E
from pictl.run.baselines import Baseline, suspect_when_measured
from pictl.run.flags import compute_flags
from pictl.summary_models import RunSummary


def _pinned_cluster(path: Path, cores: list[str]) -> Path:
    """Local hosts h0, h1, ... pinned to `cores` (one cpuset list each), their workdirs under `path`."""
    body = ['[cluster]\nname = "pinned"\n[defaults]\ntransport = "local"\ninterface = "lo"\n']
    body += [f'[[host]]\nname = "h{i}"\nworkdir = "{path}/h{i}"\ncpus = "{c}"\n' for i, c in enumerate(cores)]
    path.mkdir(parents=True, exist_ok=True)
    (path / "hosts.toml").write_text("\n".join(body))
    return path / "hosts.toml"


def _two_cores() -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        skip_loudly("NEEDS CORES 0 AND 1: two hosts are pinned to one each")


@pytest.mark.parametrize(("cpus", "says"), [
    ("7-9", "host[1].cpus: host 'h1': cores 7-9 are not on this machine (pictl may use cores "),
    ("1-0", "host[1].cpus: '1-0' counts down (write \"0-1\")"),
    ("0;1", "host[1].cpus: '0;1' is not a list of cores such as \"0-3\", \"4,5\" or \"0-1,6\""),
])
def test_a_core_the_machine_lacks_is_refused_naming_host_and_field(cpus: str, says: str, tmp_path: Path,
                                                                    pictl_env) -> None:
    if cpus == "7-9" and os.sched_getaffinity(0) & {7, 8, 9}:
        skip_loudly("THIS MACHINE HAS CORES 7-9: the refusal needs cores it lacks")
    hosts = _pinned_cluster(tmp_path / "cluster", ["0", cpus])
    proc = run_pictl(["check", "--hosts", str(hosts)], pictl_env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pictl: error: {hosts}: {says}"), lines
    assert not (tmp_path / "cluster" / "h0").exists()  # refused before a host was touched


def test_an_ssh_host_cannot_be_pinned(tmp_path: Path, pictl_env) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text('[[host]]\nname = "pi1"\naddress = "10.0.0.1"\ncpus = "0"\n')
    proc = run_pictl(["hosts", "--hosts", str(inv)], pictl_env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"pictl: error: {inv}: host[0].cpus: host 'pi1' is not local "
                                   "(transport = \"local\"): only this machine's cores can be pinned")


def test_check_shows_each_hosts_cores(tmp_path: Path, pictl_env) -> None:
    _two_cores()
    hosts = _pinned_cluster(tmp_path / "cluster", ["0", "1"])
    proc = run_pictl(["check", "--json", "--hosts", str(hosts)], pictl_env)
    assert proc.returncode == 0, proc.stderr
    probes = [h["probe"] for h in json.loads(proc.stdout)["hosts"]]
    assert [(p["cpus"], p["cpu_list"]) for p in probes] == [(1, "0"), (1, "1")]
    table = run_pictl(["check", "--hosts", str(hosts)], pictl_env)
    rows = {line.split("│")[1].strip(): line for line in table.stdout.splitlines() if line.count("│") > 3}
    assert "│ 1 (0) " in rows["h0"] and "│ 1 (1) " in rows["h1"], table.stdout


def _processes(root: psutil.Process, cluster: Path) -> list[tuple[int, str, str, frozenset[int]]]:
    """(pid, command line, working directory, affinity) of every process the run started: the controller's
    descendants, and what works in the cluster's directories (jobs a warm process forked)."""
    found = []
    try:  # (once per scan, not once per process: on a loaded machine a slow scan missed the short-lived ranks)
        descendants = {c.pid for c in root.children(recursive=True)}
        forked = root.cmdline()
    except psutil.NoSuchProcess:
        descendants, forked = set(), []
    for proc in psutil.process_iter(["pid"]):
        try:
            cwd = proc.cwd()
            ours = str(cluster) in cwd or proc.pid in descendants
            if ours:
                cmdline = proc.cmdline()  # (first: read after it, the cores are those of what the line says)
                affinity = frozenset(proc.cpu_affinity())
                # A child caught between fork and exec is still the controller (its command line, its cores): the
                # transport pins it just before exec, and it has run none of its own code (a busy machine shows
                # them: ci44 caught one). It is seen again once it runs.
                if cmdline != forked:
                    found.append((proc.pid, " ".join(cmdline), cwd, affinity))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_every_process_of_a_pinned_host_runs_on_its_cores(tmp_path: Path, pictl_env) -> None:
    """Two hosts pinned to cores 0 and 1: while a real 2-stage run goes, every process it started (lease, probes,
    serial run, torchrun agents, ranks, warm clients and the jobs the warm process forked for them) is seen on
    its own host's core, and the run's figures say the hosts are machines apart."""
    _two_cores()
    cluster = tmp_path / "cluster"
    hosts = _pinned_cluster(cluster, ["0", "1"])
    seen: dict[int, tuple[str, str, frozenset[int]]] = {}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", str(hosts), "--stages", "2",
                                 "--split", "blocks.6", "--images", "4", "--warmup", "0", "--repeats", "2",
                                 "--headless", "--json"], env=pictl_env, cwd=ROOT, stdout=out, stderr=err, text=True)
        controller = psutil.Process(proc.pid)
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            for pid, cmd, cwd, cores in _processes(controller, cluster):
                seen.setdefault(pid, (cmd, cwd, cores))
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    # (SUSPECT when other work loads this shared machine: the cores are the point here, and the run still ends.)
    assert proc.returncode in (E.EXIT_OK, E.EXIT_SUSPECT), stderr[-3000:]
    for i in (0, 1):
        mine = {pid: v for pid, v in seen.items() if v[1].startswith(str(cluster / f"h{i}"))}
        assert len(mine) >= 2, (i, seen)  # torchrun's agent and its rank at least
        assert all(cores == {i} for _, _, cores in mine.values()), (i, mine)
    assert seen and all(cores in ({0}, {1}) for _, _, cores in seen.values()), seen
    s = json.loads(stdout)
    assert [(s["hosts"][h]["state"]["cpus"], s["hosts"][h]["state"]["cpu_list"]) for h in ("h0", "h1")] \
        == [(1, "0"), (1, "1")]
    assert "stages_share_cores" not in {f["code"] for f in s["flags"]}, s["flags"]  # one core each, none shared


# -- a CFS quota -----------------------------------------------------------------------------------------------

QUOTA_CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from remote.host import probe
from remote.host.cpuwait import Span
# Imported first, capped after: as a warm process that imported pictl's modules before its host got a quota.
with open(sys.argv[2], "w") as fh:
    fh.write(str(os.getpid()))
state = probe.host_state(0.4)
span, started = Span(), time.perf_counter()
while time.perf_counter() - started < 1.5:
    pass
print(json.dumps({"state": state, "raw_delay_s": span.raw_delay(), "waited_s": span.interference(),
                  "cpu_s": time.process_time(), "wall_s": time.perf_counter() - started}))
"""


def _in_a_quota(cores: float) -> dict:
    """A busy loop in a cgroup of its own capped at `cores` (10 ms periods, as the SSH test cluster's hosts):
    its probe's state, and how long it waited for a CPU, throttling and all and as pictl counts it."""
    if os.geteuid() != 0:
        skip_loudly("NEEDS ROOT: a CFS quota is a cgroup the test makes")
    v1 = Path("/sys/fs/cgroup/cpu")
    v2 = Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / f"pictl-test-quota-{os.getpid()}"
        limit = {"cpu.cfs_period_us": "10000", "cpu.cfs_quota_us": str(int(cores * 10000))}
    elif (v2 / "cgroup.subtree_control").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        group = v2 / f"pictl-test-quota-{os.getpid()}"
        limit = {"cpu.max": f"{int(cores * 10000)} 10000"}
    else:
        skip_loudly("NO CPU CGROUP CONTROLLER (v1 cpu, or v2 with cpu enabled) to make a quota with")
    group.mkdir()
    try:
        for name, value in limit.items():
            (group / name).write_text(value)
        child = subprocess.run([sys.executable, "-c", QUOTA_CHILD, str(ROOT), str(group / "cgroup.procs")],
                               capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stderr
        return json.loads(child.stdout)
    finally:
        for _ in range(50):  # rmdir succeeds once its process has gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_host_under_a_cfs_quota_reports_it_and_its_throttling_is_no_other_work() -> None:
    """A real process under a real 0.2-core quota: its probe records the quota; the kernel's run delay counts the
    throttling (most of the loop's time), pictl's count of a wait for a CPU other work held does not; and the
    flags read from those figures call nothing overloaded, where the raw run delay would have."""
    found = _in_a_quota(0.2)
    state = found["state"]
    assert state["cpu_quota"] == 0.2, state
    assert found["cpu_s"] < 0.5 * found["wall_s"], found  # it was capped: about 0.2 of a core
    assert found["raw_delay_s"] > 0.5 * found["wall_s"], found  # ... and the kernel counts that as waiting
    assert found["waited_s"] < 0.1 * found["raw_delay_s"], found  # pictl does not call it other work

    per_image = 0.25  # the loop's figures as a serial baseline of 6 images of 0.25 s each
    images = found["wall_s"] / per_image

    def overloaded(delay_s: float) -> list[str]:
        """The serial baseline's host_overloaded flag, were the loop's wait `delay_s`."""
        real = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
        s = copy.deepcopy(real)
        host = s["baseline"]["host"]
        s["baseline"]["state"] = s["hosts"][host]["state"] = state
        s["serial_timing"] = {**(s.get("serial_timing") or {}), "compute_per_image_s": per_image,
                              "run_delay_per_image_s": delay_s / images}
        for rec in s["hosts"].values():  # the machine's own pressure is not what is tested here
            for window in ("during_pipeline", "during_baseline"):
                if rec.get(window):
                    rec[window]["cpu_wait_mean"] = 0.0
        return [f.message for f in compute_flags(RunSummary.model_validate(s))
                if f.code == "host_overloaded" and "serial baseline" in f.message]

    assert overloaded(found["waited_s"]) == []
    assert overloaded(found["raw_delay_s"]), found  # what counting the throttling would have said
    timing = {"compute_per_image_s": per_image, "run_delay_per_image_s": found["waited_s"] / images}
    baseline = Baseline(1 / per_image, [], None, b"", time.time(), host_state=state, timing=timing)
    assert suspect_when_measured(baseline) is None, (state, timing)  # reusable: throttling did not slow it
