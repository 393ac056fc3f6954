"""A new `hosts.toml` from a few answers (`pictl init`): rendered, validated as pictl will read it, then
written in one step (never half a file, never over an existing one unless asked).

Host addresses are given as `[user@]address[:port]`; names default to `pi0..` (SSH) or `local0..`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pictl.errors import ConfigError
from pictl.inventory import Cluster, address_problem, load_cluster
from pictl.text import printable, shown

USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""An SSH login name: ASCII letters, digits, '_', '.' and '-', not starting with '-' (it would read as an option)."""
PORT = re.compile(r"[0-9]{1,5}")
"""ASCII digits only: int() also takes `٢٢` or `２２`."""
MAX_HOSTS = 64
"""As `--count`'s bound: an answer of 10**9 at the prompt is refused, not asked 10**9 questions about."""


@dataclass
class NewHost:
    name: str
    address: str = "127.0.0.1"
    user: str | None = None
    port: int | None = None


@dataclass
class NewCluster:
    name: str
    transport: Literal["ssh", "local"]
    hosts: list[NewHost] = field(default_factory=list)
    user: str | None = None
    key: str | None = None
    workdir: str | None = None
    venv: str | None = None
    interface: str | None = None


def parse_address(text: str, name: str) -> NewHost:
    """`pi@10.0.0.5:2222`, `pi1.local`, `[fe80::1]:22`, `fe80::1`: user and port optional; the address checked
    as the inventory checks it (a host name or an IP address; `a,*` or `-oX` are neither)."""
    shown_text = repr(shown(text, 80))
    user, at, rest = text.strip().rpartition("@")
    if at and not USER.fullmatch(user):
        raise ConfigError(f"--address {shown_text}: {shown(user, 80)!r} is not a user name (ASCII letters, "
                          f"digits, '_', '.' and '-')")
    port_text: str | None = None
    if rest.startswith("["):  # [IPv6] or [IPv6]:port
        address, _, tail = rest[1:].partition("]")
        if ":" not in address or (tail and not tail.startswith(":")):
            raise ConfigError(f"--address {shown_text} is not [user@]address[:port]")
        port_text = tail[1:] if tail else None
    elif rest.count(":") == 1:
        address, port_text = rest.split(":")
    else:  # a name, IPv4, or a bare IPv6 address (no port: give [address]:port for one)
        address = rest
    problem = address_problem(address)
    if problem:
        raise ConfigError(f"--address {shown_text}: {problem}")
    port = None
    if port_text is not None:
        if not PORT.fullmatch(port_text):
            raise ConfigError(f"--address {shown_text}: the port {shown(port_text, 20)!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise ConfigError(f"--address {shown_text}: port {port} is not in 1..65535")
    return NewHost(name=name, address=address, user=user or None, port=port)


def new_cluster(*, name: str, transport: str, count: int | None, addresses: list[str], names: list[str],
                user: str | None = None, key: str | None = None, workdir: str | None = None,
                venv: str | None = None, interface: str | None = None) -> NewCluster:
    """What `pictl init`'s flags (or answers) describe; ConfigError naming the flag when they do not add up."""
    if transport not in ("ssh", "local"):
        raise ConfigError(f"--transport: {shown(transport, 80)!r} is not ssh or local")
    if not name or len(name) > 64 or printable(name) != name:
        raise ConfigError(f"--name: {shown(name, 80)!r} is not a cluster name (1 to 64 printable characters)")
    if user is not None and not USER.fullmatch(user):
        raise ConfigError(f"--user: {shown(user, 80)!r} is not a user name (ASCII letters, digits, '_', '.' "
                          f"and '-')")
    if count is not None and not 1 <= count <= MAX_HOSTS:
        raise ConfigError(f"--count: {count} hosts (1 to {MAX_HOSTS})")
    if len(addresses) > MAX_HOSTS:
        raise ConfigError(f"--address: {len(addresses)} hosts (at most {MAX_HOSTS})")
    if transport == "local":
        if addresses:
            raise ConfigError("--address: a local cluster runs on this machine; give --count instead")
        if not count or count < 1:
            raise ConfigError("--count: how many local hosts (1 or more)")
        n = count
    else:
        if not addresses:
            raise ConfigError("--address: give each SSH host's address ([user@]address[:port]), once per host")
        if count is not None and count != len(addresses):
            raise ConfigError(f"--count {count} but {len(addresses)} --address given")
        n = len(addresses)
    if names and len(names) != n:
        raise ConfigError(f"--names: {len(names)} names for {n} hosts")
    prefix = "pi" if transport == "ssh" else "local"
    host_names = names or [f"{prefix}{i}" for i in range(n)]
    hosts = ([parse_address(a, nm) for a, nm in zip(addresses, host_names, strict=True)] if transport == "ssh"
             else [NewHost(name=nm) for nm in host_names])
    return NewCluster(name=name, transport="ssh" if transport == "ssh" else "local", hosts=hosts, user=user,
                      key=key, workdir=workdir, venv=venv, interface=interface)


def _q(value: str) -> str:
    # A JSON string (ASCII, escaped) is a valid TOML basic string.
    return json.dumps(value, ensure_ascii=True)


def render(nc: NewCluster) -> str:
    lines = ["# Written by `pictl init`. See README.md (\"A real cluster\") for every field.", "",
             "[cluster]", f"name = {_q(nc.name)}", "", "[defaults]", f"transport = {_q(nc.transport)}"]
    if nc.transport == "local":
        lines += ['address = "127.0.0.1"', f"interface = {_q(nc.interface or 'lo')}"]
    elif nc.interface:
        lines.append(f"interface = {_q(nc.interface)}    # gloo binds here (GLOO_SOCKET_IFNAME)")
    for key, value in (("user", nc.user), ("key", nc.key), ("venv", nc.venv)):
        if value:
            lines.append(f"{key} = {_q(value)}")
    if nc.workdir and nc.transport == "ssh":
        lines.append(f"workdir = {_q(nc.workdir)}")
    for h in nc.hosts:
        lines += ["", "[[host]]", f"name = {_q(h.name)}"]
        if nc.transport == "ssh":
            lines.append(f"address = {_q(h.address)}")
            if h.port:
                lines.append(f"port = {h.port}")
            if h.user:
                lines.append(f"user = {_q(h.user)}")
        else:
            base = (nc.workdir or "~/.local/share/pictl/cluster").rstrip("/")
            lines.append(f"workdir = {_q(base + '/' + h.name)}")
    return "\n".join(lines) + "\n"


def write_inventory(path: Path, nc: NewCluster, *, force: bool = False) -> Cluster:
    """Write `nc` to `path` as one file, after reading it back the way every command will.

    Only a new path or an existing regular file is written (never a device, a fifo, a directory or a
    link: as root, `--out /dev/full --force` would otherwise replace the device node with a file), and
    only by renaming a finished temporary file beside it, so `path` is the old file or the new one,
    never half of one. Any OSError is bad input naming the path (exit 2): nothing was started."""
    try:
        path = Path(path).expanduser()
    except RuntimeError:  # `~nosuchuser/...`
        raise ConfigError(f"--out {shown(path)}: no such user's home folder") from None
    where = shown(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a name over 255 bytes, a path over 4096, a file where a folder should be
        raise ConfigError(f"--out {where}: cannot write it ({exc.strerror or exc})") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise ConfigError(f"--out {where}: {kind}; give a new path or a regular file")
        if not force:
            raise ConfigError(f"--out {where}: already exists (give --force to replace it)")
    if not path.parent.is_dir():
        raise ConfigError(f"--out {where}: its folder {shown(path.parent)} does not exist")
    # A short name of our own: `.{path.name}...` would be too long for a target whose name is near 255 bytes.
    tmp = path.parent / f".pictl-init-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as for any file
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render(nc))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            cluster = load_cluster(tmp)  # refused here (one line naming the field) rather than by the next command
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(str(tmp), str(path))) from None
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"--out {where}: cannot write it ({exc.strerror or exc})") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # nothing was made there (a read-only folder): nothing to remove
    return cluster.model_copy(update={"source": str(path)})
