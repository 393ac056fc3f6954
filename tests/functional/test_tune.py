"""`pictl tune` for real on a local cluster: it measures the pipeline over every host, predicts the rest from
the profiles that run measured, measures the best, prints an 80-column table, draws its plot, saves the winner
as a preset that `pictl run --profile` reproduces; interrupted, it keeps what it measured and says so. What can
refuse a tune (where its preset goes, a shipped name, a full disk, unreachable hosts) refuses it before its
first run: one line, the documented exit code, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import processes_under, skip_loudly, write_cluster

from pictl.planning.options import RunOptions
from pictl.planning.presets import resolve_options

FAST = ["--images", "4", "--chunk", "1", "--warmup", "0", "--repeats", "1"]


@pytest.mark.slow
def test_tune_measures_the_best_saves_a_preset_that_reproduces_it(tmp_path: Path, pictl_env) -> None:
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--measure", "2",
                      "--out", str(tmp_path / "tune"), "--json"], env, timeout=600, cwd=tmp_path)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    rows = out["rows"]
    # Threads are free (no --threads, no profile): 1 and 2 on this 2-CPU machine, each gain measured by one
    # serial run per machine (the cluster's two hosts share one), which is a row but not one of --measure's.
    threads = [1, *[t for t in (2, 4, 8) if t <= (os.cpu_count() or 1)]]
    assert out["axes"] == {"threads": threads, "chunks": [1]}
    levers = [r for r in rows if r["run_id"] and (r["replicas"], r["stages"]) == (1, 1) and r["threads"] > 1]
    assert len(levers) == len(threads) - 1 and all(r["status"] == "ok" for r in levers)
    assert all(set(out["calibration"]["thread_gains"][str(t)]) == {"h0", "h1"} for t in threads[1:])
    # The serial run is a measured row of its own (the first run's, one copy on one host), at 1x by definition.
    (serial,) = [r for r in rows if r["reference"]]
    assert (serial["replicas"], serial["stages"], serial["threads"], serial["chunk"]) == (1, 1, 1, 1)
    measured = [r for r in rows if r["run_id"] and r not in levers and not r["reference"]]
    assert len(measured) == 2 and all(r["status"] == "ok" for r in measured)
    lead = next(r for r in measured if (r["replicas"], r["stages"]) == (1, 2))
    assert serial["status"] == "ok" and serial["run_id"] == lead["run_id"] and serial["speedup_vs_fp32"] == 1.0
    assert serial["throughput_ips"] == lead["serial_ips"] and serial["kept"] and serial["exact"]
    assert {(r["replicas"], r["stages"]) for r in rows} == {(1, 1), (1, 2), (2, 1)}  # exact only: no --allow-loss
    assert not any(r["numerics"] != "fp32" or r["wire"] != "fp32" for r in rows)
    assert all(r["predicted_ips"] and r["predicted_ips"] > 0 for r in rows if r["threads"] == 1)
    assert any(r["replicas"] == 1 and r["stages"] == 2 for r in measured)  # the pipeline over every host first
    assert out["status"] == "done" and "error" not in out
    fastest = max(r["speedup_vs_fp32"] for r in rows if r["kept"] and not r["reference"])
    if fastest <= 1.0:  # a machine too busy (other tests) for any copy to beat the serial run: nothing is saved
        assert proc.returncode == 3 and out["winner"] is None and out["preset"] is None
        assert "no candidate beat the serial run" in proc.stderr and not (tmp_path / "profiles").exists()
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    win = out["winner"]
    assert win["kept"] and win["exact"] and win["speedup_vs_fp32"] > 1.0 and not win["reference"]  # beats serial
    assert win["speedup_vs_fp32"] == max(r["speedup_vs_fp32"] for r in rows if r["kept"])
    assert out["best_pipeline"]["replicas"] == 1
    table = (tmp_path / "tune" / "table.md").read_text()
    assert all(len(line) <= 80 for line in table.splitlines()) and "WINNER" in table
    assert "| 1x1           |" in table and "| serial  |" in table
    assert (tmp_path / "tune" / "tune.png").stat().st_size > 10_000
    assert "pictl run --profile tuned" in proc.stderr
    # Saved in the user's presets directory with the user's protocol (no --profile: pictl run's defaults), not
    # the tune's FAST one; the run below measures briefly again, the configuration the preset's.
    saved = resolve_options("tuned", {}, extra=Path(env["PICTL_PROFILES_DIR"]))
    assert (saved.images, saved.warmup, saved.repeats) == (RunOptions().images, RunOptions().warmup,
                                                           RunOptions().repeats)
    again = run_pictl(["run", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), "--profile", "tuned", *FAST,
                       "--headless", "--json"], env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    s = json.loads(again.stdout)
    assert (s["replicas"], s["stages"], s["profile"]) == (win["replicas"], win["stages"], "tuned")
    assert s["split_points"] == win["split_points"] and s["outputs_match"] is True
    assert (s["threads"], s["chunk"]) == (win["threads"], win["chunk"])


@pytest.mark.slow
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
    assert kept["error"]["type"] == "Interrupted" and kept["error"]["exit_code"] == 130
    (first,) = [r for r in kept["rows"] if r["run_id"] and (r["replicas"], r["stages"]) == (1, 2)]
    (serial,) = [r for r in kept["rows"] if r["reference"]]  # its serial run, a row of its own (ranked: either first)
    assert first["throughput_ips"] > 0 and serial["run_id"] == first["run_id"] and serial["throughput_ips"] > 0
    assert not (tmp_path / "profiles").exists()  # nothing won: no preset


@pytest.mark.slow
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


def _dead_inventory(path: Path) -> Path:
    """Two hosts behind a closed port: nothing answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path.mkdir(parents=True, exist_ok=True)
    (path / "hosts.toml").write_text(f'[cluster]\nname = "dead"\n[defaults]\ntransport = "ssh"\naddress = "127.0.0.1"\n'
                                     f'port = {port}\nuser = "nobody"\nworkdir = "{path}/w"\n'
                                     '[[host]]\nname = "h0"\n[[host]]\nname = "h1"\n')
    return path / "hosts.toml"


