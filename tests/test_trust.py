"""Host keys stay checked: an ssh config cannot switch verification off, and `pictl trust` shows the
key, asks, and records it where the connection looks (through an ssh-config alias and a non-default port)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, run_pictl
from sshcluster import to_toml


def _pictl(args: list[str], env: dict[str, str], answer: str | None = None) -> subprocess.CompletedProcess[str]:
    import sys

    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=120, input=answer)


def _one_error_line(proc: subprocess.CompletedProcess[str], fragment: str) -> str:
    errors = [line for line in proc.stderr.strip().splitlines() if line.startswith("pictl: error: ")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    return errors[0]


def _home(tmp_path: Path, config: str) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "config").write_text(config)
    return home


@pytest.mark.slow
def test_an_ssh_config_that_turns_host_key_checking_off_is_refused(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    """`UserKnownHostsFile none` reached asyncssh as known_hosts=None (any key accepted); pictl refuses it."""
    home = _home(tmp_path, "Host *\n  UserKnownHostsFile none\n")
    inv = ssh_cluster.variant(tmp_path / "hosts.toml", defaults={"known_hosts": None})
    env = {**pictl_env, "HOME": str(home)}
    check = run_pictl(["check", "--hosts", str(inv)], env)
    assert check.returncode == 4, check.stderr
    for i in range(ssh_cluster.n):
        assert f"host 'h{i}' is not ready: host 'h{i}' ({ssh_cluster.endpoint(i)}): ~/.ssh/config turns " \
               "host-key checking off" in check.stderr
    run = run_pictl(["run", "--hosts", str(inv), "--stages", "1", "--images", "2", "--headless"], env)
    assert run.returncode == 4, run.stderr
    assert "UserKnownHostsFile none" in _one_error_line(run, "turns host-key checking off")
    # The inventory's own known_hosts wins over the ssh config: that host is checked, and trusted.
    pinned = ssh_cluster.variant(tmp_path / "pinned.toml")
    assert run_pictl(["push", "--hosts", str(pinned)], env).returncode == 0


def _sshd_on_another_port(cluster, tmp_path: Path) -> tuple[subprocess.Popen | None, int]:
    """Host 0's sshd (same host key) listening on a port that is not 22 (the loopback hosts already are)."""
    if not cluster.netns:
        return None, cluster.port(0)
    port = 2222
    config = (cluster.state / "host0" / "sshd_config").read_text().replace("Port 22\n", f"Port {port}\n")
    config = config.replace(str(cluster.state / "host0" / "sshd.pid"), str(tmp_path / "sshd.pid"))
    (tmp_path / "sshd_config").write_text(config)
    proc = subprocess.Popen([*cluster.exec_on(0), "/usr/sbin/sshd", "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while subprocess.run([*cluster.exec_on(0), "python3", "-c", f"import socket; socket.create_connection("
                          f"('{cluster.address(0)}', {port}), 1)"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and proc.poll() is None, "the second sshd did not start"
        time.sleep(0.2)
    return proc, port


@pytest.mark.slow
def test_trust_through_an_alias_on_another_port_shows_the_key_and_asks(ssh_cluster, pictl_env,
                                                                       tmp_path: Path) -> None:
    sshd, port = _sshd_on_another_port(ssh_cluster, tmp_path)
    try:
        home = _home(tmp_path, f"Host lab-h0\n  HostName {ssh_cluster.address(0)}\n  Port {port}\n"
                               f"  User {ssh_cluster.user(0)}\n  IdentityFile {ssh_cluster.state / 'client_key'}\n"
                               f"  UserKnownHostsFile {tmp_path / 'home' / '.ssh' / 'lab_known_hosts'}\n")
        known = home / ".ssh" / "lab_known_hosts"
        defaults = {k: v for k, v in ssh_cluster.layout["defaults"].items() if k not in ("key", "known_hosts")}
        inv = tmp_path / "hosts.toml"
        inv.write_text(to_toml({"defaults": defaults, "host": [
            {"name": "h0", "address": "lab-h0", "workdir": ssh_cluster.workdir_spec(0)}]}))
        env = {**pictl_env, "HOME": str(home)}
        check = run_pictl(["check", "--hosts", str(inv)], env)
        assert check.returncode == 4 and "host key not trusted" in check.stderr and "pictl trust h0" in check.stderr
        fingerprint = subprocess.run(["ssh-keygen", "-lf", str(ssh_cluster.state / "host0" / "host_key.pub")],
                                     capture_output=True, text=True, check=True).stdout.split()[1]
        where = f"host 'h0' ({ssh_cluster.address(0)}:{port})"
        declined = _pictl(["trust", "h0", "--hosts", str(inv)], env, answer="n\n")
        assert declined.returncode == 4
        assert f"{where} presents a ssh-ed25519 key {fingerprint}" in declined.stdout
        assert "Trust this key for h0? [y/N]" in declined.stdout
        _one_error_line(declined, "key not trusted (the answer was no)")
        assert not known.exists()
        trusted = _pictl(["trust", "h0", "--hosts", str(inv)], env, answer="y\n")
        assert trusted.returncode == 0, trusted.stderr
        assert f"presents a ssh-ed25519 key {fingerprint}" in trusted.stdout
        # Recorded under the name the connection looks up: the resolved address, with the port.
        key = (ssh_cluster.state / "host0" / "host_key.pub").read_text().split()[1]
        assert known.read_text() == f"[{ssh_cluster.address(0)}]:{port} ssh-ed25519 {key}\n"
        push = run_pictl(["push", "--hosts", str(inv)], env)
        assert push.returncode == 0, push.stderr
        again = _pictl(["trust", "h0", "--hosts", str(inv), "--yes"], env)
        assert again.returncode == 0 and "already trusted" in again.stdout
        assert len(known.read_text().splitlines()) == 1
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)


@pytest.fixture
def odd_servers() -> Iterator[dict[str, int]]:
    """A port that speaks HTTP, one that accepts and says nothing, and one that is closed."""
    http = subprocess.Popen(["python3", "-m", "http.server", "0", "--bind", "127.0.0.1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    http_port = int(http.stdout.readline().split(" port ")[1].split()[0])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # the kernel completes the handshake; nothing ever answers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    try:
        yield {"web": http_port, "silent": silent.getsockname()[1], "closed": closed}
    finally:
        http.kill()
        http.wait()
        silent.close()


@pytest.mark.parametrize("name, fragment", [
    ("web", "not an SSH server, or it hung up"),
    ("silent", "no SSH answer within 2 s"),
    ("closed", "unreachable"),
])
def test_trust_failures_are_one_line_and_exit_4(odd_servers, pictl_env, tmp_path: Path, name: str,
                                                fragment: str) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text(f'[[host]]\nname = "{name}"\naddress = "127.0.0.1"\nport = {odd_servers[name]}\n'
                   f'known_hosts = "{tmp_path / "kh"}"\n')
    start = time.monotonic()
    proc = _pictl(["trust", name, "--hosts", str(inv), "--timeout", "2", "--yes"], pictl_env)
    assert proc.returncode == 4
    _one_error_line(proc, f"host '{name}' (127.0.0.1:{odd_servers[name]}): {fragment}")
    assert time.monotonic() - start < 20
    assert not (tmp_path / "kh").exists()
