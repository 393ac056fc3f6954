"""Cache of serial baselines: same model, data, protocol, threads and host -> reuse.

Keyed by everything that changes the serial figure or its logits, including the
checkpoint's size and mtime, the remote code and the host's torch version.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from pictl.runs import write_json_atomic


def default_cache_root() -> Path:
    return Path(os.environ.get("PICTL_CACHE_DIR") or platformdirs.user_cache_path("pictl")) / "baselines"


@dataclass
class Baseline:
    ips: float
    ips_spread: list[float]
    top1: float | None
    logits: bytes
    measured_at: float
    peak_rss_mb: float | None = None
    import_rss_mb: float | None = None
    reused: bool = False


class BaselineCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_cache_root()

    def get(self, key: str) -> Baseline | None:
        entry = self.root / key
        try:
            meta = json.loads((entry / "baseline.json").read_text())
            logits = (entry / "logits-serial.f32").read_bytes()
        except (OSError, ValueError):
            return None
        return Baseline(meta["ips"], meta["ips_spread"], meta.get("top1"), logits, meta["measured_at"],
                        meta.get("peak_rss_mb"), meta.get("import_rss_mb"), reused=True)

    def put(self, key: str, baseline: Baseline, fields: dict[str, Any]) -> None:
        entry = self.root / key
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "logits-serial.f32").write_bytes(baseline.logits)
        # Written last and atomically: an entry without it does not exist.
        write_json_atomic(entry / "baseline.json", {"ips": baseline.ips, "ips_spread": baseline.ips_spread,
                                                    "top1": baseline.top1, "measured_at": baseline.measured_at,
                                                    "peak_rss_mb": baseline.peak_rss_mb,
                                                    "import_rss_mb": baseline.import_rss_mb, "key_fields": fields})
