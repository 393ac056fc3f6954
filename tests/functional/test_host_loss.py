"""Fail in place: a run whose host is lost mid-run finishes on the hosts it has left (real torchrun, local cluster).

A rank's process is killed during the second timed pass of a 3-stage run (as a Pi that loses power: no word from
it). The run goes on with 2 stages on the other two hosts, every timed pass counted once, the outputs still checked
against the serial run, and nothing of ours left on any host. (The SSH cluster's version, a link cut: test_ssh.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import finished, run_pictl
from support.clusters import processes_under, write_cluster

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

IMAGES, REPEATS = 12, 3


def _records(events: Path, kind: str) -> list[dict]:
    if not events.exists():
        return []
    lines = events.read_text().splitlines()
    return [r for r in map(json.loads, lines[:-1] if lines and not lines[-1].endswith("}") else lines)
            if r.get("event") == kind]


def test_a_rank_killed_in_the_second_timed_pass_the_run_finishes_on_the_two_hosts_left(tmp_path: Path,
                                                                                         pictl_env) -> None:
    cluster = write_cluster(tmp_path / "cluster", 3)
    proc = subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", str(cluster), "--stages", "3",
                             "--images", str(IMAGES), "--chunk", "2", "--warmup", "0", "--repeats", str(REPEATS),
                             "--policy", "equal", "--headless", "--json"],
                            env=pictl_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The first timed pass is through (the last stage's throughput), so the second is under way: h1's rank dies.
    deadline = time.monotonic() + 300
    victim = None
    while victim is None:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never finished its first timed pass"
        for run_dir in Path(pictl_env["PICTL_RUNS_DIR"]).glob("*"):
            started = _records(run_dir / "events" / "h1.jsonl", "run_start")
            if started and _records(run_dir / "events" / "h2.jsonl", "throughput"):
                victim = started[0]["pid"]
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert finished(proc.returncode, err), err[-3000:]
    s = json.loads(out)

    # It finished, on the two hosts left, with its outputs still the serial run's.
    assert s["status"] == "ok" and s["outputs_match"] is True and s["max_abs_diff"] == 0.0
    assert s["stages"] == 2 and [st["host"] for st in s["per_stage"]] == ["h0", "h2"]
    loss = s["host_lost"][0]
    assert (loss["host"], loss["rank"], loss["completed_passes"]) == ("h1", 1, 1), loss
    assert (loss["stages_before"], loss["stages_after"], loss["hosts_after"]) == (3, 2, ["h0", "h2"])
    assert loss["recomputed_images"] == IMAGES  # the second pass, under way: computed again whole
    assert 0 < loss["replan_s"] <= loss["lost_s"] < 60, loss

    # Two segments, each pass counted once on the split that ran it: the protocol's images, no more, no fewer.
    first, second = s["segments"]
    assert (first["hosts"], first["passes"], first["ended_by"], first["lost_host"]) == (
        ["h0", "h1", "h2"], [0, 0], "host-lost", "h1")
    assert (second["hosts"], second["passes"], second["ended_by"]) == (["h0", "h2"], [1, REPEATS - 1], None)
    assert len(first["split_points"]) == 2 and len(second["split_points"]) == 1
    assert second["split_points"] == s["split_points"]
    assert len(s["pass_ips"]) == REPEATS and first["images"] + second["images"] == IMAGES * REPEATS
    assert s["pass_ips"] == first["pass_ips"] + second["pass_ips"]

    # Said in the flags, the waterfall (its terms still add up to the gap to the 3 it began with) and the lines.
    flag = next(f for f in s["flags"] if f["code"] == "host_lost")
    assert flag["invalidates"] is False and "h1 was lost after 1 of 3 timed pass(es)" in flag["message"]
    w = s["waterfall"]
    terms = {t["term"]: t["points"] for t in w["terms"]}
    assert w["stages"] == 3 and terms["host_lost"] <= -0.5, w
    assert abs(sum(terms.values()) + w["gap"]) < 1e-3
    assert "h1 lost after 1 of 3 timed pass(es)" in err and "continuing on h0, h2 with 2 stage(s)" in err
    assert "segment 1 on h0, h1, h2: timed passes 1-1" in err and "segment 2 on h0, h2: timed passes 2-3" in err

    # Nothing of ours left on any host, the lost one's included; the record's report shows the segments.
    time.sleep(1.0)
    assert not processes_under(cluster.parent), [p.cmdline() for p in processes_under(cluster.parent)]
    made = run_pictl(["report", s["run_id"], "--out", str(tmp_path / "report")], pictl_env)
    assert made.returncode == 0, made.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert "**hosts lost**" in report and "| 1 | h0, h1, h2 | 1-1 |" in report
    assert "| 2 | h0, h2 | 2-3 |" in report and "host-lost (h1)" in report
