"""Small JSON caches on the controller (stage plans, cost profiles), keyed by what they depend on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pictl.runs import write_json_atomic


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
