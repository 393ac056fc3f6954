"""`pictl trust HOST`: fetch a host's SSH key, show it, and record it where the connection looks.

The host is resolved exactly as `pictl` connects to it: asyncssh applies
~/.ssh/config (`HostName`, `Port`, `ProxyJump`, `HostKeyAlias`) to the
inventory's address, so an alias and a non-default port land on the right
machine. The key is recorded under the name the connection will look up
(`HostKeyAlias`, else the resolved `HostName`; `[name]:port` when the port is not
22) in the known_hosts file the connection reads. Trusting is the user's call:
the key type and SHA256 fingerprint are shown and the question is asked (or
answered by `--yes`). Every failure is a `TransportError` (exit 4) in one line.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from pictl.cluster.transport.ssh import client_options
from pictl.errors import ConfigError, TransportError
from pictl.inventory import Host

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class TrustTarget:
    """Where a host's key comes from and where it is written."""

    host: Host
    address: str
    """The address the connection goes to (ssh config `HostName` applied)."""
    port: int
    lookup: str
    """The name the connection looks the key up under (`HostKeyAlias`, else `address`)."""
    via: str | None
    """ProxyJump, if the connection goes through another host."""
    known_hosts: Path

    @property
    def entry(self) -> str:
        """The known_hosts host field: OpenSSH writes a non-default port as `[name]:port`."""
        return self.lookup if self.port == 22 else f"[{self.lookup}]:{self.port}"

    def describe(self) -> str:
        where = f"{self.address}:{self.port}" + (f" via {self.via}" if self.via else "")
        return f"host '{self.host.name}' ({where})"


@dataclass(frozen=True)
class OfferedKey:
    """The key the host presented, and how it compares with what known_hosts already says."""

    algorithm: str
    fingerprint: str
    public_line: str
    """`<type> <base64>`, as a known_hosts entry carries it."""
    already_trusted: bool
    replaces: tuple[str, ...]
    """Fingerprints of other keys recorded for the same name (a changed key)."""


async def resolve(host: Host, *, timeout_s: float) -> TrustTarget:
    """The address, port, jump host, lookup name and known_hosts file the connection to `host` uses."""
    if host.transport != "ssh":
        raise ConfigError(f"host '{host.name}' is a local host: it has no SSH key to trust")
    options = await client_options(host, connect_timeout_s=timeout_s)  # refuses an ssh config that disables checks
    if host.known_hosts:
        known = host.known_hosts
    else:  # what ~/.ssh/config names (UserKnownHostsFile), else the default file, as asyncssh does
        listed = options.known_hosts if isinstance(options.known_hosts, list | tuple) else []
        configured = [k for k in listed if isinstance(k, str)]
        known = configured[0] if configured else DEFAULT_KNOWN_HOSTS
    via = options.tunnel if isinstance(options.tunnel, str) else None
    return TrustTarget(host, options.host, int(options.port), options.host_key_alias or options.host, via,
                       Path(known).expanduser())


def _trusted_keys(target: TrustTarget) -> list[asyncssh.SSHKey]:
    if not target.known_hosts.is_file():
        return []
    try:
        found = asyncssh.match_known_hosts(str(target.known_hosts), target.lookup, "",
                                           None if target.port == 22 else target.port)
    except (OSError, ValueError, asyncssh.Error) as exc:
        raise TransportError(f"{target.describe()}: cannot read {target.known_hosts}: {exc}") from exc
    return list(found[0] or [])


async def fetch_key(target: TrustTarget, *, timeout_s: float) -> OfferedKey:
    """Connect as far as the key exchange and return the host's key (nothing is trusted by this)."""
    h = target.host
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(h.address, h.port or ()), timeout_s)
    except TimeoutError:
        raise TransportError(f"{target.describe()}: no SSH answer within {timeout_s:g} s") from None
    except asyncssh.Error as exc:
        raise TransportError(f"{target.describe()}: not an SSH server, or it hung up "
                             f"({exc.reason or type(exc).__name__})") from None
    except (OSError, ValueError, EOFError) as exc:
        raise TransportError(f"{target.describe()}: unreachable ({exc or type(exc).__name__})") from None
    if key is None:
        raise TransportError(f"{target.describe()}: the server offered no host key")
    public_line = key.export_public_key().decode().strip()
    trusted = _trusted_keys(target)
    known = {k.export_public_key().decode().strip() for k in trusted}
    return OfferedKey(key.get_algorithm(), key.get_fingerprint("sha256"), public_line, public_line in known,
                      tuple(k.get_fingerprint("sha256") for k in trusted
                            if k.export_public_key().decode().strip() != public_line))


def _without_entry(lines: list[str], entry: str) -> list[str]:
    """Drop `entry` from plain (unhashed, unmarked) lines, so a replaced key is no longer trusted."""
    out = []
    for line in lines:
        fields = line.split()
        if not fields or line.lstrip().startswith(("#", "@", "|")):
            out.append(line)
            continue
        names = fields[0].split(",")
        if entry not in names:
            out.append(line)
            continue
        rest = [n for n in names if n != entry]
        if rest:
            out.append(" ".join([",".join(rest), *fields[1:]]) + "\n")
    return out


def record_key(target: TrustTarget, key: OfferedKey) -> None:
    """Write `<entry> <key>` into the known_hosts file (replacing other keys recorded for that entry)."""
    path = target.known_hosts
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        if key.replaces:
            lines = _without_entry(lines, target.entry)
        lines.append(f"{target.entry} {key.public_line}\n")
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.writelines(lines)
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # a crash never leaves a half-written known_hosts
    except (OSError, UnicodeDecodeError) as exc:
        raise TransportError(f"{target.describe()}: cannot write {path}: {exc}") from None
