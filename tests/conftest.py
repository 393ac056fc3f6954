"""Shared fixtures: isolated run and cache dirs, a local cluster, the real SSH cluster (helpers: `support`)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.clusters import skip_loudly, write_cluster
from support.forked import PictlServer


@pytest.fixture
def pictl_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PICTL_RUNS_DIR=str(tmp_path / "runs"), PICTL_CACHE_DIR=str(tmp_path / "cache"),
               PICTL_PROFILES_DIR=str(tmp_path / "profiles"), COLUMNS="200")  # (never the user's own presets)
    return env


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    """A cache dir shared by a module's tests: long runs whose faults are in the pipeline measure the
    serial baseline once, not once per test."""
    return tmp_path_factory.mktemp("module-cache")


@pytest.fixture
def shared_cache_env(pictl_env: dict[str, str], module_cache: Path) -> dict[str, str]:
    return {**pictl_env, "PICTL_CACHE_DIR": str(module_cache)}


@pytest.fixture(scope="module")
def pictl_forks(tmp_path_factory) -> Iterator[PictlServer]:
    """`pictl` commands as processes forked from one that imported pictl once (`support.forked`): a module's many
    short commands (refused before anything runs) each spent most of its second importing."""
    server = PictlServer(tmp_path_factory.mktemp("forks"), {**os.environ, "COLUMNS": "200"})
    yield server
    server.close()


@pytest.fixture
def cluster4(tmp_path: Path) -> Path:
    return write_cluster(tmp_path / "cluster", 4)


@pytest.fixture(scope="session")
def ssh_cluster():
    """The real sshd cluster: 4 hosts in network namespaces as root, else on loopback ports."""
    from support.sshcluster import TAG, Unavailable, start_cluster

    try:
        cluster = start_cluster(4)
    except Unavailable as exc:
        skip_loudly(f"SSH TEST CLUSTER UNAVAILABLE ({exc})")
    yield cluster
    _kill_warm_roots(lambda cmd, user: user.startswith(f"pictl-{TAG}"))  # its logins' warm processes
    cluster.down()


@pytest.fixture(scope="session", autouse=True)
def _no_user_presets(tmp_path_factory) -> None:
    """Presets looked up in-process (unit tests) never come from the user's own presets directory."""
    os.environ["PICTL_PROFILES_DIR"] = str(tmp_path_factory.mktemp("user-presets"))


@pytest.fixture(scope="session", autouse=True)
def _warm_processes_end_with_the_session(tmp_path_factory):
    """The suite runs warm (as users do), so the hosts' warm processes outlive each test by design. This session's
    own local hosts' (their warm directory is the session's) end with it, and the SSH test hosts' with the SSH
    cluster (`ssh_cluster`), so that nothing of the suite's is left running; another session's or worker's, or
    a person's, are never touched (two test sessions at once on one machine each keep theirs)."""
    warm_dir = tmp_path_factory.mktemp("warm")
    os.environ["PICTL_WARM_DIR"] = str(warm_dir)  # every local host of the session (the controller's env)
    yield
    _kill_warm_roots(lambda cmd, user: str(warm_dir) in cmd)


def _kill_warm_roots(ours) -> None:
    """Kill the warm processes `ours(cmdline, user)` names (their jobs, if any, die with their parent)."""
    import pwd

    import psutil

    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "remote.host.warmroot --socket" not in cmd:
                continue
            try:
                user = pwd.getpwuid(proc.info["uids"].real).pw_name
            except (KeyError, AttributeError):
                user = ""
            if ours(cmd, user):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue


@pytest.hookimpl(tryfirst=True)  # (before xdist reads the groups into the test ids)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), a module's tests stay on one worker (its module-scoped cluster and
    baselines are made once), and every test of the one SSH test cluster runs on the same worker: the cluster
    is a machine-wide resource (network namespaces, logins), started once per session."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = "ssh-cluster" if "ssh_cluster" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test marked `alone` runs (setup, call and teardown, module fixtures included) while no other worker runs
    a test: it asserts on how the CPUs it loads itself are shared out, and another worker's test on the same two
    cores is load it did not make (ci 52: a twin of a sweep under toggled load fell below the serial run)."""
    with _turn(item.config, alone=item.get_closest_marker("alone") is not None):
        yield


@contextmanager
def _turn(config: pytest.Config, *, alone: bool) -> Iterator[None]:
    """A readers-writer lock shared by the session's xdist workers: every test holds it shared, an `alone` test
    exclusive. The gate is taken first by both, so a waiting `alone` test is not starved by the other worker's
    stream of shared holders."""
    if not hasattr(config, "workerinput"):  # one process: nothing else runs beside a test
        yield
        return
    folder = Path(config.option.basetemp).parent  # (the session's temporary root, every worker's own folder in it)
    with open(folder / "tests.gate", "a") as gate, open(folder / "tests.turn", "a") as turn:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
