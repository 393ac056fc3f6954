"""The SSH transport (asyncssh): one connection per host, reused for every command and file.

Host keys are always verified: against the host's `known_hosts` file, else the
files ~/.ssh/config names (UserKnownHostsFile), else ~/.ssh/known_hosts. An
unknown or changed key is refused with the command that trusts it, and an ssh
config that turns checking off (`UserKnownHostsFile none`, which asyncssh reads
as "accept any key") is refused rather than obeyed. ~/.ssh/config, keys and the
agent are honoured otherwise. Commands are argument lists, quoted here with
shlex: a user value never reaches a shell unquoted.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import cast

import asyncssh

from pictl.cluster.transport.base import READ_LIMIT, CommandResult, RemoteProcess, Transport, too_large
from pictl.errors import AuthError, HostKeyError, TransportError
from pictl.inventory import Host

CONNECT_TIMEOUT_S = 10.0
KEEPALIVE_MAX = 3  # a silent host is declared gone after 3 unanswered keepalives (the inventory's `keepalive_s`
#                   apart: 15 s by default)


def sh_word(value: str) -> str:
    """Quote one argument for the remote shell, letting a leading `~/` mean the home directory."""
    if value == "~":
        return '"$HOME"'
    if value.startswith("~/"):
        return '"$HOME"/' + shlex.quote(value[2:])
    return shlex.quote(value)


def command_line(argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    words = [sh_word(a) for a in argv]
    if env:
        words = ["env", *(f"{k}={sh_word(v)}" for k, v in env.items()), *words]
    line = " ".join(words)
    return f"cd {sh_word(cwd)} && exec {line}" if cwd else f"exec {line}"


def sftp_path(path: str) -> str:
    """SFTP paths are relative to the login directory; `~/x` becomes `x`."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path


class SshProcess(RemoteProcess):
    def __init__(self, proc: asyncssh.SSHClientProcess) -> None:
        super().__init__()
        self._proc = proc
        self._readers = [asyncio.create_task(self._pump(proc.stdout, "stdout")),
                         asyncio.create_task(self._pump(proc.stderr, "stderr"))]

    async def _pump(self, stream: asyncssh.SSHReader, name: str) -> None:
        try:
            async for line in stream:
                await self._line(name, line)
        except (asyncssh.Error, OSError):
            pass  # the connection went away: wait() reports it
        await self._stream_ended()

    async def send_line(self, line: str) -> None:
        try:
            self._proc.stdin.write(line + "\n")
            await self._proc.stdin.drain()
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            raise TransportError(f"cannot write to the process: {exc}") from exc

    async def wait(self) -> int:
        try:
            completed = await self._proc.wait()
            rc = completed.exit_status if completed.exit_status is not None else 255
        except (asyncssh.Error, OSError):
            rc = 255  # connection lost: like ssh(1)
        await asyncio.gather(*self._readers, return_exceptions=True)
        return rc

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    async def stop(self, grace_s: float = 8.0) -> None:
        # Closing stdin is the stop signal `remote.host.supervise` waits for: it stops the
        # process group (TERM, then KILL) on the host.
        try:
            self._proc.stdin.write_eof()
        except (asyncssh.Error, OSError, BrokenPipeError):
            pass
        try:
            await asyncio.wait_for(self._proc.wait_closed(), grace_s)
        except (TimeoutError, asyncssh.Error, OSError):
            self._proc.close()


