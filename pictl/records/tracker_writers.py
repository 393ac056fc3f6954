"""Writing a `Series` (`pictl.records.trackers`) with the trackers' own libraries, and the one call the
sessions make once a record is closed (`track_record`).

`tensorboard` and `wandb` are imported only when asked for (the `[track]` extra); neither imports torch. A
tracker that is not installed is refused before anything runs (`check_trackers`). A tracker that fails to
write never costs the result: the record is already closed, and the failure is said as a phase line.
W&B's settings (`PICTL_WANDB_MODE`, `PICTL_WANDB_PROJECT`; any other `PICTL_WANDB_*` is a typo) are checked
with the rest (`wandb_settings`), and its `disabled` mode writes nothing and says so. `write_series` checks
every tracker's folder before it writes any (a file there is ConfigError), and turns a tracker library's
failure into RecordWriteFailed naming the tracker and why: one line and a documented code, never a traceback.
Each tracker writes in a folder of its own beside the record (`tensorboard/`, `wandb/`), made or opened
without following a link (`pictl.records.files.make_dir`): a link by that name is refused, naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pictl.errors import ConfigError, PictlError, RecordWriteFailed
from pictl.records.files import LinkFound, make_dir, refused
from pictl.records.trackers import TRACKERS, Series

WANDB_DIR = "wandb"
TENSORBOARD_DIR = "tensorboard"
WANDB_MODES = ("offline", "online", "disabled")
WANDB_VARIABLES = ("PICTL_WANDB_MODE", "PICTL_WANDB_PROJECT")
_NOT_IN_A_PROJECT = set("/\\#?%:")
"""What W&B refuses in a project name (it would say so only once the record is closed)."""


def check_trackers(kinds: Sequence[str], name: str = "--track") -> None:
    """ConfigError (nothing started) for an unknown tracker or one whose library is not installed."""
    for kind in kinds:
        if kind not in TRACKERS:
            raise ConfigError(f"{name}: '{kind}' is not one of {', '.join(TRACKERS)}")
        if importlib.util.find_spec(kind) is None:
            raise ConfigError(f"{name} {kind}: the {kind} package is not installed here (pip install "
                              f"'pictl[track]')")
        if kind == "wandb":
            wandb_settings()


def wandb_settings() -> tuple[str, str]:
    """W&B's mode and project from `PICTL_WANDB_MODE` (default offline: a cluster may have no internet) and
    `PICTL_WANDB_PROJECT` (default pictl); ConfigError naming the variable for a value W&B would refuse, or a
    `PICTL_WANDB_*` pictl does not read (a typo would otherwise be ignored unsaid)."""
    for variable in sorted(v for v in os.environ if v.startswith("PICTL_WANDB_") and v not in WANDB_VARIABLES):
        raise ConfigError(f"{variable}: not a variable pictl reads (it reads {', '.join(WANDB_VARIABLES)})")
    mode = os.environ.get("PICTL_WANDB_MODE", "offline")
    if mode not in WANDB_MODES:
        raise ConfigError(f"PICTL_WANDB_MODE: {mode[:40]!r} is not one of {', '.join(WANDB_MODES)}")
    project = os.environ.get("PICTL_WANDB_PROJECT", "pictl")
    if not 0 < len(project) <= 128 or not project.isprintable() or set(project) & _NOT_IN_A_PROJECT:
        raise ConfigError(f"PICTL_WANDB_PROJECT: {project[:40]!r} is not a W&B project name (1 to 128 printable "
                          f"characters, none of {' '.join(sorted(_NOT_IN_A_PROJECT))})")
    return mode, project


def said(kind: str, where: Path | None) -> str:
    """One tracker's outcome as one line: where it wrote, or that it wrote nothing (W&B's disabled mode)."""
    return f"{kind}: {where}" if where is not None else f"{kind}: nothing written (PICTL_WANDB_MODE=disabled)"


def write_series(kinds: Sequence[str], directory: Path, series: Series) -> dict[str, Path | None]:
    """Write `series` for each tracker under `directory`; where each went (None: W&B's disabled mode wrote
    nothing). Every tracker's folder is checked before any is written: something other than a directory there is
    ConfigError. A tracker that fails to write is RecordWriteFailed, naming it, its folder and why."""
    folders = {kind: directory / (TENSORBOARD_DIR if kind == "tensorboard" else WANDB_DIR) for kind in kinds}
    for kind, folder in folders.items():
        if folder.is_symlink():
            raise ConfigError(f"{kind}: not written: {refused(LinkFound(folder))}")
        if os.path.lexists(folder) and not folder.is_dir():
            raise ConfigError(f"{kind}: not written: {folder} is not a directory (the tracker's folder goes there)")
    written: dict[str, Path | None] = {}
    for kind, folder in folders.items():
        before = _entries(folder)
        try:
            with _library_noise_off():
                written[kind] = (_tensorboard if kind == "tensorboard" else _wandb)(directory, series)
        except ConfigError as exc:
            raise ConfigError(f"{kind}: not written: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the trackers' libraries raise what they like: one line each
            _remove_new(folder, before)  # nothing half-written: what this write made goes, what was there stays
            raise RecordWriteFailed(f"{kind}: not written to {folder} ({type(exc).__name__}: {exc})") from None
    return written


@contextlib.contextmanager
def _library_noise_off() -> Iterator[None]:
    """While a tracker writes, its library's own complaints stay quiet (on a full disk W&B's logging prints a
    traceback per line it cannot log, TensorBoard's writer thread one as it dies): the failure is raised to us
    and said once, as one line."""
    raising, hook = logging.raiseExceptions, threading.excepthook
    logging.raiseExceptions, threading.excepthook = False, lambda _args: None
    try:
        yield
    finally:
        logging.raiseExceptions, threading.excepthook = raising, hook


def _entries(folder: Path) -> set[str] | None:
    """The names in a tracker's folder before it writes (None: no folder yet)."""
    try:
        return set(os.listdir(folder)) if folder.is_dir() and not folder.is_symlink() else None
    except OSError:
        return None


