"""`pictl tune` for real on a local cluster under toggled load: it screens the pipeline over every host and the
best predicted, measures the finalists in rounds against one serial reference, prints an 80-column table, draws
its plot, saves the winner the rounds name as a preset that `pictl run --profile` reproduces, and every run is a
run `pictl runs` lists with its tune; interrupted, it keeps what it measured and says so. What can
refuse a tune (where its preset goes, a shipped name, a full disk, unreachable hosts) refuses it before its
first run: one line, the documented exit code, nothing left behind."""

from __future__ import annotations

import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import run_pictl
from support.clusters import processes_under, write_cluster
from support.disks import fill, small_tmpfs
from support.load import ToggledLoad

from pictl.planning.options import RunOptions
from pictl.planning.presets import resolve_options

FAST = ["--images", "4", "--chunk", "1", "--warmup", "0", "--repeats", "1"]


@pytest.mark.slow
def test_a_tune_under_toggled_load_saves_the_fastest_under_interleaving_and_its_runs_are_runs(
        tmp_path: Path, shared_cache_env) -> None:
    """Two local hosts (1x2 and 2x1 besides the serial run), a busy loop on one CPU switched on and off all along.
    The finalists and the reference are measured in 3 alternating rounds (a fixed count: the test's time); every
    figure is the runs' own (each found by id); the winner is the one the rounds' medians and verdicts name (the
    top, or the simplest of a tie with it, and faster than the serial run beyond the noise), saved as a preset
    that `pictl run --profile` reproduces; every run is listed by `pictl runs` with its tune and round, and the
    tune said `[k/n]` for each as it ended."""
    env = shared_cache_env
    hosts, runs = write_cluster(tmp_path / "cluster", 2), tmp_path / "runs"
    with ToggledLoad(on_s=(2.0, 2.0), off_s=(3.5, 3.5)) as load:  # (never in step with the tune's runs)
        proc = run_pictl(["tune", "--hosts", str(hosts), "--runs-dir", str(runs), *FAST, "--threads", "1",
                          "--measure", "2", "--max-rounds", "3", "--out", str(tmp_path / "tune"), "--json"], env,
                         timeout=900, cwd=tmp_path)
    assert load.switches >= 4, load.switches  # the load came and went during the tune
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "done" and "error" not in out and out["reference"]["host"] == "h0"
    rows = {(r["replicas"], r["stages"]): r for r in out["rows"]}
    assert set(rows) == {(1, 1), (1, 2), (2, 1)} and all(r["threads"] == 1 and r["chunk"] == 1 for r in out["rows"])
    serial = rows[(1, 1)]
    assert serial["reference"] and serial["screening_ips"] == rows[(1, 2)]["serial_ips"]  # the first run's serial run
    finalists = [r for r in out["rows"] if r["rounds"] and not r["reference"]]
    assert {(r["replicas"], r["stages"]) for r in finalists} <= {(1, 2), (2, 1)} and finalists
    # Every round measured the reference first, then the finalists, in alternating order; each figure is what that
    # run's own record says (the runs are in the runs root, found by id).
    summaries = {p.name: json.loads((p / "summary.json").read_text()) for p in runs.iterdir()}
    reference_runs = {r["round"]: r for r in serial["rounds"]}
    assert len(reference_runs) >= 3 and all(len(r["rounds"]) >= 3 for r in finalists if r["kept"])
    orders = {}
    for k, ref in reference_runs.items():
        mine = summaries[ref["run_id"]]
        assert (mine["stages"], mine["replicas"], mine["throughput_ips"]) == (1, 1, ref["ips"])
        assert mine["baseline"]["reused"] is False  # measured in its round, never a cached baseline
        measured = sorted(((summaries[x["run_id"]]["started_at"], r["candidate"], x) for r in finalists
                           for x in r["rounds"] if x["round"] == k), key=lambda t: t[0])
        assert all(started > mine["started_at"] for started, _, _ in measured)
        assert all(x["ips"] == summaries[x["run_id"]]["throughput_ips"] and x["reference_ips"] == ref["ips"]
                   for _, _, x in measured)
        orders[k] = [name for _, name, _ in measured]
    if all(len(orders[k]) == 2 for k in (1, 2, 3)):  # (a finalist whose run failed left the rounds)
        assert orders[2] == orders[1][::-1] and orders[3] == orders[1], orders
    # A finalist's figure: the median over its rounds of its img/s over its round's reference.
    for r in finalists:
        ratios = sorted(x["ips"] / x["reference_ips"] for x in r["rounds"])
        assert r["speedup_vs_fp32"] == pytest.approx(statistics.median(ratios), abs=1e-3)
    # The winner: the top by that median, or the simplest of a tie with it; faster than the serial run beyond the
    # noise. Nothing saved otherwise (exit 3), and the decision says why.
    kept = sorted((r for r in finalists if r["kept"]), key=lambda r: -r["speedup_vs_fp32"])
    decision = out["decision"]
    win = out["winner"]
    if win is None:
        assert proc.returncode == 3 and "nothing saved as tuned" in proc.stderr and "nothing is saved" in decision[-1]
        assert not (tmp_path / "profiles" / "tuned.toml").exists()
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert win["won"] and win["kept"] and win["exact"] and win["interval"][0] > 1.0
        top = kept[0]
        if win["candidate"] != top["candidate"]:  # a tie with the top: the simpler one, said so
            assert f"tied within noise with {top['candidate']}" in decision[-1] and win["stages"] < top["stages"]
        else:
            assert decision[-1].startswith(f"winner: {top['candidate']}")
        # Saved in the user's presets directory with the user's protocol (no --profile: pictl run's defaults), not
        # the tune's FAST one; the run below measures briefly again, the configuration the preset's.
        saved = resolve_options("tuned", {}, extra=Path(env["PICTL_PROFILES_DIR"]))
        assert (saved.images, saved.warmup, saved.repeats) == (RunOptions().images, RunOptions().warmup,
                                                               RunOptions().repeats)
        again = run_pictl(["run", "--hosts", str(hosts), "--runs-dir", str(runs), "--profile", "tuned", *FAST,
                           "--headless", "--json"], env, cwd=tmp_path)
        assert again.returncode in (0, 7), again.stderr[-3000:]  # (7: suspect under a busy machine)
        s = json.loads(again.stdout)
        assert (s["replicas"], s["stages"], s["profile"]) == (win["replicas"], win["stages"], "tuned")
        assert s["split_points"] == win["split_points"] and s["outputs_match"] is True
    table = (tmp_path / "tune" / "table.md").read_text()
    assert all(len(line) <= 80 for line in table.splitlines()) and "| 1x1           |" in table
    assert (tmp_path / "tune" / "tune.png").stat().st_size > 10_000
    # One line per run as it ended, k counting up; and every run the tune made is one `pictl runs` lists.
    ids = {serial["run_id"], *(x["run_id"] for r in out["rows"] for x in r["rounds"]),
           *(r["run_id"] for r in out["rows"] if r["run_id"])}
    lines = [line for line in proc.stderr.splitlines() if re.match(r"pictl tune: \[\d+/\d+\] ", line)]
    assert [int(re.search(r"\[(\d+)/", line)[1]) for line in lines] == list(range(1, len(ids) + 1))
    assert all(re.search(r": [\d.]+ img/s, [\d.]+x, (outputs identical|not kept)", line) for line in lines), lines
    listed = run_pictl(["runs", "--runs-dir", str(runs), "--json", "--limit", "200"], env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert ids <= {row["run_id"] for row in json.loads(listed.stdout)} and ids == set(summaries)
    part_of = {row["run_id"]: row["part_of"] for row in json.loads(listed.stdout)}
    for k, ref in reference_runs.items():  # each run names the tune, its round and its role
        assert part_of[ref["run_id"]] == f"tune tune r{k} ref"
        assert summaries[ref["run_id"]]["part_of"] == {"kind": "tune", "name": "tune", "dir": str(tmp_path / "tune"),
                                                       "round": k, "role": "reference", "configuration": "1x1"}
    for r in finalists:
        assert all(part_of[x["run_id"]] == f"tune tune r{x['round']}" for x in r["rounds"])
        assert part_of[r["run_id"]] == "tune tune"  # its screening run (no round)
    shown = run_pictl(["runs", "show", reference_runs[1]["run_id"], "--runs-dir", str(runs), "--json"], env,
                      cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)["throughput_ips"] == reference_runs[1]["ips"]
    # The hosts were held once for the whole tune: connected, leased and the code pushed before its first run, each
    # run's start-up saying so (no connect or push of its own).
    pushes = [line for line in proc.stderr.splitlines() if re.match(r"pictl push: .*(pushed to|code up to date on)",
                                                                     line)]
    assert len(pushes) == 1, pushes
    assert all(s["startup"]["hosts_held_by"] == "tune tune" for s in summaries.values() if s["startup"])


@pytest.mark.slow
def test_an_interrupted_tune_keeps_what_it_measured(tmp_path: Path, shared_cache_env) -> None:
    # The module's cache: the hosts' cost profiles the tune above measured (the same hosts, model, chunk and
    # threads; a profile's key is the host, not its work directory), so this tune's first run starts measuring
    # at once. What it keeps when interrupted is the subject, not the profiling.
    env = shared_cache_env
    hosts = write_cluster(tmp_path / "cluster", 2)
    out = tmp_path / "tune"
    proc = subprocess.Popen([sys.executable, "-m", "pictl", "tune", "--hosts", str(hosts), "--runs-dir",
                             str(tmp_path / "runs"), *FAST, "--threads", "1", "--measure", "3", "--out",
                             str(out)],
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
def test_a_tune_of_a_model_timm_does_not_have_is_refused_as_bad_input(tmp_path: Path, pictl_env, pictl_forks) -> None:
    """Its first run's profiling finds the model missing: one line, exit 2, no preset, no run directory."""
    env = {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")}
    hosts = write_cluster(tmp_path / "cluster", 2)
    proc = pictl_forks.run(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--model",
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
def test_a_tune_that_cannot_finish_is_refused_before_its_first_run(case: str, tmp_path: Path, pictl_env,
                                                                    pictl_forks) -> None:
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
    proc = pictl_forks.run(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, *extra,
                            "--out", str(tmp_path / "tune")], env, timeout=120, cwd=tmp_path)
    assert proc.returncode == code, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"pictl: error: {says}"), proc.stderr
    assert "Traceback" not in proc.stderr
    if case != "unreachable hosts":  # refused before the first run was even tried
        assert "measuring" not in proc.stderr
    assert not (tmp_path / "tune").exists() and not list((tmp_path / "cluster").glob("h*/runs/*"))
    assert not (tmp_path / "profiles").is_dir() and not processes_under(tmp_path / "cluster")


def test_a_tune_whose_directory_is_on_a_full_disk_measures_nothing_and_says_so(tmp_path: Path, pictl_env,
                                                                               pictl_forks) -> None:
    """A full disk before anything is measured is not exit 9 (measured but not written): tune.json is written
    before the first run, so the tune stops there, exit 2, one line naming the file, nothing left."""
    with small_tmpfs(tmp_path / "small") as disk:
        fill(disk)
        hosts = write_cluster(tmp_path / "cluster", 2)
        proc = pictl_forks.run(["tune", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"), *FAST, "--out",
                                str(disk / "tune")], {**pictl_env, "PICTL_CACHE_DIR": str(tmp_path / "cache")},
                               timeout=120, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1] == (f"pictl: error: the tune directory {disk}/tune: cannot write "
                                                        "tune.json (No space left on device); nothing was measured")
        assert "measuring" not in proc.stderr and sorted(p.name for p in disk.iterdir()) == ["filler"]
