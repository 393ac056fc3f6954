"""A real multi-host SSH cluster on this machine, for tests and for trying pictl by hand.

    sudo .venv/bin/python tests/support/sshcluster.py up [N] [CPU]  # prints the hosts.toml to use
    sudo .venv/bin/python tests/support/sshcluster.py down

CPU (e.g. 0.4) caps each host at that many cores with a cgroup-v1 CFS quota, so
4 hosts on 2 cores behave like 4 slow devices (FIELD-NOTES section 7).

Each host is a network namespace on a bridge with its own address and `eth0`,
running Debian's openssh-server with its own host key, and a login of its own
(`pictl-tI`, home `/home/pictl-tI`; `PICTL_SSHCLUSTER_TAG` replaces the `t`). The host
keys go into a known_hosts file the inventory names, so nothing disables host-key checking. The hosts share a
read-only "lab image" with the pinned torch stack, like a prepared Pi image: the
inventory's `venv` points at it, and each login's python also sees it through its
user site-packages (what `system_site_packages = true` reuses).
Needs root for all that. Without root, `LoopbackCluster` is the fallback: the same
number of sshd hosts on loopback ports, run by the current user, each host with a
workdir of its own (one login, one address, no CPU quotas, the controller's venv
as the image); tests that need the rest say so and skip. `start_cluster` picks.
`Unavailable` says why when neither can run.
"""

from __future__ import annotations

import copy
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script too

from pictl.cluster.provision import remote_requirements  # noqa: E402  (the one pinned list)

TAG = os.environ.get("PICTL_SSHCLUSTER_TAG", "t")
"""Names this cluster's namespaces, logins and state (`pictl-<TAG><i>`), so clusters of different
tags (two checkouts tested at once on one machine) never touch each other's."""
if not (len(TAG) == 1 and TAG.isalpha() and TAG.islower()):
    raise SystemExit(f"PICTL_SSHCLUSTER_TAG must be one lower-case letter, not {TAG!r}")
BRIDGE = f"pictl-br{TAG}"
SUBNET = f"10.231.{ord(TAG) - ord('a')}"
LAB_VENV = Path("/opt/pictl-testlab/venv")
STATE = Path("/tmp/pictl-sshcluster" if TAG == "t" else f"/tmp/pictl-sshcluster-{TAG}")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 10_000
"""The period of the emulated CPU quota. Within a period a capped host runs at full speed until its
quota is spent, so with the kernel's default (100 ms) a pipeline stage that waits part of the time
bursts at full speed while an always-busy one is throttled: capped hosts then look faster or slower
than they are, depending on their stage. A 10 ms period makes a capped host uniformly slow, as a
slow CPU is (`cfs_period_us` sets another)."""


def warm_server(p: psutil.Process) -> bool:
    """A warm process itself (`remote.host.warm`: a root, or a workdir server forked from one and named so), not
    a job it forked (those share its command line)."""
    def warm(proc: psutil.Process | None) -> bool:
        try:
            return proc is not None and "remote.host.warmroot --socket" in " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    try:
        return warm(p) and (not warm(p.parent()) or p.name() == "pictl-warm-wd")
    except psutil.NoSuchProcess:
        return False


class Unavailable(Exception):
    """The cluster cannot be started here (not root, no sshd, no netns)."""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, check=check)


def ensure_lab_venv() -> Path:
    """The pinned torch stack in a world-readable venv on Debian's python3 (hardlinked from uv's cache)."""
    stamp = LAB_VENV / ".pictl-requirements"
    # setuptools: torch's metadata requires it, and pip checks that when it reuses these packages.
    packages = ["numpy", "setuptools>=77", *remote_requirements()]
    wanted = "\n".join([*packages, "--compile-bytecode"])
    if stamp.is_file() and stamp.read_text() == wanted:
        return LAB_VENV
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "--allow-existing", "-p", "/usr/bin/python3", str(LAB_VENV)], check=True)
    # Compiled once here: the hosts' logins cannot write the image's __pycache__, so without it every
    # rank on every host compiles torch and timm from source (about 10 s of CPU per process).
    subprocess.run([*uv, "pip", "install", "-q", "--compile-bytecode", "-p", str(LAB_VENV / "bin" / "python"),
                    *packages], check=True)
    stamp.write_text(wanted)
    return LAB_VENV


