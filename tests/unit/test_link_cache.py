"""A measured link stands for the next runs only while it is fresh (`pictl.planning.costs.LINK_MAX_AGE_S`): a link
is shared and changes, and `balanced` prices every cut's bytes with it. In-process, over a real cache directory."""

from __future__ import annotations

import time
from pathlib import Path

from pictl.planning.costs import LINK_MAX_AGE_S, MeasuredLink, _cached_link
from pictl.records.cache import JsonCache
from remote.floor.balance import Link


def test_a_cached_link_is_trusted_while_fresh_and_measured_again_after(tmp_path: Path) -> None:
    cache = JsonCache(tmp_path / "links")
    now = time.time()
    cache.put("fresh", MeasuredLink(latency_s=0.001, bytes_per_s=12.5e6, measured_at=now - 5).written())
    cache.put("old", MeasuredLink(latency_s=0.001, bytes_per_s=110e6, measured_at=now - LINK_MAX_AGE_S - 5).written())
    cache.put("undated", {"latency_s": 0.001, "bytes_per_s": 110e6})  # (kept by a pictl before the age: no date)
    assert _cached_link(cache.get("fresh"), LINK_MAX_AGE_S) == Link(0.001, 12.5e6)
    assert _cached_link(cache.get("old"), LINK_MAX_AGE_S) is None
    assert _cached_link(cache.get("undated"), LINK_MAX_AGE_S) is None
    assert _cached_link(cache.get("fresh"), 1.0) is None  # (a caller that wants it fresher)
    future = MeasuredLink(latency_s=0.001, bytes_per_s=110e6, measured_at=now + 3600).written()
    assert _cached_link(future, LINK_MAX_AGE_S) is None  # a clock that went back: not trusted either
