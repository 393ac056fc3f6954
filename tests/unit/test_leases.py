"""The lease and the clean-up helpers on their own (this machine, real processes): atomic, released on
EOF, never stale after a SIGKILL; finished run directories removed, live ones and recent ones kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.cli import ROOT

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
