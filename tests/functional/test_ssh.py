"""Real SSH hosts (Debian's sshd in network namespaces): runs, host keys, errors, cleanup."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.cli import ROOT, finished, run_pictl
from support.clusters import assert_hosts_clean, dead_endpoint, host_processes, require_netns

from pictl.cluster.transport.ssh import SshTransport
from pictl.errors import TransportError
from pictl.inventory import load_cluster

pytestmark = pytest.mark.slow
FAST = ["--images", "6", "--warmup", "0", "--repeats", "1", "--headless", "--json", "--policy", "equal"]


def _cmdline(p: psutil.Process) -> str:
    return " ".join(p.info["cmdline"] or [])


def test_four_host_run_over_ssh_matches_serial(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    """Explicit ranks (h3 runs stage 0), workdirs with a space and a quote, a chosen free master port; the
    4 stages' output equals the serial run's, and the traced steps line up on the common clock."""
    odd = "odd dir 'q'"
    inv = ssh_cluster.variant(tmp_path / "hosts.toml", hosts={
        i: {"rank": 3 - i, "workdir": f"{ssh_cluster.workdir_spec(i)}/{odd}"} for i in range(4)})
    proc = run_pictl(["run", "--hosts", str(inv), "--stages", "4", "--trace-steps", "4", "--master-port", "29877",
                      *FAST], pictl_env)
    assert finished(proc.returncode, proc.stderr), proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["outputs_match"] is True and s["max_abs_diff"] == 0.0 and s["speedup"] > 0
    assert [st["host"] for st in s["per_stage"]] == ["h3", "h2", "h1", "h0"]
    assert all(st["bytes_sent"] > 0 for st in s["per_stage"][:3])
    assert f"rendezvous {ssh_cluster.address(3)}:29877" in proc.stderr
    assert (ssh_cluster.workdir(3) / odd / "code" / "remote" / "runtime" / "pipeline.py").is_file()
    startup = s["startup"]
    parts = [v for k, v in startup.items() if k.endswith("_s") and k != "total_s"]
    assert startup["total_s"] == pytest.approx(sum(parts), abs=0.01)
    _assert_merged_timeline_orders_sends_before_receives(Path(s["traces"][0]["directory"]), steps=4)
    assert_hosts_clean(ssh_cluster)


def _assert_merged_timeline_orders_sends_before_receives(grab: Path, steps: int) -> None:
    """On the merged time axis (each host's clock measured against ours), for every microbatch, the send on
    rank r starts before the matching receive on rank r+1 completes."""
    clocks = json.loads((grab / "summary.json").read_text())["clocks"]
    assert len(clocks) == 4 and all(c["uncertainty_ns"] < 2_000_000 for c in clocks.values()), clocks
    events = json.loads((grab / "timeline.json").read_text())["traceEvents"]
    compute = {(e["pid"], int(e["name"].split()[1])): e for e in events
               if e.get("ph") == "X" and e["name"].startswith("pictl:compute")}
    mbs = sorted({step for _, step in compute})
    assert len(mbs) == steps and all((r, m) in compute for r in range(4) for m in mbs)

    def spans(rank: int, name: str) -> list[tuple[float, float]]:
        return sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["pid"] == rank and e.get("name") == name)

    for r in range(3):
        # c10d::recv_ only posts a receive; it completes when gloo's wait for the data (gloo:recv) ends.
        sends, recvs = spans(r, "c10d::send"), spans(r + 1, "gloo:recv")
        for m in mbs:
            produced, consumed = compute[(r, m)], compute[(r + 1, m)]
            # the send that follows rank r's compute of microbatch m, the receive that precedes rank r+1's
            send = next(s for s in sends if s[0] >= produced["ts"] + produced["dur"])
            recv = max((v for v in recvs if v[1] <= consumed["ts"]), key=lambda v: v[1])
            assert send[0] < recv[1], f"microbatch {m}: rank {r} sends at {send[0]} us, after rank {r + 1} " \
                                      f"finished receiving it at {recv[1]} us"


def test_unknown_host_key_is_refused_until_trusted(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = ssh_cluster.variant(tmp_path / "hosts.toml", defaults={"known_hosts": str(empty)})
    proc = run_pictl(["run", "--hosts", str(inv), "--stages", "1", *FAST], pictl_env)
    assert proc.returncode == 4
    assert f"host 'h0' ({ssh_cluster.endpoint(0)}): host key not trusted" in proc.stderr
    assert "pictl trust h0" in proc.stderr
    trusted = run_pictl(["trust", "h0", "--hosts", str(inv), "--yes"], pictl_env)
    assert trusted.returncode == 0, trusted.stderr
    entry = ssh_cluster.address(0) if ssh_cluster.port(0) == 22 else f"[{ssh_cluster.address(0)}]:{ssh_cluster.port(0)}"
    assert empty.read_text().startswith(f"{entry} ssh-ed25519 ")
    assert empty.read_text().split()[2] == (ssh_cluster.state / "host0" / "host_key.pub").read_text().split()[1]


def test_changed_host_key_is_refused(ssh_cluster, tmp_path: Path) -> None:
    wrong = (ssh_cluster.state / "known_hosts").read_text().splitlines()
    wrong[0] = wrong[0].split()[0] + " " + " ".join(wrong[1].split()[1:])  # h1's key claimed for h0
    (tmp_path / "kh").write_text("\n".join(wrong) + "\n")
    host = load_cluster(ssh_cluster.inventory).hosts[0].model_copy(update={"known_hosts": str(tmp_path / "kh")})
    with pytest.raises(TransportError, match="host key not trusted.*pictl trust h0"):
        asyncio.run(SshTransport(host).connect())


@pytest.mark.parametrize("case", ["wrong user", "dead host"])
def test_bad_hosts_are_named(ssh_cluster, pictl_env, tmp_path: Path, case: str) -> None:
    if case == "wrong user":
        inv = ssh_cluster.variant(tmp_path / "hosts.toml", hosts={2: {"user": "nobody-here"}})
        fragment = f"host 'h2' ({ssh_cluster.endpoint(2)}): authentication failed"
    else:
        dead = dead_endpoint(ssh_cluster)
        inv = ssh_cluster.variant(tmp_path / "hosts.toml", hosts={3: dead})
        where = dead.get("address", "127.0.0.1") + (f":{dead['port']}" if "port" in dead else "")
        fragment = f"host 'h3' ({where}): unreachable"
    start = time.monotonic()
    proc = run_pictl(["run", "--hosts", str(inv), "--stages", "4", *FAST], pictl_env)
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert fragment in proc.stderr.strip().splitlines()[-1]
    assert time.monotonic() - start < 30  # connect timeout, not a hang


def test_shell_metacharacters_in_paths_are_never_run(ssh_cluster, tmp_path: Path) -> None:
    """A workdir or value that would create a file if a shell ever saw it unquoted."""
    marker = Path(f"/tmp/pictl-injected-{time.time_ns()}")
    nasty = f"~/we ird'$(touch {marker})';touch {marker}"
    host = load_cluster(ssh_cluster.inventory).hosts[1]

    async def go() -> str:
        t = SshTransport(host)
        await t.connect()
        try:
            await t.put_bytes(b"hello", f"{nasty}/file.txt")
            result = await t.run(["cat", "file.txt"], cwd=nasty, env={"X": f"$(touch {marker})"})
            echo = await t.run(["printenv", "X"], env={"X": f"`touch {marker}`"})
            await t.remove_tree(nasty)
            return result.stdout + "|" + echo.stdout
        finally:
            await t.close()

    out = asyncio.run(go())
    assert out == f"hello|`touch {marker}`"
    assert not marker.exists()


LONG_RUN_IMAGES = 12
"""Images a pass of the runs these tests stop or break mid-way (3 timed passes at the cluster's 0.4 core)."""


def _start_long_run(cluster, env: dict[str, str], *extra: str, inventory: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", str(inventory or cluster.inventory),
                             "--stages",
                             "4", "--images", str(LONG_RUN_IMAGES), "--warmup", "0", "--repeats", "3", "--policy",
                             "equal", "--headless", "--json", *extra],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_progress(env: dict[str, str], proc: subprocess.Popen, source: str = "h3") -> Path:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for events in Path(env["PICTL_RUNS_DIR"]).glob(f"*/events/{source}.jsonl"):
            if '"event":"progress"' in events.read_text():
                return events.parent.parent
        time.sleep(0.5)
    raise AssertionError("no progress from the pipeline")


def test_killed_rank_on_one_host_stops_every_host(ssh_cluster, shared_cache_env) -> None:
    """Cold (every process its own interpreter, as before warm processes): the cold path stays covered, and the
    rank killed is the rank itself (a warm rank is a forked child behind its client)."""
    proc = _start_long_run(ssh_cluster, shared_cache_env, "--cold", "--on-host-loss", "fail")
    run_dir = _wait_progress(shared_cache_env, proc)
    victims = [p for p in ssh_cluster.processes(2)
               if "remote.runtime.pipeline" in _cmdline(p) and "torch.distributed.run" not in _cmdline(p)]
    assert len(victims) == 1
    killed_at = time.monotonic()
    victims[0].kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert (summary["error"]["host"], summary["error"]["rank"], summary["error"]["type"]) == ("h2", 2, "HostLost")
    assert "h2 lost; the run cannot continue: --on-host-loss fail" in err
    assert "host 'h2' rank 2" in err.strip().splitlines()[-1]
    assert summary["error"]["last_lines"], "the failing host's last lines are kept"
    assert_hosts_clean(ssh_cluster)
    assert time.monotonic() - killed_at < 40


def test_a_host_whose_link_is_cut_mid_run_is_lost_and_the_run_finishes_on_the_three_left(ssh_cluster,
                                                                                         shared_cache_env) -> None:
    """h2's network interface goes down during the second timed pass (a pulled cable: no reset, no word): its
    connection's keepalives (2 s apart here: `keepalive_s`) go unanswered, the run names it lost and goes on with 3
    stages on h0, h1, h3, its outputs still the serial run's; once the link is back, nothing of ours is left on h2
    either."""
    require_netns(ssh_cluster, "network namespaces whose interface can be cut")
    wired = ssh_cluster.variant(Path(shared_cache_env["PICTL_RUNS_DIR"]).parent / "wired.toml",
                                defaults={"keepalive_s": 2})
    proc = _start_long_run(ssh_cluster, shared_cache_env, inventory=wired)
    deadline = time.monotonic() + 240
    while not any('"event":"throughput"' in e.read_text()
                  for e in Path(shared_cache_env["PICTL_RUNS_DIR"]).glob("*/events/h3.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    ssh_cluster.set_link(2, up=False)
    cut_at = time.time()
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        ssh_cluster.set_link(2, up=True)
    assert finished(proc.returncode, err), err[-3000:]
    s = json.loads(out)
    assert s["status"] == "ok" and s["outputs_match"] is True and s["stages"] == 3
    loss = s["host_lost"][0]
    assert (loss["host"], loss["completed_passes"], loss["hosts_after"]) == ("h2", 1, ["h0", "h1", "h3"]), loss
    assert loss["message"].startswith("the host stopped answering: its connection was lost"), loss
    assert [seg["hosts"] for seg in s["segments"]] == [["h0", "h1", "h2", "h3"], ["h0", "h1", "h3"]]
    assert sum(seg["images"] for seg in s["segments"]) == LONG_RUN_IMAGES * 3 and len(s["pass_ips"]) == 3
    # The end names the host and the time the loss cost; a silent host is known by its unanswered keepalives (3 of
    # them, 2 s apart), then the run goes on within seconds.
    assert re.search(r"h2 lost \(.*\): \d+\.\d s to the next segment's first output", err), err[-3000:]
    assert 4 < loss["failed_at"] - cut_at < 40 and 0 < loss["replan_s"] <= loss["lost_s"] < 60, (cut_at, loss)
    assert_hosts_clean(ssh_cluster, timeout=90)


def test_killed_controller_leaves_nothing_on_any_host(ssh_cluster, shared_cache_env) -> None:
    proc = _start_long_run(ssh_cluster, shared_cache_env)
    _wait_progress(shared_cache_env, proc)
    assert host_processes(ssh_cluster)
    proc.kill()  # the SSH connections drop; each host's supervisor sees EOF and stops its group
    proc.communicate(timeout=30)
    assert_hosts_clean(ssh_cluster)


def test_pictl_stop_removes_what_a_vanished_controller_left(ssh_cluster, pictl_env) -> None:
    from pictl.cluster.commands import cleanup_host, supervised

    assert run_pictl(["push", "--hosts", str(ssh_cluster.inventory)], pictl_env).returncode == 0
    host = load_cluster(ssh_cluster.inventory).hosts[1]
    hung = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"

    async def launch_orphan() -> tuple[dict, psutil.Process]:
        t = SshTransport(host)
        await t.connect()
        run_dir = f"{host.workdir}/runs/vanished"
        await t.makedirs(run_dir)
        await t.start(supervised(host, [host.python, "-c", hung], "pgid-test"), cwd=run_dir,
                      env={"PYTHONPATH": host.code_dir})
        await asyncio.sleep(1.0)
        swept = await cleanup_host(t, orphans_only=True)  # what every run does first
        procs = ssh_cluster.processes(1)
        supervisor = next(p for p in procs if "remote.host.supervise" in _cmdline(p))
        child = next(p for p in procs if p.ppid() == supervisor.pid)
        # The supervisor dies before it can stop anything (as under an OOM kill); the child ignores
        # the SIGTERM its parent's death sends: a true orphan.
        supervisor.kill()
        supervisor.wait(5)
        await t.close()
        return swept, child

    swept, child = asyncio.run(launch_orphan())
    assert swept["stopped"] == [] and len(swept["kept"]) == 1, swept  # its supervisor was alive: not an orphan
    time.sleep(1.0)
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    proc = run_pictl(["stop", "--hosts", str(ssh_cluster.inventory)], pictl_env)
    assert proc.returncode == 0, proc.stderr
    assert "h1: stopped 1 process group(s)" in proc.stdout and "h0: stopped 0" in proc.stdout
    assert_hosts_clean(ssh_cluster)


def _run_dirs_on_hosts(cluster) -> set[Path]:
    return {p for i in range(cluster.n) for p in (cluster.workdir(i) / "runs").glob("*")}


def test_master_port_in_use_is_refused_before_anything_starts(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    port = 29878
    before = _run_dirs_on_hosts(ssh_cluster)
    holder = subprocess.Popen([*ssh_cluster.exec_on(0), sys.executable, "-c",
                               "import socket, sys, time\ns = socket.socket()\n"
                               f"s.bind(('', {port}))\ns.listen()\nprint('ready', flush=True)\ntime.sleep(120)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        proc = run_pictl(["run", "--hosts", str(ssh_cluster.inventory), "--stages", "4", "--master-port", str(port),
                          *FAST], pictl_env)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"master_port: {port} is not free on host 'h0'" in last and "in use" in last
    assert not Path(pictl_env["PICTL_RUNS_DIR"]).exists() or not any(Path(pictl_env["PICTL_RUNS_DIR"]).iterdir())
    assert _run_dirs_on_hosts(ssh_cluster) <= before  # the spec files it had placed are gone again
    assert_hosts_clean(ssh_cluster)


def test_cpu_quota_emulates_a_slow_host(ssh_cluster) -> None:
    """A cgroup CFS quota on one host's sshd caps everything started through it."""
    require_netns(ssh_cluster, "cgroups")
    busy = "import time\nend = time.time() + 1.5\nwhile time.time() < end:\n    pass\nprint(time.process_time())\n"
    hosts = load_cluster(ssh_cluster.inventory).hosts

    async def cpu_seconds(host) -> tuple[float, float | None]:
        """CPU seconds a 1.5 s busy loop got on `host`, and the CPU quota its state records (over SSH, as a
        run reads it: the cgroup the host's processes run in)."""
        from pictl.cluster.hoststate import read_facts

        t = SshTransport(host)
        await t.connect()
        try:
            return float((await t.run(["/usr/bin/python3", "-c", busy])).stdout), \
                (await read_facts(t)).state["cpu_quota"]
        finally:
            await t.close()

    ssh_cluster.set_cpu(1, 0.25)
    try:
        capped, quota = asyncio.run(cpu_seconds(hosts[1]))
    finally:
        ssh_cluster.set_cpu(1, None)
    free, no_quota = asyncio.run(cpu_seconds(hosts[2]))
    assert (quota, no_quota) == (0.25, None)  # the run's host state says so (the read null)
    assert capped < 0.6, capped  # about 0.25 x 1.5 s
    assert free > 2 * capped, (free, capped)


def test_an_ssh_config_alias_is_all_a_host_entry_needs(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    """~/.ssh/config supplies address, port, user, key and known_hosts for an alias."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host lab-h1\n  HostName {ssh_cluster.address(1)}\n  Port {ssh_cluster.port(1)}\n"
        f"  User {ssh_cluster.user(1)}\n  IdentityFile {ssh_cluster.state / 'client_key'}\n"
        f"  UserKnownHostsFile {ssh_cluster.state / 'known_hosts'}\n")
    layout = ssh_cluster.layout
    host = {k: v for k, v in layout["host"][1].items() if k in ("workdir",)}
    inv = tmp_path / "hosts.toml"
    from support.sshcluster import to_toml

    defaults = {k: v for k, v in layout["defaults"].items() if k not in ("key", "known_hosts", "user")}
    inv.write_text(to_toml({"defaults": defaults, "host": [{"name": "h1", "address": "lab-h1", **host}]}))
    proc = run_pictl(["push", "--hosts", str(inv)], {**pictl_env, "HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert "h1: " in proc.stdout and (ssh_cluster.workdir(1) / "code" / "remote" / "runtime" / "pipeline.py").is_file()


async def test_links_between_hosts_are_measured_over_ssh(ssh_cluster, tmp_path: Path) -> None:
    """The balanced policy's link costs: pings and a stream between namespaced hosts, over the bridge."""
    from pictl.cluster.transport import transport_for
    from pictl.planning.costs import link_profiles
    from pictl.records.cache import JsonCache

    hosts = load_cluster(ssh_cluster.inventory).hosts[:3]
    transports = [transport_for(h) for h in hosts]
    try:
        await asyncio.gather(*(t.connect() for t in transports))
        cache = JsonCache(tmp_path / "links")
        links, measured = await link_profiles(list(zip(transports, transports[1:], strict=False)), cache)
        assert measured == ["h0->h1", "h1->h2"] and set(links) == {("h0", "h1"), ("h1", "h2")}
        for link in links.values():
            assert 0 < link.latency_s < 0.05 and link.bytes_per_s > 10e6
        again, measured_again = await link_profiles(list(zip(transports, transports[1:], strict=False)), cache)
        assert measured_again == [] and again == links
    finally:
        await asyncio.gather(*(t.close() for t in transports))
