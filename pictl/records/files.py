"""Files in pictl's own directories on the controller (a run's record, a sweep folder, a tracker's folder):
reached without following symbolic links, and read within a cap that is said when it bites.

A run or sweep directory may come from someone else (a folder received by mail, a shared drive): a link in it
must not make `pictl report` copy the reader's key file into a shared report, nor `pictl track` write through
it. The directory itself is taken as given (it is the caller's argument); below it, every component is
opened with `O_NOFOLLOW` from the one above (`remote.floor.nofollow`), and a link is refused with one line naming
it (`ConfigError`, exit 2). A record or an events file is never read whole: `read_lines` stops at
`MAX_EVENTS_BYTES` (and skips a line over `MAX_LINE_BYTES`), and leaves a note saying what it skipped.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from pictl.errors import ConfigError
from pictl.events import MAX_RECORD_CHARS
from pictl.text import printable
from remote.floor import nofollow
from remote.floor.nofollow import LinkFound

__all__ = ["MAX_EVENTS_BYTES", "MAX_LINE_BYTES", "LinkFound", "event_files", "make_dir", "read_lines",
           "read_regular", "refused", "write_bytes_atomic"]

MAX_EVENTS_BYTES = 64 * 2**20
"""The most of one events (or samples) file that is read: a run writes a few MB per host (a progress line per
pass and rank, ~300 bytes); what lies beyond is skipped, and said."""
MAX_LINE_BYTES = MAX_RECORD_CHARS
"""A telemetry line is under a kilobyte; one over the record limit is no record, and is skipped without being
held."""


def refused(link: LinkFound) -> ConfigError:
    """A link where pictl reads or writes its own files: one line naming it, exit 2."""
    return ConfigError(printable(str(link)))


def make_dir(base: Path, rel: str) -> Path:
    """`base/rel` as a real directory (made if missing): ConfigError naming it if it, or a directory on the way,
    is a link (nothing is made through it)."""
    try:
        os.close(nofollow.open_dir(base, rel, create=True))
    except LinkFound as link:
        raise refused(link) from None
    return base / rel


def read_regular(base: Path, rel: str, limit: int) -> bytes | None:
    """The bytes of the regular file `base/rel`, or None when it holds more than `limit` (nothing read). A link is
    ConfigError naming it; a FIFO or a device is an OSError (never read)."""
    try:
        fd = nofollow.open_file(base, rel)
    except LinkFound as link:
        raise refused(link) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{base / rel}: not a regular file")
        if info.st_size > limit:
            return None
        data = fh.read(limit + 1)  # it may have grown since
    return None if len(data) > limit else data


def event_files(directory: Path, notes: list[str]) -> list[str]:
    """The names of the regular `*.jsonl` files in `directory` (a run's `events/`), sorted; a link among them, or
    `directory` being one, is left unread and noted."""
    try:
        fd = nofollow.open_dir(directory.parent, directory.name)
    except LinkFound as link:
        notes.append(f"{printable(str(link))}: not read")
        return []
    except OSError:
        return []
    try:
        with os.scandir(fd) as entries:
            found = [(e.name, e.is_symlink(), e.is_file(follow_symlinks=False)) for e in entries
                     if e.name.endswith(".jsonl")]
    finally:
        os.close(fd)
    for name, is_link, _ in found:
        if is_link:
            notes.append(f"{printable(str(directory / name))} is a symbolic link: not read")
    return sorted(name for name, is_link, regular in found if regular and not is_link)


def read_lines(base: Path, rel: str, notes: list[str], *, limit: int = MAX_EVENTS_BYTES,
               max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of the file `base/rel` (UTF-8, undecodable bytes replaced), read as a stream: at most `limit`
    bytes, a line over `max_line` bytes skipped without being held. What was skipped, and a link or a file
    that is not a regular one (never read), is appended to `notes` as one line naming the file."""
    path = printable(str(base / rel))
    try:
        fd = nofollow.open_file(base, rel)
    except LinkFound:
        notes.append(f"{path} is a symbolic link: not read")
        return
    except OSError:
        return  # gone, or not ours to read: nothing to show from it
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            notes.append(f"{path}: not a regular file, not read")
            return
        read = long = 0
        while read < limit:
            line = fh.readline(min(max_line + 1, limit - read))
            if not line:
                break
            read += len(line)
            if len(line) > max_line and not line.endswith(b"\n"):
                long += 1
                while read < limit:  # the rest of that line, a bounded chunk at a time
                    rest = fh.readline(min(max_line, limit - read))
                    read += len(rest)
                    if not rest or rest.endswith(b"\n"):
                        break
                continue
            if not line.endswith(b"\n") and read >= limit and fh.peek(1):
                break  # cut by the cap, not by the end of the file: half a line is no line
            yield line.decode("utf-8", "replace").rstrip("\n")
        if read >= limit and fh.read(1):
            notes.append(f"{path}: only its first {amount(limit)} read (it holds {info.st_size:,} bytes); "
                         "the rest was skipped")
        if long:
            notes.append(f"{path}: {long} line(s) over {amount(max_line)} skipped")


def amount(size: int) -> str:
    """A cap as people read it: `64 MiB`, `4 KiB`, `100 bytes`."""
    if size and size % 2**20 == 0:
        return f"{size >> 20} MiB"
    return f"{size >> 10} KiB" if size and size % 2**10 == 0 else f"{size:,} bytes"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`data` as `path`, whole or not at all: written to a fresh temporary name beside it (O_EXCL and O_NOFOLLOW:
    never through a link planted under a name), then renamed over `path` (a link there is replaced, not
    followed). A failed write (a full disk) leaves no temporary behind."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
