"""The command line as a newcomer meets it: a wheel install, options before the command, help and version,
`pictl init`, and torchrun's exit-barrier noise kept out of the console. (`pictl runs` and the plain
headless output are tested on real runs in test_wire.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.cli import ROOT, run_pictl
from support.clusters import write_cluster

from pictl.cluster.stream import ProcessStream
from pictl.cluster.transport import transport_for
from pictl.events import HostOutput, SessionEvent
from pictl.headless import HeadlessRenderer
from pictl.inventory import load_cluster


def test_a_wheel_install_finds_its_inventory_and_profiles(tmp_path: Path) -> None:
    """Build the wheel, install it into a clean venv (no checkout on the path), and use it from elsewhere."""
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    dist = tmp_path / "dist"
    subprocess.run([uv, "build", "--wheel", "-q", "-o", str(dist), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    wheel = next(dist.glob("pictl-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True, timeout=120)
    subprocess.run([uv, "pip", "install", "-q", "-p", str(venv / "bin" / "python"), str(wheel)], check=True,
                   timeout=600)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PICTL_RUNS_DIR=str(tmp_path / "runs"), PICTL_CACHE_DIR=str(tmp_path / "cache"))

    def pictl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "pictl"), *args], cwd=away, env=env, text=True,
                              capture_output=True, timeout=120)

    profiles = pictl("profiles", "--json")
    assert profiles.returncode == 0, profiles.stderr
    found = {p["name"]: p for p in json.loads(profiles.stdout)}
    assert {"quick", "lab6"} <= set(found) and found["quick"]["description"]
    assert "site-packages" in found["quick"]["path"]
    hosts = pictl("hosts", "--json")
    assert hosts.returncode == 0, hosts.stderr
    shipped = json.loads(hosts.stdout)
    assert shipped["cluster"] == "local" and len(shipped["hosts"]) == 4 and "site-packages" in shipped["file"]
    # A run refused before anything starts: the shipped profile and inventory are read, 9 stages do not fit.
    refused = pictl("run", "--profile", "quick", "--stages", "9", "--headless")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("pictl: error: 9 stages do not fit ")
    assert not (tmp_path / "runs").exists()  # nothing half-done
    version = pictl("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("pictl 0.")


def test_options_before_the_command_hold_for_it(tmp_path: Path, pictl_env) -> None:
    mine = write_cluster(tmp_path / "mine", 2)
    listed = run_pictl(["--hosts", str(mine), "hosts", "--json"], pictl_env)
    assert listed.returncode == 0 and json.loads(listed.stdout)["file"] == str(mine)
    missing = run_pictl(["--hosts", str(tmp_path / "nonexistent.toml"), "hosts"], pictl_env)
    assert missing.returncode == 2 and "nonexistent.toml" in missing.stderr
    twice = run_pictl(["--hosts", str(mine), "run", "--hosts", str(ROOT / "hosts.toml"), "--headless"], pictl_env)
    assert twice.returncode == 2 and "--hosts: given before the command" in twice.stderr
    runs = run_pictl(["--runs-dir", str(tmp_path / "elsewhere"), "runs", "--json"], pictl_env)
    assert runs.returncode == 0 and json.loads(runs.stdout) == []


def test_help_version_and_choices(pictl_env) -> None:
    short = run_pictl(["-h"], pictl_env)
    assert short.returncode == 0 and "Plain `pictl` opens the dashboard" in short.stdout
    assert all(cmd in short.stdout for cmd in ("run", "runs", "init", "sweep", "report"))
    run_help = run_pictl(["run", "-h"], pictl_env)
    for shown in ("balanced|equal|explicit", "synthetic|cifar10", "[default: 48]", "[default: balanced]",
                  "Experiment", "Measurement"):
        assert shown in run_help.stdout, shown
    assert "[sweep] values" in run_pictl(["sweep", "-h"], pictl_env).stdout
    bad = run_pictl(["run", "--policy", "fastest", "--headless"], pictl_env)
    assert bad.returncode == 2 and "'fastest' is not one of" in bad.stderr


def test_init_writes_an_inventory_that_hosts_and_check_read(tmp_path: Path, pictl_env) -> None:
    out = tmp_path / "hosts.toml"
    made = run_pictl(["init", "--transport", "local", "--count", "2", "--out", str(out),
                      "--workdir", str(tmp_path / "work")], pictl_env)
    assert made.returncode == 0, made.stderr  # check ran on the new hosts and found them ready
    assert "local0" in made.stdout and "yes" in made.stdout
    listed = json.loads(run_pictl(["hosts", "--hosts", str(out), "--json"], pictl_env).stdout)
    assert [h["name"] for h in listed["hosts"]] == ["local0", "local1"]
    assert listed["hosts"][1]["workdir"] == str(tmp_path / "work" / "local1")
    again = run_pictl(["init", "--transport", "local", "--count", "3", "--out", str(out)], pictl_env)
    assert again.returncode == 2 and "already exists" in again.stderr  # never over an existing file
    ssh = tmp_path / "pis.toml"
    made = run_pictl(["init", "--address", "pi@10.0.0.5:2222", "--address", "10.0.0.6", "--interface", "eth0",
                      "--out", str(ssh), "--no-trust", "--no-check"], pictl_env)
    assert made.returncode == 0, made.stderr
    pis = load_cluster(ssh)
    assert [(h.name, h.address, h.port, h.user) for h in pis.hosts] == [
        ("pi0", "10.0.0.5", 2222, "pi"), ("pi1", "10.0.0.6", None, None)]
    bad = run_pictl(["init", "--address", "pi@10.0.0.5:99999", "--out", str(tmp_path / "x.toml")], pictl_env)
    assert bad.returncode == 2 and "port 99999" in bad.stderr and not (tmp_path / "x.toml").exists()


def test_the_exit_barrier_traceback_is_kept_to_the_log(tmp_path: Path, capsys) -> None:
    """torchrun's agent logs a traceback when a peer left the exit barrier first: the log keeps it, the
    console and the failure tail do not; what follows it is shown again, plainly, on one line."""
    script = ("import sys\n"
              "e = sys.stderr.write\n"
              "e('[E1123 api.py:1008] Error waiting on exit barrier. Elapsed: 0.2 seconds\\n')\n"
              "e('Traceback (most recent call last):\\n')\n"
              "e('  File \"/x/api.py\", line 1000, in _exit_barrier\\n')\n"
              "e('torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.\\n')\n"
              "e('RuntimeError: a real failure\\n')\n")
    kept: dict[str, list[str]] = {"log": [], "event": []}
    shown: list[HostOutput] = []

    class Keep:
        def event(self, source: str, line: str) -> None:
            kept["event"].append(line)

        def log(self, source: str, line: str) -> None:
            kept["log"].append(line)

    async def main() -> int:
        host = load_cluster(write_cluster(tmp_path / "c", 1)).hosts[0]
        proc = await transport_for(host).start([sys.executable, "-c", script])
        renderer = HeadlessRenderer(verbose=True)

        def sink(event: SessionEvent) -> None:
            renderer(event)
            if isinstance(event, HostOutput):
                shown.append(event)

        stream = ProcessStream("h0", "h0", Keep(), sink)
        rc = await stream.consume(proc)
        assert list(stream.tail) == ["h0: RuntimeError: a real failure"]
        return rc

    assert asyncio.run(main()) == 0
    assert len(kept["log"]) == 5 and "DistNetworkError" in kept["log"][3]
    assert [e.line for e in shown] == ["RuntimeError: a real failure"]
    assert capsys.readouterr().err == "h0 RuntimeError: a real failure\n"  # stderr is not a terminal here
