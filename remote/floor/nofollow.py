"""Paths under a directory pictl owns, opened, made and removed without following symbolic links (stdlib only).

A workdir on a shared Pi, a runs directory, a sweep folder received from someone else: a link planted in one
would lead a write, a removal or a copy out of it (the orphan sweep removing a directory elsewhere, the lease
truncating the file it points to, a report copying the reader's key file). Every function here starts from
the directory it is given, taken as it is (the inventory's workdir, a `--runs-dir`: where they lead is their
owner's choice), and walks every component below it from the previous one's descriptor with `O_NOFOLLOW`: a
link anywhere on the way is `LinkFound`, naming the path, and nothing is opened through it.

The controller imports this too (`pictl.records.files`): it is part of remote's floor.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LinkFound(OSError):
    """A path under a directory pictl owns is a symbolic link (or is reached through one): never followed."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(errno.ELOOP, "a symbolic link", str(path))
        self.path = str(path)

    def __str__(self) -> str:
        return f"{self.path} is a symbolic link (pictl never follows links in its own directories)"


def _parts(rel: str | PurePosixPath) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if any(p in ("/", "..") for p in parts):
        raise ValueError(f"not a path inside the directory: {rel}")
    return tuple(p for p in parts if p != ".")


def _refusal(exc: OSError, name: str, dir_fd: int, path: Path) -> OSError:
    """What opening `name` with O_NOFOLLOW failed on: a link there (ELOOP for a file, ENOTDIR or ELOOP for a
    directory) is LinkFound; anything else is the error itself, naming the path."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                return LinkFound(path)
        except OSError:
            pass
    return type(exc)(exc.errno, exc.strerror, str(path))


def open_dir(base: str | Path, rel: str | PurePosixPath = "", *, create: bool = False, mode: int = 0o777) -> int:
    """A descriptor of the directory `base/rel` (the caller closes it): every component of `rel` a real
    directory, made (with `mode`, less the umask) where missing if `create`. LinkFound if one is a link."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    path = Path(base)
    try:
        for part in _parts(rel):
            path = path / part
            if create:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass  # there already: checked as it is opened
            try:
                below = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _refusal(exc, part, fd, path) from None
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(base: str | Path, rel: str | PurePosixPath, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
    """A descriptor of the file `base/rel`, opened with `flags` (the caller closes it); LinkFound if it, or a
    directory on the way, is a link. Opened for reading, a FIFO or a device does not block the open: check
    what it is (`os.fstat`) before reading."""
    parts = _parts(rel)
    if not parts:
        raise ValueError("no file name")
    parent = open_dir(base, PurePosixPath(*parts[:-1]))
    try:
        extra = os.O_NONBLOCK if flags & os.O_ACCMODE == os.O_RDONLY else 0
        try:
            fd = os.open(parts[-1], flags | extra | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        except OSError as exc:
            raise _refusal(exc, parts[-1], parent, Path(base, *parts)) from None
    finally:
        os.close(parent)
    if extra:
        os.set_blocking(fd, True)
    return fd


def is_link(base: str | Path, rel: str | PurePosixPath) -> bool:
    """Whether `base/rel` is itself a link (a missing path is not one; a link on the way is LinkFound)."""
    parts = _parts(rel)
    parent = open_dir(base, PurePosixPath(*parts[:-1]))
    try:
        return stat.S_ISLNK(os.lstat(parts[-1], dir_fd=parent).st_mode)
    except FileNotFoundError:
        return False
    finally:
        os.close(parent)


def remove_tree(base: str | Path, rel: str | PurePosixPath) -> None:
    """Remove the directory `base/rel` and everything in it, following no link: a link inside is removed as a
    link, and `rel` (or a directory on the way) being one is LinkFound, with nothing removed."""
    parts = _parts(rel)
    if not parts:
        raise ValueError("refusing to remove the base directory itself")
    parent = open_dir(base, PurePosixPath(*parts[:-1]))
    try:
        if stat.S_ISLNK(os.lstat(parts[-1], dir_fd=parent).st_mode):
            raise LinkFound(Path(base, *parts))
        shutil.rmtree(parts[-1], dir_fd=parent)  # descriptor-based on Linux: avoids_symlink_attacks
    finally:
        os.close(parent)
