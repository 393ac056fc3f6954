"""Reading back what `--track` wrote, with the trackers' own readers: TensorBoard's EventAccumulator, and for
W&B's offline transaction log (`run-ID.wandb`) wandb's own protobuf `Record`. wandb 0.31 ships no Python
reader for that file (its Go core reads it for `wandb sync`), so the framing is read here: the LevelDB log
format W&B uses (a 7-byte header, 32 KiB blocks, records of crc32c(4) length(2) type(1) and data, split over
blocks as FULL / FIRST / MIDDLE / LAST)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag under `directory` (a run's `tensorboard/`): [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_hparams(directory: Path) -> dict[str, Any]:
    """The HParams session start info's hyperparameters (what TensorBoard's HParams tab shows)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(directory))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    out: dict[str, Any] = {}
    for key, value in data.session_start_info.hparams.items():
        kind = value.WhichOneof("kind")
        out[key] = getattr(value, kind)
    return out


def wandb_records(run_dir: Path) -> list[Any]:
    """The records of the one offline W&B run under `run_dir/wandb`, decoded by wandb's protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, buf, records = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B", data[:7]
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        buf += data[pos:pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def wandb_run(run_dir: Path) -> dict[str, Any]:
    """An offline W&B run as its records hold it: config, history rows (by step) and the final summary."""
    config: dict[str, Any] = {}
    history: dict[int, dict[str, float]] = {}
    summary: dict[str, Any] = {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(int(row.get("_step", 0)), {}).update(row)
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                            for i in record.summary.update})
    return {"config": config, "history": history, "summary": summary}
