"""`pictl tune` for real on a local cluster: it measures the pipeline over every host, predicts the rest from
the profiles that run measured, measures the best, prints an 80-column table, draws its plot, saves the winner
as a preset that `pictl run --profile` reproduces; interrupted, it keeps what it measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import write_cluster

pytestmark = pytest.mark.slow

FAST = ["--images", "4", "--chunk", "1", "--warmup", "0", "--repeats", "1"]


def test_tune_measures_the_best_saves_a_preset_that_reproduces_it(tmp_path: Path, pictl_env) -> None:
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--measure", "2",
                      "--out", str(tmp_path / "tune"), "--json"], env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    # Threads are free (no --threads, no profile): 1 and 2 on this 2-CPU machine, each gain measured by one
    # serial run per machine (the cluster's two hosts share one), which is a row but not one of --measure's.
    threads = [1, *[t for t in (2, 4, 8) if t <= (os.cpu_count() or 1)]]
    assert out["axes"] == {"threads": threads, "chunks": [1]}
    levers = [r for r in rows if r["run_id"] and (r["replicas"], r["stages"]) == (1, 1) and r["threads"] > 1]
    assert len(levers) == len(threads) - 1 and all(r["status"] == "ok" for r in levers)
    assert all(set(out["calibration"]["thread_gains"][str(t)]) == {"h0", "h1"} for t in threads[1:])
    measured = [r for r in rows if r["run_id"] and r not in levers]
    assert len(measured) == 2 and all(r["status"] == "ok" for r in measured)
    assert {(r["replicas"], r["stages"]) for r in rows} == {(1, 1), (1, 2), (2, 1)}  # exact only: no --allow-loss
    assert not any(r["numerics"] != "fp32" or r["wire"] != "fp32" for r in rows)
    assert all(r["predicted_ips"] and r["predicted_ips"] > 0 for r in rows if r["threads"] == 1)
    assert any(r["replicas"] == 1 and r["stages"] == 2 for r in measured)  # the pipeline over every host first
    win = out["winner"]
    assert win["kept"] and win["exact"]
    assert win["speedup_vs_fp32"] == max(r["speedup_vs_fp32"] for r in rows if r["kept"])
    assert out["best_pipeline"]["replicas"] == 1
    table = (tmp_path / "tune" / "table.md").read_text()
    assert all(len(line) <= 80 for line in table.splitlines()) and "WINNER" in table
    assert (tmp_path / "tune" / "tune.png").stat().st_size > 10_000
    assert "pictl run --profile tuned" in proc.stderr
    again = run_pictl(["run", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), "--profile", "tuned",
                       "--headless", "--json"], env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    s = json.loads(again.stdout)
    assert (s["replicas"], s["stages"], s["profile"]) == (win["replicas"], win["stages"], "tuned")
    assert s["split_points"] == win["split_points"] and s["outputs_match"] is True
    assert (s["threads"], s["chunk"]) == (win["threads"], win["chunk"])


def test_an_interrupted_tune_keeps_what_it_measured(tmp_path: Path, pictl_env) -> None:
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    out = tmp_path / "tune"
    proc = subprocess.Popen([sys.executable, "-m", "pictl", "tune", "--hosts", str(hosts), "--runs-dir",
                             str(tmp_path / "runs"), *FAST, "--measure", "3", "--out", str(out)],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "tune.json").is_file() or not any(
                r["run_id"] for r in json.loads((out / "tune.json").read_text())["rows"]):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    kept = json.loads((out / "tune.json").read_text())
    assert kept["status"] == "interrupted" and "tune interrupted" in err
    done = [r for r in kept["rows"] if r["run_id"]]
    assert done and done[0]["replicas"] == 1 and done[0]["stages"] == 2 and done[0]["throughput_ips"] > 0
    assert not (tmp_path / "profiles").exists()  # nothing won: no preset


def test_a_tune_of_a_model_timm_does_not_have_is_refused_as_bad_input(tmp_path: Path, pictl_env) -> None:
    """Its first run's profiling finds the model missing: one line, exit 2, no preset, no run directory."""
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--model",
                      "nosuchnet", "--out", str(tmp_path / "tune")], env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "pictl: error: unknown model 'nosuchnet' (timm has no such " \
                                                   "architecture)"
    assert not (tmp_path / "profiles").exists() and not list((tmp_path / "cluster").glob("h*/runs/*"))
    assert not (tmp_path / "tune").exists()  # the tune directory it had made, empty, is gone
