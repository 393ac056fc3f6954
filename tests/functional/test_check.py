"""`pictl check` against the shipped local cluster and the real sshd cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import ROOT, run_pictl


def test_check_the_shipped_local_cluster(pictl_env) -> None:
    proc = run_pictl(["check", "--json", "--hosts", str(ROOT / "hosts.toml")], pictl_env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ready"] is True and len(report["hosts"]) == 4
    h = report["hosts"][0]
    assert h["probe"]["venv"]["packages"]["torch"] and h["probe"]["cpus"] >= 1
    assert h["probe"]["interface"] == {"name": "lo", "exists": True, "address": "127.0.0.1"}
    assert h["probe"]["rendezvous"]["ok"] is True
    assert h["clock_offset_ms"] == 0.0 and h["clock_uncertainty_ms"] == 0.0  # a local host is this machine
    # A recorded Pi 5 `vcgencmd` first on the PATH: each host's power now, from its PMIC rails (what a run's
    # energy per image is made of); without it, this machine has no meter pictl reads, unless RAPL is readable.
    pi = {**pictl_env, "PATH": f"{ROOT / 'tests/support/data/vcgencmd'}:{pictl_env.get('PATH', '/usr/bin:/bin')}",
          "COLUMNS": "250"}
    table = run_pictl(["check", "--hosts", str(ROOT / "hosts.toml")], pi)
    assert table.returncode == 0 and "power W" in table.stdout and table.stdout.count("2.95 pmic") == 4, table.stdout
    if not any(k.startswith("rapl") for k in {h["load"].get("power_source") or "" for h in report["hosts"]}):
        assert all(h["load"]["power_w"] is None for h in report["hosts"]), report["hosts"]


@pytest.mark.slow
def test_check_ssh_hosts_and_name_the_unready(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    proc = run_pictl(["check", "--json", "--hosts", str(ssh_cluster.inventory)], pictl_env)
    assert proc.returncode == 0, proc.stderr
    hosts = json.loads(proc.stdout)["hosts"]
    assert [h["probe"]["interface"]["address"] for h in hosts] == [ssh_cluster.address(i) for i in range(4)]
    assert all(h["probe"]["rendezvous"]["ok"] for h in hosts)
    # The hosts share this machine's clock: the true offset is 0, and NTP's bound must contain it.
    for h in hosts:
        assert 0 < h["clock_uncertainty_ms"] < 2.0, h
        assert abs(h["clock_offset_ms"]) <= h["clock_uncertainty_ms"] + 0.001, h

    from support.clusters import dead_endpoint

    inv = ssh_cluster.variant(tmp_path / "hosts.toml", hosts={1: {"interface": "eth9"}, 3: dead_endpoint(ssh_cluster)})
    proc = run_pictl(["check", "--json", "--hosts", str(inv)], pictl_env)
    assert proc.returncode == 4  # a host is down
    by_name = {h["host"]: h for h in json.loads(proc.stdout)["hosts"]}
    assert by_name["h0"]["ready"] and by_name["h2"]["ready"]  # one dead host hides no other
    assert "interface eth9 does not exist" in by_name["h1"]["problems"][0]
    assert by_name["h3"]["reachable"] is False
    assert "host 'h1' is not ready: interface eth9" in proc.stderr and "host 'h3' is not ready" in proc.stderr


def test_check_shows_the_load_other_work_puts_on_a_host(pictl_env) -> None:
    """Three busy loops, each in a session of its own (as another user's work competes on this machine), on its 2
    CPUs: `pictl check` shows the local hosts' busy cores and run queue, the load the waterfall's interference
    advice points at; the table shows them beside the CPUs."""
    import subprocess
    import sys

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(3)]
    try:
        proc = run_pictl(["check", "--json", "--hosts", str(ROOT / "hosts.toml")], pictl_env)
        table = run_pictl(["check", "--hosts", str(ROOT / "hosts.toml")], {**pictl_env, "COLUMNS": "200"})
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert proc.returncode == 0, proc.stderr
    for h in json.loads(proc.stdout)["hosts"]:
        load = h["load"]
        cpus = load["cpus"]
        assert cpus >= 1 and load["busy_cores"] >= min(cpus, 3) - 0.5, load  # the loops keep every CPU busy
        assert load["runnable"] >= 2 and load["load1"] is not None, load
    assert table.returncode == 0 and "busy cores" in table.stdout and "run queue" in table.stdout, table.stdout
    assert f"{load['cpus']} " in table.stdout and f"/{load['cpus']}" in table.stdout  # busy cores of the CPUs
