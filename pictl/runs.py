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

SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def default_runs_root() -> Path:
    return Path(os.environ.get("PICTL_RUNS_DIR") or platformdirs.user_data_path("pictl") / "runs")


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


class RunRecord:
    """One run's directory on the controller."""

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
