"""Ctrl-C and a rank that dies: every process stops, the summary says what happened."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, processes_under, write_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def pictl_env(shared_cache_env: dict[str, str]) -> dict[str, str]:
    return shared_cache_env  # one serial baseline for the module: the faults are in the pipeline


def _start(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    cluster = tmp_path / "cluster"
    hosts = write_cluster(cluster, 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pictl", "run", "--hosts", str(hosts), "--stages", "2", "--images", "20",
         "--warmup", "0", "--repeats", "4", "--policy", "equal", "--headless", "--json"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, cluster


def _wait_for_pipeline_progress(env: dict[str, str], proc: subprocess.Popen, timeout: float = 180) -> Path:
    runs = Path(env["PICTL_RUNS_DIR"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for events in runs.glob("*/events/h1.jsonl"):
            if '"event":"progress"' in events.read_text():
                return events.parent.parent
        time.sleep(0.5)
    raise AssertionError("the pipeline never reported progress")


def _assert_nothing_left(cluster: Path) -> None:
    deadline = time.monotonic() + 10
    while processes_under(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, " ".join(p.cmdline())[:120]) for p in processes_under(cluster)]
    assert not left, f"processes left behind: {left}"


def test_ctrl_c_stops_every_rank_and_writes_the_summary(tmp_path: Path, pictl_env) -> None:
    proc, cluster = _start(tmp_path, pictl_env)
    run_dir = _wait_for_pipeline_progress(pictl_env, proc)
    assert len(processes_under(cluster)) >= 4  # two torchrun agents, two ranks
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("pictl: error: interrupted")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["serial_ips"] > 0
    assert json.loads(out)["status"] == "interrupted"
    _assert_nothing_left(cluster)


def test_a_killed_rank_fails_the_run_naming_host_and_rank(tmp_path: Path, pictl_env) -> None:
    proc, cluster = _start(tmp_path, pictl_env)
    run_dir = _wait_for_pipeline_progress(pictl_env, proc)
    ranks = [p for p in processes_under(cluster / "h1") if "remote.pipeline" in " ".join(p.cmdline())
             and "torch.distributed.run" not in " ".join(p.cmdline())]
    assert len(ranks) == 1
    ranks[0].kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert (summary["error"]["host"], summary["error"]["rank"], summary["error"]["type"]) == ("h1", 1, "RunFailed")
    assert "host 'h1' rank 1" in err.strip().splitlines()[-1]
    assert summary["error"]["last_lines"], "the failing host's last lines are kept"
    _assert_nothing_left(cluster)


def test_a_killed_controller_leaves_nothing_running(tmp_path: Path, pictl_env) -> None:
    """SIGKILL gives pictl no chance to clean up: the supervisors see their pipe close and stop the ranks."""
    proc, cluster = _start(tmp_path, pictl_env)
    _wait_for_pipeline_progress(pictl_env, proc)
    assert processes_under(cluster)
    proc.kill()
    proc.communicate(timeout=30)
    _assert_nothing_left(cluster)
