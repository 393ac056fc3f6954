"""A real multi-host SSH cluster on this machine, for tests and for trying pictl by hand.

    sudo .venv/bin/python tests/sshcluster.py up [N] [CPU]  # prints the hosts.toml to use
    sudo .venv/bin/python tests/sshcluster.py down

CPU (e.g. 0.4) caps each host at that many cores with a cgroup-v1 CFS quota, so
4 hosts on 2 cores behave like 4 slow devices (FIELD-NOTES section 7).

Each host is a network namespace on a bridge with its own address and `eth0`,
running Debian's openssh-server with its own host key, and a login of its own
(`pictl-tI`, home `/home/pictl-tI`). The host keys go into a known_hosts file the
inventory names, so nothing disables host-key checking. The hosts share a
read-only "lab image" with the pinned torch stack, like a prepared Pi image: the
inventory's `venv` points at it, and each login's python also sees it through its
user site-packages (what `system_site_packages = true` reuses).
Needs root; `Unavailable` says why when it cannot run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BRIDGE = "pictl-br0"
SUBNET = "10.231.0"
LAB_VENV = Path("/opt/pictl-testlab/venv")
STATE = Path("/tmp/pictl-sshcluster")
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
CFS_PERIOD_US = 100_000


class Unavailable(Exception):
    """The cluster cannot be started here (not root, no sshd, no netns)."""


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, check=check)


def remote_requirements() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["remote"]


def ensure_lab_venv() -> Path:
    """The pinned torch stack in a world-readable venv on Debian's python3 (hardlinked from uv's cache)."""
    stamp = LAB_VENV / ".pictl-requirements"
    # setuptools: torch's metadata requires it, and pip checks that when it reuses these packages.
    packages = ["numpy", "setuptools>=77", *remote_requirements()]
    wanted = "\n".join(packages)
    if stamp.is_file() and stamp.read_text() == wanted:
        return LAB_VENV
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "--allow-existing", "-p", "/usr/bin/python3", str(LAB_VENV)], check=True)
    subprocess.run([*uv, "pip", "install", "-q", "-p", str(LAB_VENV / "bin" / "python"), *packages], check=True)
    stamp.write_text(wanted)
    return LAB_VENV


class SshCluster:
    def __init__(self, hosts: int = 4, state: Path = STATE) -> None:
        self.n = hosts
        self.state = state
        self.procs: list[subprocess.Popen] = []

    def address(self, i: int) -> str:
        return f"{SUBNET}.{11 + i}"

    def user(self, i: int) -> str:
        return f"pictl-t{i}"

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
            ns, veth = f"pictl-t{i}", f"pictl-v{i}"
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
        return CPU_CGROUP / f"pictl-t{i}"

    def set_cpu(self, i: int, cores: float | None) -> None:
        """Cap host i (its sshd and everything started through it) at `cores` CPUs; None lifts the cap."""
        quota = -1 if cores is None else max(1000, int(cores * CFS_PERIOD_US))
        (self.cgroup(i) / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (self.cgroup(i) / "cpu.cfs_quota_us").write_text(str(quota))

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

        self.procs.append(subprocess.Popen(["ip", "netns", "exec", f"pictl-t{i}", "/usr/sbin/sshd", "-D", "-e",
                                            "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                                           stderr=open(d / "sshd.log", "w"),  # noqa: SIM115
                                           preexec_fn=enter_cgroup))
        return f"{self.address(i)} {(d / 'host_key.pub').read_text().split(' ')[0]} " \
               f"{(d / 'host_key.pub').read_text().split(' ')[1]}\n"

    def _wait_listening(self, timeout: float = 20) -> None:
        for i in range(self.n):
            deadline = time.monotonic() + timeout
            while True:
                try:
                    socket.create_connection((self.address(i), 22), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise Unavailable(f"sshd on {self.address(i)} did not start: "
                                          f"{(self.state / f'host{i}' / 'sshd.log').read_text()[-500:]}") from None
                    time.sleep(0.1)

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
        hosts = ["[cluster]\nname = \"sshtest\"\n",
                 f"[defaults]\ntransport = \"ssh\"\nkey = \"{self.state / 'client_key'}\"\n"
                 f"known_hosts = \"{self.state / 'known_hosts'}\"\ninterface = \"eth0\"\nworkdir = \"~/pictl\"\n"
                 f"python = \"/usr/bin/python3\"\n" + (f"venv = \"{venv}\"\n" if venv else "")]
        for i in range(self.n):
            hosts.append(f"[[host]]\nname = \"h{i}\"\naddress = \"{self.address(i)}\"\nuser = \"{self.user(i)}\"\n")
        inventory = self.state / "hosts.toml"
        inventory.write_text("\n".join(hosts))
        return inventory


def down(n: int = 16) -> None:
    """Remove everything `up` made (also what a crashed earlier run left)."""
    for pidfile in STATE.glob("host*/sshd.pid") if STATE.exists() else []:
        try:
            os.kill(int(pidfile.read_text().strip()), 15)
        except (ValueError, ProcessLookupError):
            pass
    for i in range(n):
        _sh("ip", "netns", "pids", f"pictl-t{i}", check=False)
        pids = _sh("ip", "netns", "pids", f"pictl-t{i}", check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        _sh("ip", "netns", "del", f"pictl-t{i}", check=False)
        _sh("ip", "link", "del", f"pictl-v{i}", check=False)
        cgroup = CPU_CGROUP / f"pictl-t{i}"
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
        for leftover in (Path(f"/home/pictl-t{i}/pictl"), Path(f"/home/pictl-t{i}/.local")):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["up"]:
        print(SshCluster(int(sys.argv[2]) if len(sys.argv) > 2 else 4).up(
            cpu=float(sys.argv[3]) if len(sys.argv) > 3 else None))
    elif sys.argv[1:2] == ["down"]:
        down()
    else:
        sys.exit(__doc__)
