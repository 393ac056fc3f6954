"""Cache of serial baselines, and when a cached one may stand for a new run's.

Keyed (`pictl.run.serial.baseline_fields`) by everything that changes the serial figure
or its logits: the model or artifact, the checkpoint's content hash (taken on the
host), the host's torch/timm versions and interpreter, threads, chunk, data,
protocol, the host and the remote code. A baseline also records when it was
measured and the host's state then; it is reused only while the host's state
compares (`pictl.cluster.hoststate.state_change`) and it is younger than the run's
`baseline_max_age`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pictl.cluster.hoststate import LOAD_TOLERANCE_CORES, other_work_cores, state_change
from pictl.records.cache import JsonCache, cache_root
from pictl.records.runs import write_bytes_atomic, write_json_atomic
from pictl.run.flags_measured import SERIAL_WAIT_LIMIT
from pictl.summary import age_text


def default_cache_root() -> Path:
    return cache_root() / "baselines"


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
    host_state: dict[str, Any] | None = None
    """The host as the serial run found it (`remote/host/probe.py state`)."""
    timing: dict[str, Any] | None = None
    """Where the serial run's time went, per image (`serial_timing`): compute, the CPU its threads waited for,
    and its latency percentiles; None for a baseline cached before pictl measured them."""


def suspect_when_measured(baseline: Baseline) -> str | None:
    """Why a baseline was already suspect when it was measured (by the rules its run's flags use: other work
    kept cores busy, or its threads waited for a CPU other work held), None if it was clean. A suspect
    baseline is never reused: the load that slowed it may still be there, so the host's state alone would
    compare equal and a slow baseline would go on inflating every later speedup."""
    busy = other_work_cores(baseline.host_state or {})  # (under a CPU quota: only cores it could have used)
    if busy is not None and busy > LOAD_TOLERANCE_CORES:
        return f"other work kept {busy:.1f} cores busy while it was measured"
    timing = baseline.timing or {}
    delay, compute = timing.get("run_delay_per_image_s"), timing.get("compute_per_image_s")
    if isinstance(delay, int | float) and isinstance(compute, int | float) and compute > 0 \
            and delay / compute > SERIAL_WAIT_LIMIT:
        return (f"its threads waited {delay * 1000:.1f} ms per image for a CPU other work held "
                f"({delay / compute:.0%} of its time)")
    return None


def reuse_refusal(cached: Baseline, state_now: dict[str, Any], *, max_age_s: float | None, now: float) -> str | None:
    """Why `cached` may not stand for a serial run now (None: it may)."""
    age = max(0.0, now - cached.measured_at)
    if max_age_s is not None and age > max_age_s:
        return f"the cached baseline is {age_text(age)} old, older than baseline_max_age ({age_text(max_age_s)})"
    if (suspect := suspect_when_measured(cached)) is not None:
        return f"the cached baseline was suspect when it was measured {age_text(age)} ago: {suspect}"
    change = state_change(cached.host_state, state_now)
    return f"the host changed since the cached baseline was measured {age_text(age)} ago: {change}" if change else None


class BaselineCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_cache_root()

    def get(self, key: str) -> Baseline | None:
        entry = self.root / key
        try:
            meta = json.loads((entry / "baseline.json").read_text())
            logits = (entry / "logits-serial.f32").read_bytes()
            baseline = Baseline(float(meta["ips"]), [float(x) for x in meta["ips_spread"]], meta.get("top1"), logits,
                                float(meta["measured_at"]), meta.get("peak_rss_mb"), meta.get("import_rss_mb"),
                                reused=True, host_state=meta.get("host_state"), timing=meta.get("timing"))
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
            return None  # a cut-short or foreign entry is no baseline: the run measures one
        ok = baseline.ips > 0 and all(isinstance(v, dict | None) for v in (baseline.host_state, baseline.timing))
        return baseline if ok else None

    def reusable(self, fields: dict[str, Any], state_now: dict[str, Any], *, max_age_s: float | None, now: float,
                 fresh: bool = False) -> tuple[Baseline | None, str | None]:
        """The baseline cached for `fields` if it may stand for a serial run now (a host state that compares,
        young enough; `fresh`: a run that asked for a new measurement reuses none); else None, and why
        when one was cached or a fresh one was asked for."""
        if fresh:
            return None, "--fresh-baseline asks for a new measurement"
        cached = self.get(JsonCache.key(fields))
        if cached is None:
            return None, None
        refused = reuse_refusal(cached, state_now, max_age_s=max_age_s, now=now)
        return (None, refused) if refused else (cached, None)

    def put(self, key: str, baseline: Baseline, fields: dict[str, Any]) -> None:
        entry = self.root / key
        try:
            entry.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(entry / "logits-serial.f32", baseline.logits)
            # Written last and atomically: an entry without it does not exist.
            write_json_atomic(entry / "baseline.json", {
                "ips": baseline.ips, "ips_spread": baseline.ips_spread, "top1": baseline.top1,
                "measured_at": baseline.measured_at, "peak_rss_mb": baseline.peak_rss_mb,
                "import_rss_mb": baseline.import_rss_mb, "host_state": baseline.host_state,
                "timing": baseline.timing, "key_fields": fields})
        except OSError:
            pass  # a cache that cannot be written (a full disk) costs the next run a measurement, nothing more