def to_toml(layout: dict) -> str:
    """The inventory's small TOML subset: tables and arrays of tables of strings, numbers and booleans."""
    def value(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else json.dumps(v)  # a JSON string is a TOML basic string

    out = []
    for name, table in layout.items():
        for entry in table if isinstance(table, list) else [table]:
            out.append(f"[[{name}]]" if isinstance(table, list) else f"[{name}]")
            out += [f"{k} = {value(v)}" for k, v in entry.items()]
            out.append("")
    return "\n".join(out)


class SshCluster:
    """The full cluster: network namespaces, a login each, cgroups (root)."""

    netns = True

    def __init__(self, hosts: int = 4, state: Path = STATE) -> None:
        self.n = hosts
        self.state = state
        self.procs: list[subprocess.Popen] = []
        self.layout: dict = {}
        self.inventory: Path | None = None
        self.cfs_period_us = CFS_PERIOD_US

    def address(self, i: int) -> str:
        return f"{SUBNET}.{11 + i}"

    def port(self, i: int) -> int:
        return 22

    def endpoint(self, i: int) -> str:
        """How pictl's messages name the host's address."""
        return self.address(i) if self.port(i) == 22 else f"{self.address(i)}:{self.port(i)}"

    def user(self, i: int) -> str:
        return f"pictl-{TAG}{i}"

    def workdir_spec(self, i: int) -> str:
        """The workdir as the inventory writes it."""
        return "~/pictl"

    def workdir(self, i: int) -> Path:
        """The same directory as a path on this machine."""
        return Path(f"/home/{self.user(i)}/pictl")

    def exec_on(self, i: int) -> list[str]:
        """Prefix that runs a command on host i's network."""
        return ["ip", "netns", "exec", f"pictl-{TAG}{i}"]

    def _belongs(self, i: int, p: psutil.Process) -> bool:
        return p.info["username"] == self.user(i)

    def processes(self, i: int) -> list[psutil.Process]:
        """The live processes host i runs for pictl, but for its warm process (which outlives runs by design:
        the jobs it forks are counted)."""
        found = []
        for p in psutil.process_iter(["username", "cmdline", "status", "cwd"]):
            if p.info["status"] != psutil.STATUS_ZOMBIE and self._belongs(i, p) and not warm_server(p):
                found.append(p)
        return found

    def variant(self, path: Path, *, defaults: dict | None = None, hosts: dict[int, dict] | None = None) -> Path:
        """A copy of the inventory with some fields changed (None removes a field)."""
        layout = copy.deepcopy(self.layout)
        for table, changes in [(layout["defaults"], defaults or {})] + [
                (layout["host"][i], c) for i, c in (hosts or {}).items()]:
            for k, v in changes.items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
        path.write_text(to_toml(layout))
        return path

    def down(self) -> None:
        down()

    @staticmethod
    def check_possible() -> None:
        if os.geteuid() != 0:
            raise Unavailable("needs root (network namespaces, sshd, test users)")
        if not Path("/usr/sbin/sshd").exists():
            raise Unavailable("Debian's openssh-server is not installed (/usr/sbin/sshd)")
        if not shutil.which("ip"):
            raise Unavailable("iproute2 (`ip`) is not installed")
        if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
            raise Unavailable(f"no cgroup-v1 CPU controller at {CPU_CGROUP} (needed for per-host CPU quotas)")

    def _network(self) -> None:
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "up")
        for i in range(self.n):
            ns, veth = f"pictl-{TAG}{i}", f"pictl-v{TAG}{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "link", "set", veth, "master", BRIDGE)
            _sh("ip", "link", "set", veth, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _user(self, i: int) -> None:
        name = self.user(i)
        if _sh("id", name, check=False).returncode != 0:
            _sh("useradd", "--create-home", "--shell", "/bin/bash", name)
        _sh("usermod", "-p", "*", name)  # unlocked for key login, no password

    def _lab_image_in_user_site(self, i: int, venv: Path) -> None:
        """Make the lab packages importable by the login's own python, as on a prepared image."""
        home = Path(f"/home/{self.user(i)}")
        site = home / ".local" / "lib" / "python3.11" / "site-packages"  # Debian's python3, as on Pi OS
        site.mkdir(parents=True, exist_ok=True)
        (site / "pictl-lab-image.pth").write_text(f"{venv / 'lib' / 'python3.11' / 'site-packages'}\n")
        _sh("chown", "-R", f"{self.user(i)}:{self.user(i)}", str(home / ".local"))

    def cgroup(self, i: int) -> Path:
        return CPU_CGROUP / f"pictl-{TAG}{i}"

    def set_cpu(self, i: int, cores: float | None) -> None:
        """Cap host i (its sshd and everything started through it) at `cores` CPUs; None lifts the cap."""
        quota = -1 if cores is None else max(1000, int(cores * self.cfs_period_us))
        (self.cgroup(i) / "cpu.cfs_period_us").write_text(str(self.cfs_period_us))
        (self.cgroup(i) / "cpu.cfs_quota_us").write_text(str(quota))

    def set_link(self, i: int, up: bool) -> None:
        """Cut host i off the network (its namespace's interface down: no packet in or out, no reset sent, as a
        pulled cable or a Pi that lost power), or restore it."""
        _sh("ip", "-n", f"pictl-{TAG}{i}", "link", "set", "eth0", "up" if up else "down")
        if up:  # (its address and route go with the interface: put them back)
            _sh("ip", "-n", f"pictl-{TAG}{i}", "addr", "replace", f"{self.address(i)}/24", "dev", "eth0")

    def shape_links(self, mbit: float | None) -> None:
        """Cap what every host sends at `mbit` Mbit/s (a token bucket on its eth0; None: uncapped), so the
        links between stages behave like Wi-Fi or an old Pi's Ethernet rather than a memory copy."""
        for i in range(self.n):
            ns = f"pictl-{TAG}{i}"
            _sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            if mbit is not None:
                # A burst of 1 ms at the rate (at least 32 kB, what tbf needs per timer tick) and 100 ms of queue.
                burst = max(32_000, int(mbit * 1e6 / 8 / 1000))
                _sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                    f"{mbit}mbit", "burst", str(burst), "latency", "100ms")

    def _sshd(self, i: int, client_pub: str) -> str:
        d = self.state / f"host{i}"
        d.mkdir(parents=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        (d / "authorized_keys").write_text(client_pub)
        (d / "sshd_config").write_text(
            f"ListenAddress {self.address(i)}\nPort 22\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nAllowUsers {self.user(i)}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
            "MaxSessions 32\nMaxStartups 64\n")
        cgroup = self.cgroup(i)
        cgroup.mkdir(exist_ok=True)

        def enter_cgroup() -> None:  # in the child, before exec: sshd and its sessions inherit the cgroup
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        # `ip netns exec` mounts a fresh /sys, without the cgroup file systems: mount the CPU controller
        # again in the host's own mount namespace, so its CPU quota is readable there, as on a real host.
        mount = (f"mount -t tmpfs cgroup_root /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/cpu && "
                 f"mount -t cgroup -o {_cpu_controllers()} cgroup /sys/fs/cgroup/cpu; exec \"$@\"")
        self.procs.append(subprocess.Popen(["ip", "netns", "exec", f"pictl-{TAG}{i}", "sh", "-c", mount, "sh",
                                            "/usr/sbin/sshd", "-D", "-e",
                                            "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                                           stderr=open(d / "sshd.log", "w"),  # noqa: SIM115
                                           preexec_fn=enter_cgroup))
        return f"{self.address(i)} {(d / 'host_key.pub').read_text().split(' ')[0]} " \
               f"{(d / 'host_key.pub').read_text().split(' ')[1]}\n"

    def _wait_listening(self) -> None:
        for i in range(self.n):
            _wait_port(self.address(i), 22, self.state / f"host{i}" / "sshd.log")

    def up(self, *, lab: bool = True, cpu: float | None = None) -> Path:
        self.check_possible()
        down()
        self.state.mkdir(parents=True, mode=0o755)
        Path("/run/sshd").mkdir(exist_ok=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.state / "client_key"))
        client_pub = (self.state / "client_key.pub").read_text()
        self._network()
        known = ""
        for i in range(self.n):
            self._user(i)
            known += self._sshd(i, client_pub)
        (self.state / "known_hosts").write_text(known)
        self._wait_listening()
        for i in range(self.n):
            self.set_cpu(i, cpu)
        venv = ensure_lab_venv() if lab else None
        for i in range(self.n) if venv else []:
            self._lab_image_in_user_site(i, venv)
        defaults = {"transport": "ssh", "key": str(self.state / "client_key"),
                    "known_hosts": str(self.state / "known_hosts"), "interface": "eth0", "workdir": "~/pictl",
                    "python": "/usr/bin/python3"}
        if venv:
            defaults["venv"] = str(venv)
        hosts = [{"name": f"h{i}", "address": self.address(i), "user": self.user(i)} for i in range(self.n)]
        return self._write_inventory(defaults, hosts)

    def _write_inventory(self, defaults: dict, hosts: list[dict]) -> Path:
        self.layout = {"cluster": {"name": "sshtest"}, "defaults": defaults, "host": hosts}
        self.inventory = self.state / "hosts.toml"
        self.inventory.write_text(to_toml(self.layout))
        return self.inventory


class LoopbackCluster(SshCluster):
    """Without root: sshd per host on a loopback port, all run by the current user."""

    netns = False

    def __init__(self, hosts: int = 4, state: Path | None = None) -> None:
        super().__init__(hosts, state or Path(f"/tmp/pictl-sshcluster-{getpass.getuser()}"))
        self.ports: list[int] = []

    def address(self, i: int) -> str:
        return "127.0.0.1"

    def port(self, i: int) -> int:
        return self.ports[i]

    def user(self, i: int) -> str:
        return getpass.getuser()

    def workdir_spec(self, i: int) -> str:
        return str(self.state / "hosts" / f"h{i}")

    def workdir(self, i: int) -> Path:
        return Path(self.workdir_spec(i))

    def exec_on(self, i: int) -> list[str]:
        return []

    def _belongs(self, i: int, p: psutil.Process) -> bool:
        # One login for all hosts: a host's processes are those working in its workdir.
        cwd = p.info.get("cwd") or ""
        return p.info["username"] == self.user(i) and cwd.startswith(f"{self.workdir(i)}/")

    @staticmethod
    def check_possible() -> None:
        if not Path("/usr/sbin/sshd").exists():
            raise Unavailable("Debian's openssh-server is not installed (/usr/sbin/sshd)")

    def up(self, *, lab: bool = True, cpu: float | None = None) -> Path:
        if cpu is not None:
            raise Unavailable("CPU quotas need root (cgroups)")
        self.check_possible()
        self.down()
        self.state.mkdir(parents=True, mode=0o700)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.state / "client_key"))
        (self.state / "authorized_keys").write_text((self.state / "client_key.pub").read_text())
        known = ""
        for i in range(self.n):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ports.append(s.getsockname()[1])
            d = self.state / f"host{i}"
            d.mkdir()
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
            (d / "sshd_config").write_text(
                f"ListenAddress 127.0.0.1\nPort {self.port(i)}\nHostKey {d / 'host_key'}\n"
                f"PidFile {d / 'sshd.pid'}\nAuthorizedKeysFile {self.state / 'authorized_keys'}\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "Subsystem sftp internal-sftp\nMaxSessions 32\nMaxStartups 64\n")
            self.procs.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                                               stdout=subprocess.DEVNULL,
                                               stderr=open(d / "sshd.log", "w")))  # noqa: SIM115
            key = (d / "host_key.pub").read_text().split()
            known += f"[127.0.0.1]:{self.port(i)} {key[0]} {key[1]}\n"
        (self.state / "known_hosts").write_text(known)
        for i in range(self.n):
            _wait_port(self.address(i), self.port(i), self.state / f"host{i}" / "sshd.log")
        # The controller's own environment plays the prepared image.
        defaults = {"transport": "ssh", "key": str(self.state / "client_key"),
                    "known_hosts": str(self.state / "known_hosts"), "interface": "lo", "user": self.user(0),
                    "python": sys.executable, "venv": sys.prefix}
        hosts = [{"name": f"h{i}", "address": "127.0.0.1", "port": self.port(i), "workdir": self.workdir_spec(i)}
                 for i in range(self.n)]
        return self._write_inventory(defaults, hosts)

    def down(self) -> None:
        for pidfile in self.state.glob("host*/sshd.pid") if self.state.exists() else []:
            try:  # also the sshds of an earlier `up` in another process
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)
        self.procs.clear()
        self.ports.clear()
        shutil.rmtree(self.state, ignore_errors=True)


