"""Ctrl-C, SIGHUP, a killed controller, an unexpected error and a stolen port: every process stops, the
summary says what happened (a killed rank: `test_ssh.py`, on real hosts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.clusters import processes_under, write_cluster

pytestmark = pytest.mark.slow


TINY = "deit_tiny_patch16_224"
"""The faults are in the pipeline, not the model: a run whose serial baseline (measured again whenever other work
loaded the machine, as it does under two test workers) costs a quarter of DeiT-S's, where the run is stopped early."""


@pytest.fixture
def pictl_env(shared_cache_env: dict[str, str]) -> dict[str, str]:
    return shared_cache_env  # one serial baseline for the module: the faults are in the pipeline


def _start(tmp_path: Path, env: dict[str, str], model: str = TINY) -> tuple[subprocess.Popen, Path]:
    cluster = tmp_path / "cluster"
    write_cluster(cluster, 2)
    # A relative --hosts from another directory: the record must still find the inventory (`pictl traces`).
    # Cut before the last block, the pipeline takes about as long as the serial run, not half as long: as long a
    # pipeline as an equal cut's of twice the passes, after a serial baseline of half the images.
    proc = subprocess.Popen(
        [sys.executable, "-m", "pictl", "run", "--hosts", "cluster/hosts.toml", "--stages", "2", "--images", "20",
         "--warmup", "0", "--repeats", "6", "--split", "blocks.11", "--model", model, "--headless", "--json"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # stopped long before
    return proc, cluster


def _wait_for_pipeline_progress(env: dict[str, str], proc: subprocess.Popen, timeout: float = 180) -> Path:
    runs = Path(env["PICTL_RUNS_DIR"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for events in runs.glob("*/events/h1.jsonl"):
            if '"event":"progress"' in events.read_text():
                return events.parent.parent
        time.sleep(0.1)
    raise AssertionError("the pipeline never reported progress")


def _assert_nothing_left(cluster: Path) -> None:
    deadline = time.monotonic() + 10
    while processes_under(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, " ".join(p.cmdline())[:120]) for p in processes_under(cluster)]
    assert not left, f"processes left behind: {left}"


def test_a_killed_controller_leaves_nothing_running(tmp_path: Path, pictl_env) -> None:
    """SIGKILL gives pictl no chance to clean up: the supervisors see their pipe close and stop the ranks.
    Before that, `pictl traces` from another process grabs a trace of every rank of the live run, through the
    hosts alone (a job of its own on them, which leaves the run's processes alone). (DeiT-S: the run must outlast
    the grab.)"""
    proc, cluster = _start(tmp_path, pictl_env, model="deit_small_patch16_224")
    run_dir = _wait_for_pipeline_progress(pictl_env, proc)
    grab = subprocess.run([sys.executable, "-m", "pictl", "traces", "--steps", "1"], env=pictl_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert grab.returncode == 0, grab.stderr
    assert sorted(p.name for p in (run_dir / "traces").glob("*.json.gz")) == ["h0-rank0.json.gz", "h1-rank1.json.gz"]
    # One line says where the merged timeline is and how to open it.
    assert f'traces: open {run_dir / "traces" / "timeline.json"} at https://ui.perfetto.dev ("Open trace file")' in (
        grab.stdout), grab.stdout
    assert proc.poll() is None and processes_under(cluster)  # the run goes on
    proc.kill()
    proc.communicate(timeout=30)
    _assert_nothing_left(cluster)


def _host_state_is_clean(cluster: Path) -> None:
    """Leases free, no run directory left on any host."""
    for host in (p for p in cluster.glob("h*") if p.is_dir()):
        assert (host / "lease").read_text() == "", f"{host.name}: lease still held"
        assert not list((host / "runs").glob("*")), f"{host.name}: run directories left"


@pytest.mark.parametrize("signals", [[signal.SIGINT, signal.SIGINT], [signal.SIGHUP]], ids=["double-ctrl-c", "sighup"])
def test_every_ending_closes_the_record_after_the_hosts_confirm(tmp_path: Path, pictl_env, signals) -> None:
    """Ctrl-C stops every rank and writes the summary; a second Ctrl-C does not cut the clean-up short, and a
    closed terminal (SIGHUP) is a stop too."""
    proc, cluster = _start(tmp_path, pictl_env)
    run_dir = _wait_for_pipeline_progress(pictl_env, proc)
    assert len(processes_under(cluster)) >= 4  # two torchrun agents, two ranks
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.5)
    out, err = proc.communicate(timeout=60)
    left = [(p.pid, " ".join(p.cmdline())[:120]) for p in processes_under(cluster)]  # at once: no grace here
    assert proc.returncode == 130, err[-2000:]
    assert not left, f"pictl exited before the hosts confirmed: {left}"
    assert err.strip().splitlines()[-1].startswith("pictl: error: interrupted")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["serial_ips"] > 0 and summary["per_stage"]
    assert json.loads(out)["status"] == "interrupted"
    if len(signals) > 1:
        assert "SIGINT again: still stopping, waiting for every host to confirm" in err
    _host_state_is_clean(cluster)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["cluster"] == str(cluster / "hosts.toml")  # absolute: readable from any directory


def test_an_unexpected_error_still_closes_the_record_with_its_type_and_message(tmp_path: Path, pictl_env,
                                                                              module_cache: Path,
                                                                              monkeypatch) -> None:
    """Not one of pictl's errors (here a bug where the outputs are compared): the summary still says how the run
    ended, never `{}`. (A record file that cannot be written is not such an error any more: the run goes on and
    ends with exit 9, `test_hostile_host.py`.)"""
    import asyncio

    import pictl.run.session
    from pictl.inventory import load_cluster
    from pictl.planning.options import RunOptions
    from pictl.run.baselines import BaselineCache
    from pictl.run.session import RunSession

    async def broken(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise ZeroDivisionError("a bug comparing the outputs")

    monkeypatch.setattr(pictl.run.session, "collect_and_compare", broken)
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    # (the port test's protocol: one serial baseline for the two, where it still stands)
    options = RunOptions(stages=1, images=8, warmup=0, repeats=2, policy="equal", model=TINY)
    session = RunSession(cluster, options, runs_root=tmp_path / "runs",
                         baseline_cache=BaselineCache(module_cache / "baselines"))
    with pytest.raises(ZeroDivisionError):
        asyncio.run(session.run())
    summary = json.loads((tmp_path / "runs" / session.run_id / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["run_id"] == session.run_id
    assert summary["error"]["type"] == "ZeroDivisionError" and "comparing the outputs" in summary["error"]["message"]
    _assert_nothing_left(tmp_path / "cluster")
    _host_state_is_clean(tmp_path / "cluster")


def test_a_rendezvous_port_taken_before_torchrun_binds_it_is_replaced(tmp_path: Path, pictl_env, monkeypatch,
                                                                    module_cache: Path) -> None:
    """Another user's process binds the port between our check and torchrun's bind: the launch is
    stopped everywhere and made again on another port; the figures come from the second launch only."""
    import asyncio
    import socket

    import pictl.run.pipeline
    from pictl.events import Phase
    from pictl.inventory import load_cluster
    from pictl.planning.options import RunOptions
    from pictl.run.baselines import BaselineCache
    from pictl.run.session import RunSession

    thief = socket.socket()
    thief.bind(("", 0))
    thief.listen()
    stolen = thief.getsockname()[1]
    real = pictl.run.pipeline.master_port
    chosen: list[int] = []

    async def chosen_then_stolen(transport, wanted):  # noqa: ANN001, ANN202
        port = stolen if not chosen else await real(transport, wanted)
        chosen.append(port)
        return port

    monkeypatch.setattr(pictl.run.pipeline, "master_port", chosen_then_stolen)
    phases: list[str] = []
    cluster = load_cluster(write_cluster(tmp_path / "cluster", 2))
    session = RunSession(cluster, RunOptions(stages=2, images=8, warmup=0, repeats=2, policy="equal", model=TINY),
                         runs_root=tmp_path / "runs", baseline_cache=BaselineCache(module_cache / "baselines"),
                         on_event=lambda e: phases.append(e.message) if isinstance(e, Phase) else None)
    try:
        summary = asyncio.run(session.run())
    finally:
        thief.close()
    assert len(chosen) == 2 and chosen[0] == stolen != chosen[1]
    assert any(f"port {stolen} was taken on h0 before torchrun bound it" in m for m in phases), phases
    assert summary.status == "ok" and summary.outputs_match is True
    assert [st.microbatches for st in summary.per_stage] == [16, 16]  # one launch's passes, not two
    assert "EADDRINUSE" in (tmp_path / "runs" / session.run_id / "logs" / "h0.log").read_text()
    _assert_nothing_left(tmp_path / "cluster")
