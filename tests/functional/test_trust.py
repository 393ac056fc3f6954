"""Host keys stay checked: an ssh config cannot switch verification off, and `pictl trust` shows the
key, asks, and records it where the connection looks (through an ssh-config alias and a non-default port),
over plain or hashed known_hosts entries, leaving no old key trusted."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
from support.cli import run_pictl
from support.clusters import skip_loudly
from support.sshcluster import to_toml

from pictl.cluster.trust import OfferedKey, TrustTarget, hashed_host, record_key, recorded_keys, without_entry
from pictl.inventory import Host


def _pictl(args: list[str], env: dict[str, str], answer: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_pictl(args, env, 120, input=answer)


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


# Hashed known_hosts (Debian's `HashKnownHosts yes`): `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`.

def _hashed(name: str, salt: bytes | None = None) -> bytes:
    """`name`'s hashed host field, computed here, not with pictl's helper, so a mistake there cannot hide in both."""
    salt = salt or os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return b"|1|" + base64.b64encode(salt) + b"|" + base64.b64encode(digest)


def _keygen_found(known: Path, entry: str) -> list[str]:
    """The lines `ssh-keygen -F` (OpenSSH's own lookup, hashed or plain) finds for `entry`."""
    if not shutil.which("ssh-keygen"):
        skip_loudly("NO ssh-keygen HERE (openssh-client); it runs in CI")
    proc = subprocess.run(["ssh-keygen", "-F", entry, "-f", str(known)], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr  # 1: nothing found
    return [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]


def test_without_entry_drops_plain_and_hashed_entries_and_keeps_the_rest_byte_for_byte() -> None:
    entry = "[10.0.0.5]:2222"
    kept = [b"# lab\r\n", b"10.0.0.6 ssh-ed25519 AAAA\r\n", b"  \n",
            _hashed("[10.0.0.6]:2222") + b" ssh-ed25519 BBBB\n",
            b"@revoked [10.0.0.5]:2222 ssh-ed25519 CCCC\n",  # the user's policy, not an entry to replace
            b"@cert-authority *.lab ssh-ed25519 DDDD\n", b"10.0.0.* ssh-ed25519 EEEE\n",
            b"|1|not base64!|x ssh-ed25519 FFFF\n", b"[10.0.0.5]:22 ssh-ed25519 GGGG"]
    gone = [_hashed(entry) + b" ssh-ed25519 OLD\n", b"[10.0.0.5]:2222 ssh-ed25519 OLD2\n"]
    shared = b"\tpi5,[10.0.0.5]:2222,pi5.lab ssh-ed25519 SHARED # pi5\n"
    lines = kept[:2] + gone[:1] + kept[2:5] + [shared] + gone[1:] + kept[5:]
    assert without_entry(lines, entry) == (
        kept[:5] + [b"\tpi5,pi5.lab ssh-ed25519 SHARED # pi5\n"] + kept[5:], True)
    assert without_entry(kept, entry) == (kept, False)


def test_hashed_names_are_the_ones_openssh_writes_and_reads(tmp_path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"{hashed_host('[10.0.0.5]:2222')} {key}\n")
    assert _keygen_found(known, "[10.0.0.5]:2222") == [known.read_text().strip()]
    assert _keygen_found(known, "10.0.0.5") == []
    # The other way: what `ssh-keygen -H` hashed is recognised (and only for its own name).
    known.write_text(f"[10.0.0.5]:2222 {key}\n10.0.0.5 {key}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)
    lines = known.read_bytes().splitlines(keepends=True)
    assert all(line.startswith(b"|1|") for line in lines)
    assert without_entry(lines, "[10.0.0.5]:2222") == ([lines[1]], True)


def test_record_key_over_a_hashed_entry_keeps_the_file_mode_and_link(tmp_path: Path) -> None:
    old, new = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(2))
    real = tmp_path / "dotfiles" / "known_hosts"
    real.parent.mkdir()
    before, after = b"# mine\n", b"10.0.0.6 " + new.export_public_key().strip() + b"\n"
    real.write_bytes(before + _hashed("[10.0.0.5]:2222") + b" " + old.export_public_key().strip() + b"\n" + after)
    real.chmod(0o640)
    link = tmp_path / "known_hosts"
    link.symlink_to(real)
    target = TrustTarget(Host(name="pi", address="10.0.0.5", port=2222), "10.0.0.5", 2222, "10.0.0.5", None, link)
    # Read as the connection reads it: the hashed entry is the old key.
    assert [k.export_public_key() for k in recorded_keys(target)] == [old.export_public_key()]
    public_line = new.export_public_key().decode().strip()
    record_key(target, OfferedKey("ssh-ed25519", new.get_fingerprint(), public_line, False,
                                  (old.get_fingerprint(),)))
    assert link.is_symlink() and real.stat().st_mode & 0o777 == 0o640
    lines = real.read_bytes().splitlines(keepends=True)
    assert lines[:2] == [before, after] and len(lines) == 3
    assert lines[2].startswith(b"|1|") and lines[2].endswith(b" " + public_line.encode() + b"\n")
    assert [k.export_public_key() for k in recorded_keys(target)] == [new.export_public_key()]
    assert sorted(p.name for p in real.parent.iterdir()) == ["known_hosts"]  # no temporary file left


def _entry(cluster, i: int) -> str:  # noqa: ANN001
    """Host i's known_hosts name: its address, `[address]:port` off port 22 (the loopback cluster)."""
    return cluster.address(i) if cluster.port(i) == 22 else f"[{cluster.address(i)}]:{cluster.port(i)}"


def _host_key(cluster, i: int) -> str:  # noqa: ANN001
    return " ".join((cluster.state / f"host{i}" / "host_key.pub").read_text().split()[:2])


def _inventory_of(cluster, path: Path, known: Path, hosts: list[int]) -> Path:  # noqa: ANN001
    layout = copy.deepcopy(cluster.layout)
    layout["defaults"]["known_hosts"] = str(known)
    layout["host"] = [layout["host"][i] for i in hosts]
    path.write_text(to_toml(layout))
    return path


@pytest.mark.slow
def test_trust_replaces_a_hashed_entry_of_an_old_key(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    """The old key went only from plain lines: over a hashed one, OpenSSH and asyncssh kept accepting it."""
    entry = _entry(ssh_cluster, 0)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "old")], check=True)
    old = " ".join((tmp_path / "old.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"# the lab\n{_entry(ssh_cluster, 1)} {_host_key(ssh_cluster, 1)}\n{entry} {old}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)  # as ssh writes it
    known.chmod(0o640)
    lines = known.read_bytes().splitlines(keepends=True)
    assert lines[1].startswith(b"|1|") and _keygen_found(known, entry) == [lines[2].decode().strip()]
    inv = _inventory_of(ssh_cluster, tmp_path / "hosts.toml", known, [0, 1])
    refused = run_pictl(["check", "--hosts", str(inv)], pictl_env)
    assert refused.returncode == 4 and "pictl trust h0" in refused.stderr, refused.stderr
    old_fp = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "old.pub")], capture_output=True, text=True,
                            check=True).stdout.split()[1]
    trusted = _pictl(["trust", "h0", "--hosts", str(inv), "--yes"], pictl_env)
    assert trusted.returncode == 0, trusted.stderr
    assert f"WARNING: {known} trusts another key for '{entry}' ({old_fp})" in trusted.stdout
    # Only the new key is left for the host, still hashed; every other line as it was.
    found = _keygen_found(known, entry)
    assert len(found) == 1 and found[0].startswith("|1|") and found[0].split()[1:] == _host_key(ssh_cluster, 0).split()
    assert known.read_bytes() == lines[0] + lines[1] + found[0].encode() + b"\n"
    assert known.stat().st_mode & 0o777 == 0o640
    # The connection accepts it now (h1, behind a hashed line that was kept, too).
    checked = run_pictl(["check", "--hosts", str(inv)], pictl_env)
    assert "host key" not in checked.stderr and checked.returncode == 0, checked.stderr


@pytest.mark.slow
def test_a_hashed_entry_of_the_current_key_is_already_trusted(ssh_cluster, pictl_env, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_bytes(b"# the lab\r\n" + _hashed(_entry(ssh_cluster, 0)) + b" "
                      + _host_key(ssh_cluster, 0).encode() + b"\n10.9.9.9 " + _host_key(ssh_cluster, 1).encode())
    before, stat = known.read_bytes(), known.stat()
    inv = _inventory_of(ssh_cluster, tmp_path / "hosts.toml", known, [0])
    again = _pictl(["trust", "h0", "--hosts", str(inv), "--yes"], pictl_env)
    assert again.returncode == 0, again.stderr
    assert f"already trusted as '{_entry(ssh_cluster, 0)}'" in again.stdout and "WARNING" not in again.stdout
    assert known.read_bytes() == before
    assert (known.stat().st_ino, known.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)  # not rewritten