def start_cluster(hosts: int = 4, cpu: float | None = None) -> SshCluster:
    """The namespaced cluster as root, else the loopback fallback; raises Unavailable if neither runs."""
    cluster = SshCluster(hosts) if os.geteuid() == 0 else LoopbackCluster(hosts)
    cluster.up(cpu=cpu)
    return cluster


def _cpu_controllers() -> str:
    """The controllers mounted together with the CPU one (`cpu`, or `cpu,cpuacct`), as mount options."""
    target = os.path.realpath(CPU_CGROUP)
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "cgroup" and fields[1] == target:
            return ",".join(o for o in fields[3].split(",") if o in ("cpu", "cpuacct"))
    return "cpu"


def _wait_port(address: str, port: int, log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise Unavailable(f"sshd on {address}:{port} did not start: {log.read_text()[-500:]}") from None
            time.sleep(0.1)


def down(n: int = 16) -> None:
    """Remove everything `up` made (also what a crashed earlier run left)."""
    for pidfile in STATE.glob("host*/sshd.pid") if STATE.exists() else []:
        try:
            os.kill(int(pidfile.read_text().strip()), 15)
        except (ValueError, ProcessLookupError):
            pass
    for i in range(n):
        _sh("ip", "netns", "pids", f"pictl-{TAG}{i}", check=False)
        pids = _sh("ip", "netns", "pids", f"pictl-{TAG}{i}", check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        _sh("ip", "netns", "del", f"pictl-{TAG}{i}", check=False)
        _sh("ip", "link", "del", f"pictl-v{TAG}{i}", check=False)
        cgroup = CPU_CGROUP / f"pictl-{TAG}{i}"
        if cgroup.exists():
            for pid in (cgroup / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            for _ in range(50):  # rmdir succeeds once the last member has exited
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    _sh("ip", "link", "del", BRIDGE, check=False)
    for i in range(n):
        for leftover in (Path(f"/home/pictl-{TAG}{i}/pictl"), Path(f"/home/pictl-{TAG}{i}/.local")):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["up"]:
        cluster = start_cluster(int(sys.argv[2]) if len(sys.argv) > 2 else 4,
                                cpu=float(sys.argv[3]) if len(sys.argv) > 3 else None)
        print(cluster.inventory)
        if not cluster.netns:  # its sshds are children of this process
            print("loopback cluster (not root): Ctrl-C stops it", file=sys.stderr)
            try:
                signal.pause()
            except KeyboardInterrupt:
                cluster.down()
    elif sys.argv[1:2] == ["down"]:
        down() if os.geteuid() == 0 else LoopbackCluster().down()
    else:
        sys.exit(__doc__)
