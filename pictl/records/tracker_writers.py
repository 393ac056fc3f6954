"""Writing a `Series` (`pictl.records.trackers`) with the trackers' own libraries, and the one call the
sessions make once a record is closed (`track_record`).

`tensorboard` and `wandb` are imported only when asked for (the `[track]` extra); neither imports torch. A
tracker that is not installed is refused before anything runs (`check_trackers`). A tracker that fails to
write never costs the result: the record is already closed, and the failure is said as a phase line.
Each tracker writes in a folder of its own beside the record (`tensorboard/`, `wandb/`), made or opened
without following a link (`pictl.records.files.make_dir`): a link by that name is refused, naming it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pictl.errors import ConfigError
from pictl.records.files import make_dir
from pictl.records.trackers import TRACKERS, Series

WANDB_DIR = "wandb"
TENSORBOARD_DIR = "tensorboard"


def check_trackers(kinds: Sequence[str], name: str = "--track") -> None:
    """ConfigError (nothing started) for an unknown tracker or one whose library is not installed."""
    for kind in kinds:
        if kind not in TRACKERS:
            raise ConfigError(f"{name}: '{kind}' is not one of {', '.join(TRACKERS)}")
        if importlib.util.find_spec(kind) is None:
            raise ConfigError(f"{name} {kind}: the {kind} package is not installed here (pip install "
                              f"'pictl[track]')")


def write_series(kinds: Sequence[str], directory: Path, series: Series) -> dict[str, Path]:
    """Write `series` for each tracker under `directory`; where each went."""
    return {kind: (_tensorboard if kind == "tensorboard" else _wandb)(directory, series) for kind in kinds}


async def track_record(kinds: Sequence[str], directory: Path, make: Callable[[], Series],
                       say: Callable[[str], object]) -> dict[str, str]:
    """After a record has closed: its series (`make`) into each tracker, off the event loop (W&B starts a
    process of its own); each tracker's outcome is said (`say`), and what was written is returned."""
    if not kinds:
        return {}

    def write() -> dict[str, str]:
        series, written = make(), {}
        for line in series.notes:
            say(line)
        for kind in kinds:
            try:
                written[kind] = str(write_series([kind], directory, series)[kind])
            except Exception as exc:  # noqa: BLE001 - a tracker's failure is said; the result stands
                say(f"{kind}: not written ({type(exc).__name__}: {exc})")
            else:
                say(f"{kind}: {written[kind]}")
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


def _wandb(directory: Path, series: Series) -> Path:
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    make_dir(directory, WANDB_DIR)  # where wandb writes (`dir` is its parent): never through a link
    mode = os.environ.get("PICTL_WANDB_MODE", "offline")  # online only when asked: a cluster may have no internet
    run = wandb.init(project=os.environ.get("PICTL_WANDB_PROJECT", "pictl"), name=series.name,
                     dir=str(directory), mode=mode, config=dict(series.hparams),  # type: ignore[arg-type]
                     reinit="finish_previous")
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
