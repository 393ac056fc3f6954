"""Run directories: the resolved config, every host's events as they arrive, summary.json.

    <runs root>/<run id>/
        config.json            resolved options, placement, plan
        events/<source>.jsonl  one file per host (and `serial`), appended live
        logs/<source>.log      non-telemetry output, appended live
        logits-*.f32           check logits fetched from the hosts
        summary.json           written atomically at the end, also for failed runs
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import ValidationError

from pictl.errors import ConfigError
from pictl.summary import RunSummary

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def default_runs_root() -> Path:
    return Path(os.environ.get("PICTL_RUNS_DIR") or platformdirs.user_data_path("pictl") / "runs")


def writable_dir(path: Path, what: str) -> Path:
    """`path` as a directory pictl may create and write into, checked before anything starts.

    Nothing is created here: a missing directory is fine if its nearest existing parent is a
    writable directory. ConfigError names `what` (the flag or variable) and the path otherwise.
    """
    path = Path(path).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{what}: {path} is not a directory" if probe == path
                          else f"{what}: {path} cannot be made ({probe} is not a directory)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{what}: {probe} is not writable")
    return path


def read_record(path: Path) -> dict[str, Any]:
    """A JSON object pictl wrote (summary.json, config.json), or ConfigError naming the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:  # also a UnicodeDecodeError
        raise ConfigError(f"{path}: not a complete JSON record ({exc}); it may have been cut short") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def read_run_summary(path: Path) -> RunSummary:
    """A run's summary.json, checked against the contract (ConfigError naming the file and field if not)."""
    data = read_record(path)
    try:
        return RunSummary.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        what = "is missing" if first["type"] == "missing" else f"is wrong: {first['msg'].lower()}"
        raise ConfigError(f"{path}: not a run summary ('{where}' {what})") from None


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


class RunRecord:
    """One run's (or job's) directory on the controller: the layout every kind of work shares."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.run_id = run_id
        self.path = root / run_id
        (self.path / "events").mkdir(parents=True)
        (self.path / "logs").mkdir()
        self._files: dict[str, Any] = {}

    @staticmethod
    def new_id(stages: int) -> str:
        return f"{time.strftime('%Y%m%d-%H%M%S')}-s{stages}-{secrets.token_hex(2)}"

    def write_config(self, config: dict[str, Any]) -> None:
        write_json_atomic(self.path / CONFIG_FILE, config)

    def _append(self, rel: str, text: str) -> None:
        fh = self._files.get(rel)
        if fh is None:
            fh = self._files[rel] = (self.path / rel).open("a", buffering=1)
        fh.write(text + "\n")

    def event(self, source: str, line: str) -> None:
        self._append(f"events/{source}.jsonl", line)

    def log(self, source: str, line: str) -> None:
        self._append(f"logs/{source}.log", line)

    def save_bytes(self, name: str, data: bytes) -> Path:
        path = self.path / name
        path.write_bytes(data)
        return path

    def finish(self, summary: dict[str, Any]) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()
        write_json_atomic(self.path / SUMMARY_FILE, summary)