class SshTransport(Transport):
    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._made_dirs: set[str] = set()  # a push of many files makes each directory once

    def _where(self) -> str:
        return _where(self.host)

    async def connect(self) -> None:
        h = self.host
        options = await client_options(h)
        try:
            # known_hosts again, explicitly: whatever config asyncssh reads on the way can no longer unset it.
            self._conn = await asyncssh.connect(h.address, options=options, known_hosts=verifying_known_hosts(options))
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostKeyError(f"{self._where()}: host key not trusted ({exc.reason}); if this is the right "
                                 f"machine, run `pictl trust {h.name}`") from exc
        except asyncssh.PermissionDenied as exc:
            raise AuthError(f"{self._where()}: authentication failed for user "
                                 f"'{h.user or 'default'}' (check `user` and `key`)") from exc
        except (OSError, TimeoutError, asyncssh.Error) as exc:
            raise TransportError(f"{self._where()}: unreachable ({exc or type(exc).__name__})") from exc

    async def close(self) -> None:
        if self._sftp:
            self._sftp.exit()
        if self._conn:
            self._conn.close()
            await self._conn.wait_closed()

    def _connection(self) -> asyncssh.SSHClientConnection:
        if self._conn is None:
            raise TransportError(f"{self._where()}: not connected")
        return self._conn

    async def run(self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                  timeout_s: float | None = None) -> CommandResult:
        try:
            result = await self._connection().run(command_line(argv, cwd=cwd, env=env), check=False,
                                                  timeout=timeout_s, stdin=asyncssh.DEVNULL)
        except asyncssh.TimeoutError as exc:
            raise TransportError(f"{self._where()}: `{argv[0]}` timed out after {timeout_s} s") from exc
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._where()}: connection lost ({exc})") from exc
        # Same shape as the local transport: text without the final newline.
        return CommandResult(result.exit_status if result.exit_status is not None else 255,
                             str(result.stdout or "").rstrip("\n"), str(result.stderr or "").rstrip("\n"))

    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> SshProcess:
        try:
            proc = await self._connection().create_process(command_line(argv, cwd=cwd, env=env))
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._where()}: cannot start {argv[0]}: {exc}") from exc
        return SshProcess(proc)

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        if self._sftp is None:
            self._sftp = await self._connection().start_sftp_client()
        return self._sftp

    async def _write(self, remote_path: str, fill: Callable[[asyncssh.SFTPClient, str], Awaitable[object]]) -> None:
        """`fill(sftp, tmp)` writes a temporary name beside `remote_path`, which is then renamed over it:
        a broken transfer never leaves a half file."""
        sftp = await self._sftp_client()
        path = sftp_path(remote_path)
        parent, _, name = path.rpartition("/")
        # A fresh name, opened exclusively (SFTP's CREAT|EXCL: the host's open fails on anything there, a link
        # included): a link left or planted under a temporary's name is never written through.
        tmp = f"{parent + '/' if parent else ''}.{name}.{secrets.token_hex(4)}.pictl-tmp"
        try:
            if parent and parent not in self._made_dirs:
                await sftp.makedirs(parent, exist_ok=True)
                self._made_dirs.add(parent)
            await fill(sftp, tmp)
            await sftp.posix_rename(tmp, path)
        except (asyncssh.Error, OSError) as exc:
            with contextlib.suppress(asyncssh.Error, OSError):
                await sftp.remove(tmp)
            raise TransportError(f"{self._where()}: cannot write {remote_path}: {exc}") from exc

    async def put_bytes(self, data: bytes, remote_path: str) -> None:
        async def fill(sftp: asyncssh.SFTPClient, tmp: str) -> None:
            async with sftp.open(tmp, "xb") as fh:
                await fh.write(data)

        await self._write(remote_path, fill)

    async def put_file(self, local_path: Path, remote_path: str) -> None:
        async def fill(sftp: asyncssh.SFTPClient, tmp: str) -> None:
            async with sftp.open(tmp, "xb"):
                pass  # made exclusively: the put below writes into our own file
            await sftp.put(str(local_path), tmp)  # streams in blocks, several requests in flight

        await self._write(remote_path, fill)

    async def get_bytes(self, remote_path: str, limit: int = READ_LIMIT) -> bytes:
        sftp = await self._sftp_client()
        try:
            async with sftp.open(sftp_path(remote_path), "rb") as fh:
                size = (await fh.stat()).size or 0
                if size > limit:
                    raise too_large(self.host.name, remote_path, size, limit)
                data = cast(bytes, await fh.read(limit + 1))  # it may have grown since: never over the limit
                if len(data) > limit:
                    raise too_large(self.host.name, remote_path, len(data), limit)
                return data
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._where()}: cannot read {remote_path}: {exc}") from exc

    async def makedirs(self, remote_path: str) -> None:
        sftp = await self._sftp_client()
        await sftp.makedirs(sftp_path(remote_path), exist_ok=True)

    async def remove_file(self, remote_path: str) -> None:
        sftp = await self._sftp_client()
        try:
            await sftp.remove(sftp_path(remote_path))
        except asyncssh.SFTPNoSuchFile:
            pass
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._where()}: cannot remove {remote_path}: {exc}") from exc

    async def remove_tree(self, remote_path: str) -> None:
        sftp = await self._sftp_client()
        path = sftp_path(remote_path)
        self._made_dirs = {d for d in self._made_dirs if d != path and not d.startswith(path + "/")}
        try:
            await sftp.rmtree(path)
        except (asyncssh.Error, OSError):
            pass


def _where(h: Host) -> str:
    return f"host '{h.name}' ({h.address}{f':{h.port}' if h.port else ''})"


async def client_options(h: Host, *, connect_timeout_s: float = CONNECT_TIMEOUT_S
                         ) -> asyncssh.SSHClientConnectionOptions:
    """What a connection to `h` uses: the inventory's values over ~/.ssh/config's (asyncssh reads it).

    The known_hosts setting is always explicit here, so no ssh config can switch host-key
    checking off: `UserKnownHostsFile none` reaches asyncssh as `known_hosts=None` ("trust any
    key"), and that is refused.
    """
    kwargs: dict = {"connect_timeout": connect_timeout_s, "keepalive_interval": h.keepalive_s,
                    "keepalive_count_max": KEEPALIVE_MAX}
    if h.port:
        kwargs["port"] = h.port
    if h.user:
        kwargs["username"] = h.user
    if h.key:
        kwargs["client_keys"] = [str(Path(h.key).expanduser())]
    if h.known_hosts:
        kwargs["known_hosts"] = str(Path(h.known_hosts).expanduser())
    try:
        # config=(): read ~/.ssh/config as asyncssh.connect() does (the options' own default reads none).
        options = await asyncssh.SSHClientConnectionOptions.construct(host=h.address, config=(), **kwargs)
    except (OSError, ValueError, asyncssh.Error) as exc:
        # A key file that cannot be read, an ssh config that cannot be parsed: nothing was sent yet.
        raise TransportError(f"{_where(h)}: cannot prepare the SSH connection: {exc}") from exc
    if options.known_hosts is None:
        raise HostKeyError(f"{_where(h)}: ~/.ssh/config turns host-key checking off for this host "
                           "(UserKnownHostsFile none); pictl always verifies host keys: remove that setting "
                           "or set `known_hosts` for the host in the inventory, then `pictl trust "
                           f"{h.name}`")
    return options


def verifying_known_hosts(options: asyncssh.SSHClientConnectionOptions) -> object:
    """The known_hosts argument for the connection: the files that exist, never None.

    A named file that does not exist yet means no key is trusted (asyncssh would fail on it, and
    an empty list would mean "the default file" instead).
    """
    known = options.known_hosts
    if isinstance(known, str):
        known = [known]
    if isinstance(known, list) and known:
        present = [k for k in known if isinstance(k, str) and Path(k).expanduser().is_file()]
        return present or ([], [], [])
    return known if known is not None else ([], [], [])
