"""What pictl measured and may reuse, kept on the controller: one root, a folder per kind
(`baselines/`, `plans/`, `costs/`, `links/`), and small JSON caches keyed by what they depend on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import platformdirs

from pictl.records.runs import write_json_atomic


def cache_root() -> Path:
    """`$PICTL_CACHE_DIR`, else the platform's cache directory (e.g. ~/.cache/pictl)."""
    return Path(os.environ.get("PICTL_CACHE_DIR") or platformdirs.user_cache_path("pictl"))


class JsonCache:
    """One JSON object per key under `root`, written atomically; unreadable entries count as missing."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def key(fields: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def put(self, key: str, data: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / f"{key}.json", data)
