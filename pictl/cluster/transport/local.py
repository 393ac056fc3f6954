"""The local transport: "hosts" that are this machine (the shipped demo cluster, tests)."""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from pictl.cluster.transport.base import READ_LIMIT, CommandResult, RemoteProcess, Transport, too_large
from pictl.errors import NotReady, TransportError

GATHER_S = 0.02
"""How long a trickle of output gathers before it is read (a line's delay at most; no line is lost)."""
LINE_LIMIT = 1 << 20
"""A line longer than this is passed on in pieces (a telemetry record is a few hundred bytes)."""


def _path(p: str) -> Path:
    return Path(os.path.expanduser(p))


def _write_whole(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """`path` written whole or not at all: a fresh temporary beside it (O_EXCL, O_NOFOLLOW: a link left or
    planted under a temporary's name is never written through), renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.pictl-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The process's environment: ours, with `env` over it, a leading `~/` in a value meaning the home directory
    as the SSH transport's shell reads it (`PYTHONPATH=~/.local/share/pictl/cluster/local0/code` from the shipped
    inventory: left as written, Python skipped it and imported `remote` from the controller's own install)."""
    return {**os.environ, **{k: os.path.expanduser(v) if v == "~" or v.startswith("~/") else v
                             for k, v in (env or {}).items()}}


class LocalProcess(RemoteProcess):
    def __init__(self, proc: asyncio.subprocess.Process, stdout: int, stderr: int) -> None:
        super().__init__()
        self._proc = proc
        self._readers = [asyncio.create_task(self._pump(stdout, "stdout")),
                         asyncio.create_task(self._pump(stderr, "stderr"))]

    async def _pump(self, fd: int, name: str) -> None:
        """Lines from the pipe `fd` as they come. A trickle (a rank's progress, 200 lines a second) is read
        every GATHER_S rather than line by line: meanwhile the pipe is not watched at all, so its lines wait a
        few milliseconds in the pipe and cost one wake-up of the event loop together (an asyncio stream would
        wake it for every line the process flushes)."""
        pending, last = b"", -1.0
        try:
            while True:
                chunk = await _read_when_ready(fd)
                if not chunk:
                    break
                now = time.monotonic()
                streaming, last = now - last < 0.1, now  # (a one-shot command's output is never held back)
                *lines, pending = (pending + chunk).split(b"\n")
                if len(pending) > LINE_LIMIT:  # a line longer than any of ours: passed on in pieces
                    lines.append(pending)
                    pending = b""
                self._lines(name, [raw.decode(errors="replace") for raw in lines])
                if streaming and len(chunk) < 4096:
                    await asyncio.sleep(GATHER_S)
            if pending:
                await self._line(name, pending.decode(errors="replace"))
        finally:
            os.close(fd)
        await self._stream_ended()

    async def send_line(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            await self._proc.stdin.drain()
        except (OSError, BrokenPipeError) as exc:
            raise TransportError(f"cannot write to the process: {exc}") from exc

    async def wait(self) -> int:
        rc = await self._proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)
        return rc

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._proc.pid, sig)  # started with start_new_session: pgid == pid
        except ProcessLookupError:
            pass

    def close_stdin(self) -> None:
        if self._proc.stdin and not self._proc.stdin.is_closing():
            self._proc.stdin.close()

    async def stop(self, grace_s: float = 8.0) -> None:
        self.close_stdin()
        if self._proc.returncode is not None:
            # The leader is gone, but members of its group may remain.
            self._signal_group(signal.SIGKILL)
            return
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), grace_s)
        except TimeoutError:
            pass
        self._signal_group(signal.SIGKILL)
        await self._proc.wait()


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _read_when_ready(fd: int) -> bytes:
    """What the non-blocking pipe `fd` holds (b"" at its end), waiting until it holds something."""
    while True:
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            pass
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


class LocalTransport(Transport):
    async def run(self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                  timeout_s: float | None = None) -> CommandResult:
        process = await self.start(argv, cwd=cwd, env=env)
        process.close_stdin()
        out: list[str] = []
        err: list[str] = []

        async def collect() -> int:
            async for stream, line in process.lines():
                (out if stream == "stdout" else err).append(line)
            return await process.wait()

        try:
            rc = await asyncio.wait_for(collect(), timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            await process.stop(grace_s=1.0)
            raise
        return CommandResult(rc, "\n".join(out), "\n".join(err))

    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> LocalProcess:
        out_r, out_w = os.pipe()  # output pipes of our own: read when we choose (`LocalProcess._pump`)
        err_r, err_w = os.pipe()
        cores = self.host.cpu_set
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(_path(cwd)) if cwd else None, env=_env(env),
                # A pipe we hold open: supervised commands stop when it reaches EOF (we are gone).
                stdin=asyncio.subprocess.PIPE, stdout=out_w, stderr=err_w, start_new_session=True,
                # A host with `cpus` of its own: the child is pinned between fork and exec, so nothing it runs
                # (torch's threads, torchrun's ranks, a warm job, which takes its client's cores) starts
                # anywhere else. One C call, no Python frame (gc is off in the child while it runs): none of
                # the locks that make preexec_fn unsafe beside threads is taken.
                preexec_fn=functools.partial(os.sched_setaffinity, 0, cores) if cores else None)
        except BaseException as exc:
            for fd in (out_r, err_r):
                os.close(fd)
            if isinstance(exc, FileNotFoundError | PermissionError):
                # The host is this machine, so it is there: what is missing is its interpreter or directory.
                raise NotReady(f"host '{self.host.name}': cannot start {argv[0]}: {exc.strerror} "
                               f"({exc.filename or argv[0]})") from exc
            if isinstance(exc, OSError):
                raise TransportError(f"host '{self.host.name}': cannot start {argv[0]}: {exc}") from exc
            raise
        finally:
            os.close(out_w)  # the child holds its own copies: the pipes end when the process (group) does
            os.close(err_w)
        for fd in (out_r, err_r):
            os.set_blocking(fd, False)
        return LocalProcess(proc, out_r, err_r)

    async def put_bytes(self, data: bytes, remote_path: str) -> None:
        _write_whole(_path(remote_path), lambda fh: fh.write(data))

    async def put_file(self, local_path: Path, remote_path: str) -> None:
        def copy(fh: BinaryIO) -> None:
            with local_path.open("rb") as src:
                shutil.copyfileobj(src, fh, 1 << 20)

        await asyncio.to_thread(_write_whole, _path(remote_path), copy)

    async def get_bytes(self, remote_path: str, limit: int = READ_LIMIT) -> bytes:
        try:
            with _path(remote_path).open("rb") as fh:
                data = fh.read(limit + 1)  # never more than the limit, however large the file
                size = max(len(data), os.fstat(fh.fileno()).st_size)
        except OSError as exc:
            raise TransportError(f"host '{self.host.name}': cannot read {remote_path}: {exc}") from exc
        if len(data) > limit:
            raise too_large(self.host.name, remote_path, size, limit)
        return data

    async def makedirs(self, remote_path: str) -> None:
        _path(remote_path).mkdir(parents=True, exist_ok=True)

    async def remove_file(self, remote_path: str) -> None:
        _path(remote_path).unlink(missing_ok=True)

    async def remove_tree(self, remote_path: str) -> None:
        shutil.rmtree(_path(remote_path), ignore_errors=True)