def _remove_new(folder: Path, before: set[str] | None) -> None:
    """Remove what a failed write added to `folder` (the folder too if it made it), following no link."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in set(os.listdir(fd)) - (before or set()):
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    shutil.rmtree(name, dir_fd=fd)  # descriptor-based: a link inside goes as a link
                else:
                    os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
    if before is None:
        with contextlib.suppress(OSError):
            folder.rmdir()


async def track_record(kinds: Sequence[str], directory: Path, make: Callable[[], Series],
                       say: Callable[[str], object]) -> dict[str, str]:
    """After a record has closed: its series (`make`) into each tracker, off the event loop (W&B starts a
    process of its own); each tracker's outcome is said (`say`), and what was written is returned."""
    if not kinds:
        return {}

    def write() -> dict[str, str]:
        written: dict[str, str] = {}
        try:
            series = make()
        except Exception as exc:  # noqa: BLE001 - a record the trackers cannot take is said; the result stands
            say(f"not written: the record could not be read for the trackers ({type(exc).__name__}: {exc})")
            return written
        for line in series.notes:
            say(line)
        for kind in kinds:
            try:
                where = write_series([kind], directory, series)[kind]
            except PictlError as exc:  # a tracker's failure is said; the result stands
                say(str(exc))
                continue
            say(said(kind, where))
            if where is not None:
                written[kind] = str(where)
        return written

    return await asyncio.to_thread(write)


def _tensorboard(directory: Path, series: Series) -> Path:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    out = make_dir(directory, TENSORBOARD_DIR)
    writer = EventFileWriter(str(out))
    now = time.time()

    def scalar(tag: str, step: int, value: float, wall: float) -> None:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(wall_time=wall or now, step=step, summary=summary))

    try:
        # HParams: the options, and the final figures as the metrics the HParams table shows beside them.
        writer.add_event(event_pb2.Event(wall_time=now, summary=summary_v2.hparams_pb(
            dict(series.hparams), trial_id=series.name)))
        for tag, value in series.final.items():
            scalar(tag, 0, value, now)
        for tag, step, value, wall in series.over_time:
            scalar(tag, step, value, wall)
    finally:
        writer.close()
    return out


def _wandb(directory: Path, series: Series) -> Path | None:
    mode, project = wandb_settings()
    if mode == "disabled":  # W&B would take the run and keep nothing: nothing is written, and that is said
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    make_dir(directory, WANDB_DIR)  # where wandb writes (`dir` is its parent): never through a link
    run = wandb.init(project=project, name=series.name, dir=str(directory), mode=mode,  # type: ignore[arg-type]
                     config=dict(series.hparams), reinit="finish_previous")
    try:
        by_step: dict[int, dict[str, float]] = {}
        for tag, step, value, _wall in series.over_time:
            by_step.setdefault(step, {})[tag] = value
        for step in sorted(by_step):
            run.log(by_step[step], step=step)
        run.summary.update(series.final)
    finally:
        run.finish()
    return directory / WANDB_DIR
