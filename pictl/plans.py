"""Cache of stage plans: planning imports torch and timm on host 0 (8-16 s on a slow host).

A plan is a pure function of the model, the stage count, the split, the chunk and
the image count, given the remote code and host 0's interpreter, as long as no
file on the hosts is involved: runs with a checkpoint or a real data set are
planned every time, because planning is also what checks those files.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import platformdirs

from pictl.runs import write_json_atomic


def default_plan_root() -> Path:
    return Path(os.environ.get("PICTL_CACHE_DIR") or platformdirs.user_cache_path("pictl")) / "plans"


class PlanCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_plan_root()

    @staticmethod
    def key(fields: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            plan = json.loads((self.root / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return plan if isinstance(plan, dict) else None

    def put(self, key: str, plan: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / f"{key}.json", plan)
