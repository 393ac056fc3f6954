"""The lease and the clean-up helpers on their own (this machine, real processes): atomic, released on
EOF, never stale after a SIGKILL; finished run directories removed, live ones and recent ones kept; hosts a sweep
holds for all of its runs, lent to each run and held on after it, a lost one leased again, all freed at the end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import ROOT
from support.clusters import write_cluster

from pictl import errors as E
from pictl.cluster.leases import take_leases
from pictl.cluster.transport import transport_for
from pictl.inventory import load_cluster
from pictl.run.hosts import held_hosts
from remote.host.cleanup import STALE_DIR_S, cleanup

LEASE = [sys.executable, str(ROOT / "remote" / "host" / "lease.py"), "hold"]


def _hold(workdir: Path, run_id: str, python: str = sys.executable) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([*LEASE, "--workdir", str(workdir), "--python", python,
                             "--record", json.dumps({"run_id": run_id, "user": "u", "controller": "c"})],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def test_one_holder_at_a_time_released_at_eof_and_free_after_sigkill(tmp_path: Path) -> None:
    first, said = _hold(tmp_path / "w", "run-1")
    assert said["state"] == "held" and said["lease"]["pid"] == first.pid
    second, refused = _hold(tmp_path / "w", "run-2")
    assert refused["state"] == "busy" and refused["lease"]["run_id"] == "run-1" and second.wait(10) == 3
    first.stdin.close()  # the controller lets go (or its connection dropped)
    assert first.wait(10) == 0 and (tmp_path / "w" / "lease").read_text() == ""
    third, said = _hold(tmp_path / "w", "run-3")
    assert said["state"] == "held"
    third.send_signal(signal.SIGKILL)  # no chance to clean up: the record stays, the lock does not
    third.wait(10)
    assert json.loads((tmp_path / "w" / "lease").read_text())["run_id"] == "run-3"
    fourth, said = _hold(tmp_path / "w", "run-4")
    assert said["state"] == "held" and said["lease"]["run_id"] == "run-4"
    fourth.stdin.close()
    fourth.wait(10)


def test_a_host_that_cannot_run_is_not_ready(tmp_path: Path) -> None:
    proc, said = _hold(tmp_path / "w", "run", python=str(tmp_path / "no-venv" / "bin" / "python"))
    assert said == {"state": "not_ready", "error": f"no python at {tmp_path}/no-venv/bin/python (set `venv`, or "
                                                   "run `pictl provision`)"} and proc.wait(10) == 2
    proc, said = _hold(Path("/proc/x"), "run")
    assert said["state"] == "not_ready" and "cannot use the workdir /proc/x" in said["error"]
    proc.wait(10)
    proc, said = _hold(tmp_path / "w", "run", python="python3")  # a bare name is looked up on PATH
    assert said["state"] == "held"
    proc.stdin.close()
    proc.wait(10)


def test_finished_run_directories_go_live_and_recent_ones_stay(tmp_path: Path) -> None:
    """"crashed": old, no group; "recent": a lease-less job may be filling it; "current": the caller's run;
    "orphaned": an old directory whose group still runs with no supervisor (stopped, then kept this time:
    its record just changed)."""
    runs = tmp_path / "runs"
    for name in ("crashed", "recent", "current", "orphaned"):
        (runs / name).mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=runs / "orphaned",
                               start_new_session=True)
    try:
        (runs / "orphaned" / "pgid-x").write_text(f"{sleeper.pid}\n")
        old = time.time() - STALE_DIR_S - 60
        for name in ("crashed", "current", "orphaned"):
            os.utime(runs / name, (old, old))
        swept = cleanup(tmp_path, orphans_only=True, keep="current")
        assert swept["removed"] == ["crashed"] and sorted(p.name for p in runs.iterdir()) == [
            "current", "orphaned", "recent"]
        assert [s["run"] for s in swept["stopped"]] == ["orphaned"] and sleeper.wait(10) is not None
        assert cleanup(tmp_path, orphans_only=False, finish="orphaned")["removed"] == ["orphaned"]
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_hosts_held_for_a_sweep_are_lent_to_each_run_and_a_lost_one_is_leased_again(tmp_path: Path) -> None:
    """The sweep's leases (one holder per host, under its name) outlive each run it lends them to: that run's own
    directory goes with it, another run is refused naming the sweep, a host whose lease holder died is leased
    again by `mend`, and both are free once the sweep ends."""
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    lease = {h: tmp_path / "cluster" / h / "lease" for h in ("h0", "h1")}

    def holder(h: str) -> dict:
        return json.loads(lease[h].read_text() or "{}")

    async with held_hosts(cluster, "sweep", "s1") as held:
        first = {h: holder(h) for h in lease}
        assert all((r["run_id"], r["kind"]) == ("s1", "sweep") for r in first.values()), first
        job = held.lend("run-1", [cluster.hosts[0]])
        await job.stage({}, "cannot prepare the run")
        assert (tmp_path / "cluster" / "h0" / "runs" / "run-1").is_dir() and list(job.fleet.transports) == ["h0"]
        await job.close(["h0"])
        assert not (tmp_path / "cluster" / "h0" / "runs" / "run-1").exists()
        assert {h: holder(h) for h in lease} == first  # the run ended, the sweep holds on
        with pytest.raises(E.HostBusy, match=r"hosts 'h0', 'h1' busy: held by sweep s1 of "):
            await take_leases([transport_for(h) for h in cluster.hosts], "another-run")
        os.kill(first["h1"]["pid"], signal.SIGKILL)  # h1's lease lost (as with its connection)
        await asyncio.wait_for(next(x for x in held.job.leases if x.transport.host.name == "h1").process.wait(), 10)
        await held.mend()
        assert holder("h1")["pid"] != first["h1"]["pid"] and holder("h1")["run_id"] == "s1"
        assert holder("h0") == first["h0"] and await held.job.lost() == []
    assert all(path.read_text() == "" for path in lease.values())
