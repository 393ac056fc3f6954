"""Symbolic links never lead pictl out of its own directories, and no record is read without a cap.

Each case plants a link where pictl creates, removes, writes or copies something (a host's workdir and its runs
directory, a sweep folder, a run's tracker folder), drives the real thing (the `pictl` CLI, the host modules run as
processes, the lease through its API), and checks that what the link points to is untouched (content, mtime,
existence) and that the one refusal line names the link. A huge events file (sparse: nothing of it is allocated
here) is read up to its cap, said in one note, with the process's peak memory bounded."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import ROOT, run_pictl
from support.clusters import write_cluster

from pictl.cluster.leases import release_all, take_leases
from pictl.cluster.transport import transport_for
from pictl.inventory import Host
from pictl.records.files import MAX_EVENTS_BYTES
from pictl.records.report import MAX_PLOT_BYTES
from remote.floor.records import encode
from remote.floor.run_records import Progress, Throughput

SUMMARY: dict[str, Any] = json.loads((ROOT / "tests" / "support" / "data" / "run_summary_two_stages.json").read_text())
RUN = "20261124-100000-s2-link"
OLD = time.time() - 2 * 3600  # older than the orphan sweep's age for a crashed run's directory


def _snapshot(path: Path) -> dict[str, Any]:
    """Everything about `path` a write, a removal or a mode change would alter (a directory: all below it)."""
    if not path.exists():
        return {}
    items = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns, p.stat().st_mode,
                                        p.read_bytes() if p.is_file() else sorted(c.name for c in p.iterdir()))
            for p in items}


def _outside(tmp_path: Path) -> tuple[Path, Path]:
    """A secret file (0600, like a key) and an old directory with a file, outside every pictl directory."""
    secret = tmp_path / "outside" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot for a report\n")
    secret.chmod(0o600)
    old = tmp_path / "outside" / "old-dir"
    old.mkdir()
    (old / "thesis.tex").write_text("years of work\n")
    for p in (old / "thesis.tex", old, secret):
        os.utime(p, (OLD, OLD))
    return secret, old


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pictl: error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _pictl(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_pictl(args, {**(env or os.environ), "PICTL_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "300"},
                     120, cwd=tmp_path)


def _host_module(module: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A host module as the hosts run it (`python -m`, the pushed code on PYTHONPATH)."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd or ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


# -- a host's workdir ----------------------------------------------------------------------------------------


def test_the_orphan_sweep_refuses_a_runs_directory_that_is_a_link(tmp_path: Path) -> None:
    """The issue's case: `<workdir>/runs` a link, and the sweep removed a 2-hour-old directory it led to."""
    _, old = _outside(tmp_path)
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / "runs").symlink_to(old.parent)
    before = _snapshot(old.parent)
    for args in (["--orphans-only", "--keep", "current"], ["--finish", "old-dir"], []):
        proc = _host_module("remote.host.cleanup", "--workdir", str(workdir), *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        said = json.loads(proc.stdout.strip().splitlines()[-1])
        assert said["error"].startswith(f"{workdir}/runs is a symbolic link"), said
    assert _snapshot(old.parent) == before


def test_the_orphan_sweep_never_follows_a_link_among_the_run_directories(tmp_path: Path) -> None:
    """A link inside `runs` (to an old directory elsewhere) is neither followed nor removed; a crashed run's own
    old directory beside it still is."""
    _, old = _outside(tmp_path)
    runs = tmp_path / "workdir" / "runs"
    (runs / "crashed").mkdir(parents=True)
    (runs / "planted").symlink_to(old)
    (old / "pgid-1").write_text("999999999\n")  # a record in the outside directory: never read, never removed
    os.utime(old, (OLD, OLD))
    os.utime(runs / "crashed", (OLD, OLD))
    before = _snapshot(old)
    proc = _host_module("remote.host.cleanup", "--workdir", str(runs.parent), "--orphans-only", "--keep", "current")
    swept = json.loads(proc.stdout)
    assert proc.returncode == 0 and swept["removed"] == ["crashed"] and swept["stale"] == 0, swept
    assert {"run": "planted", "reason": "a symbolic link: not followed"} in swept["kept"]
    proc = _host_module("remote.host.cleanup", "--workdir", str(runs.parent), "--finish", "planted")
    assert proc.returncode == 0 and json.loads(proc.stdout)["removed"] == []
    assert (runs / "planted").is_symlink() and _snapshot(old) == before


def test_the_supervisor_never_writes_its_record_through_a_link(tmp_path: Path) -> None:
    """A link left at the supervisor's temporary name (a crash, or planted) is replaced, its target untouched."""
    secret, _ = _outside(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pgid-x.tmp").symlink_to(secret)
    before = _snapshot(secret)
    child = ("import pathlib, time\nwhile not pathlib.Path('pgid-x').exists(): time.sleep(0.02)\n"
             "print(pathlib.Path('pgid-x').read_text().strip())")
    # (stdin held open: its end is the supervisor's signal to stop its command)
    proc = subprocess.Popen([sys.executable, "-m", "remote.host.supervise", "--pgid-file", "pgid-x", "--",
                             sys.executable, "-c", child], cwd=run_dir, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip().isdigit()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.communicate()
    assert _snapshot(secret) == before and not (run_dir / "pgid-x.tmp").exists()


@pytest.mark.parametrize("name", ["lease", "runs", "code"])
def test_push_refuses_a_workdir_with_a_link_of_pictls_own(name: str, tmp_path: Path) -> None:
    """`<workdir>/lease` a link: the lease truncated the file it pointed to. `runs` or `code` a link: the run
    directories or the pushed code would land outside. Refused before anything is pushed, naming the link."""
    secret, old = _outside(tmp_path)
    inventory = write_cluster(tmp_path / "cluster", 1)
    workdir = tmp_path / "cluster" / "h0"
    workdir.mkdir()
    target = secret if name == "lease" else old
    (workdir / name).symlink_to(target)
    before = _snapshot(target)
    proc = _pictl(["--hosts", str(inventory), "push"], tmp_path)
    assert proc.returncode == 6, proc.stderr
    line = _one_error(proc)
    assert line.startswith(f"pictl: error: host 'h0': {workdir}/{name} is a symbolic link"), line
    assert _snapshot(target) == before
    assert sorted(p.name for p in workdir.iterdir()) == [name]  # nothing else made in the workdir either


def test_stop_refuses_a_runs_directory_that_is_a_link(tmp_path: Path) -> None:
    """`pictl stop` sweeps without a lease: its host says the runs directory is a link, and nothing is removed."""
    _, old = _outside(tmp_path)
    inventory = write_cluster(tmp_path / "cluster", 1)
    assert _pictl(["--hosts", str(inventory), "push"], tmp_path).returncode == 0  # the code the sweep runs
    (tmp_path / "cluster" / "h0" / "runs").symlink_to(old.parent)
    before = _snapshot(old.parent)
    proc = _pictl(["--hosts", str(inventory), "stop"], tmp_path)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert f"{tmp_path}/cluster/h0/runs is a symbolic link" in proc.stderr, proc.stderr
    assert _snapshot(old.parent) == before


def test_the_lease_holder_shows_a_short_command_line(tmp_path: Path) -> None:
    """The lease script comes on stdin: `ps` shows a line of a few hundred characters, not the script."""
    host = Host(name="h0", transport="local", workdir=str(tmp_path / "w"))

    async def hold() -> tuple[dict[str, Any], str]:
        leases = await take_leases([transport_for(host)], "run-cmdline", check_python=False)
        try:
            record = leases[0].record
            return record, Path(f"/proc/{record['pid']}/cmdline").read_bytes().decode()
        finally:
            await release_all(leases)

    record, cmdline = asyncio.run(hold())
    assert record["run_id"] == "run-cmdline" and "remote.host.lease" in cmdline
    assert len(cmdline) < 400 and "fcntl" not in cmdline, cmdline  # (the script itself is ~5 KB)
    assert (tmp_path / "w" / "lease").read_text() == ""  # released: emptied for the next run


# -- a sweep folder, a run's record ---------------------------------------------------------------------------


def _sweep(tmp_path: Path) -> Path:
    sweep = tmp_path / "received-sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"rows": [], "options": {}}))
    (sweep / "table.md").write_text("| stages | speedup |\n|---|---|\n| 2 | 1.9 |\n")
    (sweep / "speedup.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    return sweep


@pytest.mark.parametrize("name", ["table.md", "secret.png"])
def test_report_refuses_a_link_in_a_sweep_folder(name: str, tmp_path: Path) -> None:
    """A sweep folder from someone else with `table.md` or a `*.png` linked to the reader's key file: the report
    would have carried the key. Refused before anything is written, naming the link."""
    secret, _ = _outside(tmp_path)
    sweep = _sweep(tmp_path)
    (sweep / name).unlink(missing_ok=True)
    (sweep / name).symlink_to(secret)
    before = _snapshot(secret)
    proc = _pictl(["report", str(sweep), "--out", str(tmp_path / "report")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert _one_error(proc) == f"pictl: error: {sweep}/{name} is a symbolic link (pictl never follows links in its " \
                               "own directories)"
    assert _snapshot(secret) == before
    out = tmp_path / "report"
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in out.rglob("*") if p.is_file()) if out.exists() else True
    assert not (out / "report.md").exists()


def test_report_leaves_out_a_plot_too_large_to_be_one(tmp_path: Path) -> None:
    """A 300 MB "png" (sparse: nothing allocated) is not copied, and one note says so; the rest is reported."""
    sweep = _sweep(tmp_path)
    with (sweep / "huge.png").open("wb") as fh:
        fh.truncate(300 * 2**20)
    proc = _pictl(["report", str(sweep), "--out", str(tmp_path / "report")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"pictl: note: {sweep}/huge.png: more than {MAX_PLOT_BYTES >> 20} MiB, no plot pictl drew: not copied" \
        in proc.stderr.splitlines()
    written = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert written == ["received-sweep-speedup.png", "report.md"], written
    assert "huge" not in (tmp_path / "report" / "report.md").read_text()


def _run_record(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / RUN
    (run / "events").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps({**SUMMARY, "run_id": RUN, "run_dir": str(run)}))
    return run


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_track_refuses_a_tracker_folder_that_is_a_link(tracker: str, tmp_path: Path) -> None:
    _, old = _outside(tmp_path)
    run = _run_record(tmp_path)
    (run / tracker).symlink_to(old)
    before = _snapshot(old)
    proc = _pictl(["track", RUN, "--to", tracker], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{run}/{tracker} is a symbolic link (pictl never follows links in its own directories)" in \
        _one_error(proc)
    assert _snapshot(old) == before


MEASURED = ("import runpy, sys\nsys.argv[0] = 'pictl'\n"
            "try:\n    runpy.run_module('pictl', run_name='__main__')\n"
            "finally:\n    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "    print('maxrss_kb', hwm, file=sys.stderr)\n")
"""`python -m pictl` that says its peak resident memory as it exits: VmHWM, this program's own (getrusage's
ru_maxrss also keeps the high-water mark of the process it was forked from, before the exec: a test suite that
has grown to a gigabyte read as a gigabyte here)."""


def test_a_huge_events_file_is_read_up_to_its_cap(tmp_path: Path) -> None:
    """A 1 GiB events file made `report` and `track` allocate 2.2 GB. Its records before the cap are read (the
    link's fastest pass, the pass's img/s in TensorBoard), the rest skipped with one note, and each command's
    peak memory stays far below the file's size."""
    from support.trackers import tensorboard_scalars

    run = _run_record(tmp_path)
    events = run / "events" / "local0.jsonl"
    lines = [encode(Throughput(rank=0, repeat=0, images=20, seconds=2.0, ips=10.0)),
             encode(Progress(rank=0, phase="timed", repeat=0, microbatches=4, microbatches_total=4, compute_s=1.0,
                             wait_s=0.0, send_s=0.0, bytes_sent=40_000_000))]
    with events.open("w") as fh:
        fh.write("".join(line + "\n" for line in lines))
        fh.truncate(2**30)  # a hole: no disk, no memory
    note = (f"pictl: note: {events}: only its first {MAX_EVENTS_BYTES >> 20} MiB read (it holds 1,073,741,824 "
            "bytes); the rest was skipped")
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "300"}
    for args in (["report", RUN, "--out", str(tmp_path / "report")], ["track", RUN, "--to", "tensorboard"]):
        proc = subprocess.run([sys.executable, "-c", MEASURED, *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert note in proc.stderr.splitlines(), proc.stderr
        peak_kb = int(proc.stderr.rsplit("maxrss_kb ", 1)[1].split()[0])
        assert peak_kb < 400_000, (args, peak_kb)  # the file is 1 GiB; what it reads of it at once, 1 MiB
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| local0 (rank 0) -> rank 1 | " in report and "| 20.0 |" in report, report
    assert "only its first 64 MiB read" in report  # the report says it too
    assert tensorboard_scalars(run / "tensorboard")["pipeline/pass_ips"] == [(0, 10.0)]