@pytest.mark.parametrize("case", ["profiles is a file", "a shipped name", "unreachable hosts"])
def test_a_tune_that_cannot_finish_is_refused_before_its_first_run(case: str, tmp_path: Path, pictl_env) -> None:
    """Each was found only at the end (a tune that measured everything crashed saving its preset into a file
    called profiles; --save-as lab6 shadowed the course preset unsaid) or with the wrong code (unreachable hosts
    exited 3): now one line, before any run, and no tune directory, run or preset left."""
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts, extra = write_cluster(tmp_path / "cluster", 2), []
    if case == "profiles is a file":
        (tmp_path / "profiles").write_text("")
        code, says = 2, f"--save-as tuned ({tmp_path}/profiles/tuned.toml): {tmp_path}/profiles is not a directory"
    elif case == "a shipped name":
        extra, code = ["--save-as", "lab6"], 2
        says = f"--save-as lab6: 'lab6' is a shipped preset, and {tmp_path}/profiles/lab6.toml would shadow it"
    else:
        hosts, code, says = _dead_inventory(tmp_path / "dead"), 4, "host 'h0' (127.0.0.1:"
    proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, *extra,
                      "--out", str(tmp_path / "tune")], env, timeout=120, cwd=tmp_path)
    assert proc.returncode == code, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"pictl: error: {says}"), proc.stderr
    assert "Traceback" not in proc.stderr
    if case != "unreachable hosts":  # refused before the first run was even tried
        assert "measuring" not in proc.stderr
    assert not (tmp_path / "tune").exists() and not list((tmp_path / "cluster").glob("h*/runs/*"))
    assert not (tmp_path / "profiles").is_dir() and not processes_under(tmp_path / "cluster")


def test_a_tune_whose_directory_is_on_a_full_disk_measures_nothing_and_says_so(tmp_path: Path, pictl_env) -> None:
    """A full disk before anything is measured is not exit 9 (measured but not written): tune.json is written
    before the first run, so the tune stops there, exit 2, one line naming the file, nothing left."""
    if os.geteuid() != 0:
        skip_loudly("NEEDS ROOT: a full filesystem is a tmpfs mounted for the test")
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        skip_loudly(f"CANNOT MOUNT A TMPFS: {mounted.stderr.strip()}")
    try:
        with (disk / "filler").open("wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        hosts = write_cluster(tmp_path / "cluster", 2)
        proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--out",
                          str(disk / "tune")], {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")},
                         timeout=120, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1] == (f"pictl: error: the tune directory {disk}/tune: cannot write "
                                                        "tune.json (No space left on device); nothing was measured")
        assert "measuring" not in proc.stderr and sorted(p.name for p in disk.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
