"""The transport interface: run a command, stream its lines, copy files, stop a process group.

Commands are argument lists, never shell strings: an implementation that needs a
shell (SSH) quotes every argument itself.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pictl.errors import TooLarge
from pictl.inventory import Host

READ_LIMIT = 1 << 30
"""The most any file from a host is read into memory (merged training weights are the largest, ~350 MB for a
ViT-Base); callers that know their file's size ask for less. A host cannot make the controller allocate
without bound."""


def too_large(host: str, remote_path: str, size: int, limit: int) -> TooLarge:
    return TooLarge(f"host '{host}': {remote_path} holds {size:,} bytes, more than the {limit:,} pictl reads "
                    "of such a file")


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class RemoteProcess(ABC):
    """A long-running command on a host, in a process group of its own.

    Implementations start one task per output stream that calls `_line()` for
    each line (or `_lines()` for the lines of one read) and `_stream_ended()`
    once; `lines()` merges them in arrival order.
    """

    def __init__(self) -> None:
        # Batches of lines: a read's lines cost one hand-over between tasks, not one each (800 a second
        # while 4 ranks stream progress).
        self._queue: asyncio.Queue[tuple[str, list[str]] | None] = asyncio.Queue()

    async def _line(self, stream: str, line: str) -> None:
        self._queue.put_nowait((stream, [line.rstrip("\n")]))  # unbounded: never a reason to yield here

    def _lines(self, stream: str, lines: list[str]) -> None:
        if lines:
            self._queue.put_nowait((stream, lines))

    async def _stream_ended(self) -> None:
        self._queue.put_nowait(None)

    async def lines(self) -> AsyncGenerator[tuple[str, str], None]:
        """(stream, line) pairs as they arrive, stream being "stdout" or "stderr"."""
        ended = 0
        while ended < 2:
            item = await self._queue.get()
            if item is None:
                ended += 1
                continue
            stream, batch = item
            for line in batch:
                yield stream, line

    @abstractmethod
    async def send_line(self, line: str) -> None:
        """Write one line to the process's stdin (and flush it)."""

    @abstractmethod
    async def wait(self) -> int:
        """Exit status, once the process has ended."""

    @property
    @abstractmethod
    def returncode(self) -> int | None: ...

    @abstractmethod
    async def stop(self, grace_s: float = 8.0) -> None:
        """SIGTERM the whole process group, then SIGKILL whatever is left after `grace_s`."""


class Transport(ABC):
    """Everything pictl does on one host goes through one of these."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def connect(self) -> None:  # noqa: B027 - optional hook, a no-op for local hosts
        """Open the connection."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Close the connection."""

    @abstractmethod
    async def run(self, argv: list[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
                  timeout_s: float | None = None) -> CommandResult:
        """Run a command to completion and collect its output."""

    @abstractmethod
    async def start(self, argv: list[str], *, cwd: str | None = None,
                    env: Mapping[str, str] | None = None) -> RemoteProcess:
        """Start a command in a new process group and return at once."""

    @abstractmethod
    async def put_bytes(self, data: bytes, remote_path: str) -> None:
        """Write a file on the host, atomically (temporary name, then rename)."""

    async def put_file(self, local_path: Path, remote_path: str) -> None:
        """Copy a local file to the host atomically without holding it in memory (large wheels)."""
        await self.put_bytes(local_path.read_bytes(), remote_path)  # implementations stream it

    @abstractmethod
    async def get_bytes(self, remote_path: str, limit: int = READ_LIMIT) -> bytes:
        """Read a file from the host; TooLarge (nothing read) when it holds more than `limit` bytes."""

    @abstractmethod
    async def makedirs(self, remote_path: str) -> None: ...

    @abstractmethod
    async def remove_file(self, remote_path: str) -> None:
        """Delete one file if it exists."""

    @abstractmethod
    async def remove_tree(self, remote_path: str) -> None:
        """Delete a directory pictl created (only ever called on paths under the host's workdir)."""
