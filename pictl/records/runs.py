"""Run directories: the resolved config, every host's events as they arrive, summary.json.

    <runs root>/<run id>/
        config.json            resolved options, placement, plan
        events/<source>.jsonl  one file per host (and `serial`), appended live
        logs/<source>.log      non-telemetry output, appended live
        logits-*.f32           check logits fetched from the hosts
        summary.json           written atomically at the end, also for failed runs
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from pictl import errors as E
from pictl.errors import ConfigError
from pictl.records.files import write_bytes_atomic
from pictl.summary import read_json_object
from pictl.text import shown

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def default_runs_root() -> Path:
    return Path(os.environ.get("PICTL_RUNS_DIR") or platformdirs.user_data_path("pictl") / "runs")


def writable_dir(path: Path, what: str) -> Path:
    """`path` as a directory pictl may create and write into, checked before anything starts.

    A missing directory is fine if its nearest existing parent is a writable directory; "writable" is tried
    for real (a directory made there and removed at once: nothing is left), because root passes every
    permission check while /proc, sysfs or an immutable directory still refuse a new entry, which would
    otherwise surface after the code was pushed. ConfigError names `what` (the flag or variable) and the path.
    """
    path = Path(path).expanduser()
    if not str(path).strip():
        raise ConfigError(f"{what}: empty path (give a directory)")
    try:
        path.resolve(strict=False)  # a symlink loop anywhere on the way: RuntimeError
        probe = path
        while not probe.exists() and probe != probe.parent:
            if probe.is_symlink():  # a dangling link: making the directory would follow it elsewhere
                raise ConfigError(f"{what}: {probe} is a symbolic link to nowhere")
            probe = probe.parent
    except RuntimeError:
        raise ConfigError(f"{what}: {path} is a symbolic link loop") from None
    except OSError as exc:  # a name over 255 bytes, a path over 4096
        raise ConfigError(f"{what}: {shown(path, 120)}: {exc.strerror or exc}") from None
    if not probe.is_dir():
        raise ConfigError(f"{what}: {path} is not a directory" if probe == path
                          else f"{what}: {path} cannot be made ({probe} is not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: {probe} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pictl-check-", dir=probe))
    except OSError as exc:
        refused = f"{probe} refuses new entries ({exc.strerror or exc})"
        raise ConfigError(f"{what}: {path} cannot be made: {refused}" if probe != path
                          else f"{what}: {refused}") from None
    return path


def read_record(path: Path) -> dict[str, Any]:
    """A JSON object pictl wrote (summary.json, config.json), or a ConfigError naming the file (`RecordInvalid`:
    a FIFO, a huge file, cut short, nested thousands deep are all refused the same way)."""
    return read_json_object(path)


def path_exists(path: Path) -> bool:
    """`path.exists()` for a path made from a record or an argument: a name too long, a NUL or a directory we
    may not enter is simply not there (never an OSError)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def path_is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def path_is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as `path` whole or not at all: a failed write (a full disk) leaves no temporary behind."""
    write_bytes_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


LIVE_FILE = ".live"
"""Locked (flock) by the controller while the run is open: the lock dies with the process, so a run whose
summary could not be written (a full disk) or whose controller was killed is never taken for a live one."""


def run_is_live(path: Path) -> bool | None:
    """Whether the run in `path` is open in some controller: None for a record older than the live lock."""
    try:
        fd = os.open(path / LIVE_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we just took
    return False


class RunRecord:
    """One run's (or job's) directory on the controller: the layout every kind of work shares.

    A write that fails once the run exists (a full disk) never stops the run: the first failure is kept
    (`write_error`), the run goes on, its result is printed, and the command exits with
    RecordWriteFailed's code. The record is then known to be incomplete, never silently short.
    """

    def __init__(self, root: Path, run_id: str) -> None:
        self.run_id = run_id
        self.path = root / run_id
        self.write_error: E.RecordWriteFailed | None = None
        try:
            root.mkdir(parents=True, exist_ok=True)  # the runs root is the user's (a link there is theirs)
            self.path.mkdir()  # a new name: anything by that name, a link included, is refused
            (self.path / "events").mkdir()
            (self.path / "logs").mkdir()
        except OSError as exc:
            raise E.RecordWriteFailed(f"cannot create the run directory {self.path}: {exc.strerror or exc}") from None
        self._files: dict[str, Any] = {}
        self._live: int | None = None
        try:
            self._live = os.open(self.path / LIVE_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600)
            fcntl.flock(self._live, fcntl.LOCK_EX)
        except OSError:
            self._live = None  # no inode left: the record has no summary either, and reads as not live

    @staticmethod
    def new_id(stages: int) -> str:
        return f"{time.strftime('%Y%m%d-%H%M%S')}-s{stages}-{secrets.token_hex(2)}"

    def _failed(self, what: str, exc: OSError) -> None:
        if self.write_error is None:
            self.write_error = E.RecordWriteFailed(
                f"the result was measured, but its record in {self.path} is incomplete: writing {what} failed "
                f"({exc.strerror or exc})")

    def write_config(self, config: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.path / CONFIG_FILE, config)
        except OSError as exc:  # nothing measured yet: the run stops here
            raise E.RecordWriteFailed(f"cannot write {self.path / CONFIG_FILE}: {exc.strerror or exc}") from None

    def _append(self, rel: str, text: str) -> None:
        if rel in self._files and self._files[rel] is None:
            return  # this file failed once: the record is marked incomplete, the run goes on
        try:
            fh = self._files.get(rel)
            if fh is None:
                fd = os.open(self.path / rel, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o666)  # in the directories made above: never through a link put there since
                fh = self._files[rel] = os.fdopen(fd, "a", buffering=1)
            fh.write(text + "\n")
        except OSError as exc:
            self._failed(rel, exc)
            self._close(rel)
            self._files[rel] = None

    def _close(self, rel: str) -> None:
        fh = self._files.get(rel)
        if fh is not None:
            try:
                fh.close()
            except OSError as exc:  # the last buffered line could not be flushed
                self._failed(rel, exc)

    def event(self, source: str, line: str) -> None:
        self._append(f"events/{source}.jsonl", line)

    def log(self, source: str, line: str) -> None:
        self._append(f"logs/{source}.log", line)

    def save_bytes(self, name: str, data: bytes) -> Path | None:
        """Keep `data` as `name` in the record; None (and the record marked incomplete) if it cannot be written."""
        path = self.path / name
        try:
            write_bytes_atomic(path, data)
        except OSError as exc:
            self._failed(name, exc)
            return None
        return path

    def finish(self, summary: dict[str, Any]) -> None:
        """Close the record with its summary; a summary that cannot be written leaves no partial file."""
        for rel in list(self._files):
            self._close(rel)
        self._files.clear()
        try:
            write_json_atomic(self.path / SUMMARY_FILE, summary)
        except OSError as exc:
            self._failed(SUMMARY_FILE, exc)
        if self._live is not None:
            os.close(self._live)  # the lock goes with it: the run is over
            self._live = None


@dataclass
class PendingRecord:
    """A run's record before and after it exists: the run's lines are kept from its first one, but its
    directory is made only once its spec has passed the plan (bad input leaves no directory behind).
    Until then, the lines wait here; `open` writes them through in order."""

    root: Path
    run_id: str
    record: RunRecord | None = None
    _early: list[tuple[str, str, str]] = field(default_factory=list, repr=False)

    @property
    def path(self) -> Path | None:
        """The run directory, once it exists."""
        return self.record.path if self.record is not None else None

    def open(self, config: dict[str, Any]) -> RunRecord:
        """The spec passed its plan: from here on the run exists, and ends with a summary."""
        self.record = RunRecord(self.root, self.run_id)
        self.record.write_config(config)
        early, self._early = self._early, []
        for kind, source, line in early:
            self._keep(kind, source, line)
        return self.record

    def event(self, source: str, line: str) -> None:
        self._keep("event", source, line)

    def log(self, source: str, line: str) -> None:
        self._keep("log", source, line)

    def _keep(self, kind: str, source: str, line: str) -> None:
        if self.record is None:
            self._early.append((kind, source, line))
        elif kind == "event":
            self.record.event(source, line)
        else:
            self.record.log(source, line)
