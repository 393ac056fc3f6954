"""`pictl trust HOST`: fetch a host's SSH key, show it, and record it where the connection looks.

The host is resolved exactly as `pictl` connects to it: asyncssh applies
~/.ssh/config (`HostName`, `Port`, `ProxyJump`, `HostKeyAlias`) to the
inventory's address, so an alias and a non-default port land on the right
machine. The key is recorded under the name the connection will look up
(`HostKeyAlias`, else the resolved `HostName`; `[name]:port` when the port is not
22) in the known_hosts file the connection reads. Trusting is the user's call:
the key type and SHA256 fingerprint are shown and the question is asked (or
answered by `--yes`). Every failure is a `TransportError` (exit 4) in one line.

Entries may be hashed (`|1|salt|hmac`, what Debian's `HashKnownHosts yes` writes):
they are read (asyncssh matches them, as the connection does) and, when the key
changed, removed like plain ones, so the old key stops being trusted; the new
entry is then hashed too. The file is rewritten atomically, its mode kept and
every other line byte for byte.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import hmac
import os
import tempfile
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from pictl.cluster.transport.ssh import client_options
from pictl.errors import ConfigError, TransportError
from pictl.inventory import Host

__all__ = ["OfferedKey", "TrustTarget", "fetch_key", "hashed_host", "record_key", "recorded_keys", "resolve",
           "without_entry"]

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


def recorded_keys(target: TrustTarget) -> list[asyncssh.SSHKey]:
    """The host keys known_hosts trusts for the target, plain or hashed entries alike.

    asyncssh's own matcher with the connection's lookup name and port (the `[name]:port` form, then
    the bare name when nothing is recorded for the port), so "already trusted" means the connection
    accepts the key.
    """
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
    trusted = recorded_keys(target)
    known = {k.export_public_key().decode().strip() for k in trusted}
    return OfferedKey(key.get_algorithm(), key.get_fingerprint("sha256"), public_line, public_line in known,
                      tuple(k.get_fingerprint("sha256") for k in trusted
                            if k.export_public_key().decode().strip() != public_line))


def hashed_host(name: str, salt: bytes | None = None) -> str:
    """`name` as OpenSSH's `HashKnownHosts yes` writes it: `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`."""
    salt = os.urandom(20) if salt is None else salt  # 20 bytes: the SHA-1 size OpenSSH uses
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{b64encode(salt).decode()}|{b64encode(digest).decode()}"


def _hash_names(field: bytes, name: str) -> bool:
    """Whether a hashed host field is `name` (anything malformed is not: that line is left alone)."""
    parts = field.split(b"|")
    if len(parts) != 4 or parts[0] or parts[1] != b"1":
        return False
    try:
        salt, digest = binascii.a2b_base64(parts[2]), binascii.a2b_base64(parts[3])
    except binascii.Error:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest)


def without_entry(lines: list[bytes], entry: str) -> tuple[list[bytes], bool]:
    """`lines` less their host entries for `entry`, and whether one of those was hashed.

    A plain line that names other hosts too keeps them; a hashed line names one host, so it goes
    whole. Marked lines (`@cert-authority`, `@revoked`) are the user's policy and stay, as do
    patterns (`*.lab`), which cover other hosts. Every line kept is kept byte for byte.
    """
    name = entry.encode()
    out: list[bytes] = []
    hashed = False
    for line in lines:
        body = line.lstrip()
        field = body.split(None, 1)[0] if body.strip() else b""
        if not field or field.startswith((b"#", b"@")):
            out.append(line)
        elif field.startswith(b"|"):
            if _hash_names(field, entry):
                hashed = True
            else:
                out.append(line)
        elif name not in field.split(b","):
            out.append(line)
        elif rest := [n for n in field.split(b",") if n != name]:
            at = len(line) - len(body)  # the field starts after the leading blanks
            out.append(line[:at] + b",".join(rest) + line[at + len(field):])
    return out, hashed


def _split_lines(data: bytes) -> list[bytes]:
    """The file's lines with their endings, split at LF only, as OpenSSH reads it (a CR stays in its line)."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def record_key(target: TrustTarget, key: OfferedKey) -> None:
    """Write `<entry> <key>` into the known_hosts file (replacing other keys recorded for that entry).

    Over a hashed entry the new one is hashed too: the user chose not to have host names in the file.
    """
    # Through a symlink (a dotfiles checkout), the file it points to is rewritten, not the link.
    path = Path(os.path.realpath(target.known_hosts))
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines = _split_lines(path.read_bytes()) if path.exists() else []
        if lines and not lines[-1].endswith(b"\n"):
            lines[-1] += b"\n"
        hashed = False
        if key.replaces:
            lines, hashed = without_entry(lines, target.entry)
        lines.append(f"{hashed_host(target.entry) if hashed else target.entry} {key.public_line}\n".encode())
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(b"".join(lines))
            fh.flush()
            os.fsync(fh.fileno())  # the rename below must not reach the disk before the data does
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # a crash never leaves a half-written known_hosts
        tmp = None
    except OSError as exc:
        raise TransportError(f"{target.describe()}: cannot write {target.known_hosts}: {exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
