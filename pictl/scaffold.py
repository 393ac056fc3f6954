"""A new `hosts.toml` from a few answers (`pictl init`): rendered, validated as pictl will read it, then
written in one step (never half a file, never over an existing one unless asked).

Host addresses are given as `[user@]address[:port]`; names default to `pi0..` (SSH) or `local0..`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pictl.errors import ConfigError
from pictl.inventory import Cluster, load_cluster

ADDRESS = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<address>\[[0-9a-fA-F:]+\]|[^@\s:\[\]]+)(?::(?P<port>\d{1,5}))?$")
"""`pi@10.0.0.5:2222`, `pi1.local`, `[fe80::1]:22`: user and port optional."""


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
    m = ADDRESS.match(text.strip())
    if not m:
        raise ConfigError(f"--address: {text!r} is not [user@]address[:port]")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"--address: {text!r}: port {port} is not in 1..65535")
    return NewHost(name=name, address=m["address"].strip("[]"), user=m["user"], port=port)


def new_cluster(*, name: str, transport: str, count: int | None, addresses: list[str], names: list[str],
                user: str | None = None, key: str | None = None, workdir: str | None = None,
                venv: str | None = None, interface: str | None = None) -> NewCluster:
    """What `pictl init`'s flags (or answers) describe; ConfigError naming the flag when they do not add up."""
    if transport not in ("ssh", "local"):
        raise ConfigError(f"--transport: {transport!r} is not ssh or local")
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
    """Write `nc` to `path` as one file, after reading it back the way every command will."""
    path = Path(path).expanduser()
    if path.exists() and not force:
        raise ConfigError(f"{path}: already exists (give --force to replace it)")
    if not path.parent.is_dir():
        raise ConfigError(f"{path}: its folder {path.parent} does not exist")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(render(nc))
        try:
            load_cluster(tmp)  # refused here (one line naming the field) rather than by the next command
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(str(tmp), str(path))) from None
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return load_cluster(path)
