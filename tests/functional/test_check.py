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
