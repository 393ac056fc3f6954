"""Fail in place: a run whose host is lost mid-run finishes on the hosts it has left (real torchrun, local cluster).

A rank's process is killed during the second timed pass of a 3-stage run (as a Pi that loses power: no word from
it). The run goes on with 2 stages on the other two hosts, every timed pass counted once, the outputs still checked
against the serial run, and nothing of ours left on any host. (The SSH cluster's version, a link cut: test_ssh.py.)
"""

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
from support.cli import finished, run_pictl
from support.clusters import processes_under, write_cluster

from pictl import errors as E
from pictl.cluster.jobs import HostJob
from pictl.inventory import load_cluster
from pictl.jobs.tune import plan_tune
from pictl.jobs.tune_report import TuneReference
from pictl.jobs.tune_runs import Measured, TuneJob
from pictl.jobs.tune_space import Candidate
from pictl.run.hosts import held_hosts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

IMAGES, REPEATS = 8, 3


def _records(events: Path, kind: str) -> list[dict]:
    if not events.exists():
        return []
    lines = events.read_text().splitlines()
    return [r for r in map(json.loads, lines[:-1] if lines and not lines[-1].endswith("}") else lines)
            if r.get("event") == kind]


def _nothing_left(root: Path) -> None:
    """No process of ours under `root` a second after pictl exited (at once, if none is left by then)."""
    deadline = time.monotonic() + 1.0
    while processes_under(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_under(root), [p.cmdline() for p in processes_under(root)]


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
    _nothing_left(cluster.parent)
    made = run_pictl(["report", s["run_id"], "--out", str(tmp_path / "report")], pictl_env)
    assert made.returncode == 0, made.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    assert "**hosts lost**" in report and "| 1 | h0, h1, h2 | 1-1 |" in report
    assert "| 2 | h0, h2 | 2-3 |" in report and "host-lost (h1)" in report


def test_a_sweep_that_loses_a_host_measures_the_rest_on_the_hosts_left(tmp_path: Path, pictl_env) -> None:
    """h1's rank is killed in the sweep's 2-stage run: that run is measured again on h0 and h2 in its round, the
    3-stage configuration no longer fits the two hosts left and runs no more, and the sweep says so."""
    cluster = write_cluster(tmp_path / "cluster", 3)
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "pictl", "sweep", "--hosts", str(cluster), "--out", str(out),
                             "--stages", "2,3", "--policy", "equal", "--images", "8", "--chunks", "2",
                             "--warmup", "0", "--repeats", "2", "--rounds", "1", "--max-rounds", "1",
                             "--headless", "--json"],
                            env=pictl_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    victim = None
    while victim is None:  # the 2-stage run's first timed pass is through (its last stage, h1, said so)
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep's 2-stage run never finished a timed pass"
        for run_dir in Path(pictl_env["PICTL_RUNS_DIR"]).glob("*"):
            started = _records(run_dir / "events" / "h1.jsonl", "run_start")
            if started and _records(run_dir / "events" / "h1.jsonl", "throughput"):
                victim, lost_run = started[0]["pid"], run_dir.name
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    out_text, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err[-3000:]  # (a configuration was not measured: the sweep says which, and why)
    sweep = json.loads((out / "sweep.json").read_text())
    rows = {r["label"]: r for r in sweep["rows"]}
    assert json.loads(out_text)["rows"] == sweep["rows"]

    # The 2-stage configuration: measured again on the hosts left, in its round, its outputs the serial run's.
    two = rows["2 stages, equal"]
    assert (two["status"], two["rounds"], two["outputs_match"]) == ("ok", 1, True), two
    assert lost_run not in two["run_ids"]
    again = json.loads((Path(pictl_env["PICTL_RUNS_DIR"]) / two["run_id"] / "summary.json").read_text())
    assert [st["host"] for st in again["per_stage"]] == ["h0", "h2"] and again["segments"][0]["hosts"] == ["h0", "h2"]
    # The 3-stage one no longer fits: it ran no more, and says why.
    three = rows["3 stages, equal"]
    assert three["status"] == "retired" and three["rounds"] == 0 and "3 stages do not fit" in three["error"], three

    loss = sweep["host_lost"][0]
    assert (loss["round"], loss["host"], loss["lost_in"], loss["run_id"]) == (1, "h1", "2 stages, equal", lost_run)
    assert loss["hosts_left"] == ["h0", "h2"] and loss["reference_host"] == "h0"
    assert list(loss["retired"]) == ["3 stages, equal"]
    assert "h1 was lost in round 1" in err and "ran on h0, h2" in err
    assert "Host lost: h1 was lost in round 1" in (out / "table.md").read_text()
    _nothing_left(cluster.parent)


def test_a_tune_that_loses_a_host_gives_its_lease_back_and_runs_the_rest_on_the_hosts_left(tmp_path: Path) -> None:
    """The tune's side of a loss, over real leases on a local cluster: the lost host's lease is given back at once
    (another team can take it while the tune still holds the others), the reference moves off it, the runs after
    go to the hosts left (a lever's run on the lost host is not measured), and tune.json keeps the loss. (The
    sweep above shows the same reaction end to end, from a real killed rank.)"""
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 3))
    base, settings = plan_tune(None, {})
    said: list[object] = []

    async def scenario() -> None:
        tune = TuneJob(cluster, base, settings, tmp_path / "tune", on_event=said.append, cache=None, on_rows=None,
                       on_session=None, write_failed=None, runs_root=tmp_path / "runs")
        (tmp_path / "tune").mkdir()
        tune.meta.reference = TuneReference(host="h0", numerics="fp32", threads=1, chunk=1, screening_run_id=None,
                                            screening_ips=None)
        async with held_hosts(cluster, "tune", "t1", on_event=said.append) as tune.hosts:  # (as run_tune holds them)
            await tune._mended(E.HostLost.on("h0", 0, "the pipeline", "the rank died without reporting an error"))
            assert [h.name for h in tune.cluster.hosts] == ["h1", "h2"]
            assert tune.meta.reference is not None and tune.meta.reference.host == "h1"
            # Another team takes the lost host now; the two the tune still holds stay refused to it.
            other = HostJob([h for h in cluster.hosts if h.name == "h0"], "other-team")
            await other.hold()
            await other.close()
            busy = HostJob([h for h in cluster.hosts if h.name == "h2"], "other-team")
            try:
                await busy.hold()
                raise AssertionError("h2 should still be the tune's")
            except E.HostBusy:
                pass
            finally:
                await busy.close()
            lever = Measured(Candidate(1, 1, threads=2, chunk=1))
            await tune.measure(lever, "what 2 threads gain on h0", on="h0")
            assert lever.status is None and lever.why == "not measured: h0 was lost"

    asyncio.run(scenario())
    record = json.loads((tmp_path / "tune" / "tune.json").read_text())
    loss = record["host_lost"][0]
    assert (loss["host"], loss["hosts_left"]) == ("h0", ["h1", "h2"])
    assert "h0 was lost" in loss["line"] and "the reference on h1" in loss["line"]
    assert any(getattr(e, "host", None) == "h0" for e in said)  # the dashboard's HostDropped
