"""A measured link stands for the next runs only while it is fresh (`pictl.planning.costs.LINK_MAX_AGE_S`): a link
is shared and changes, and `balanced` prices every cut's bytes with it. In-process, over a real cache directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pictl.planning.costs import LINK_MAX_AGE_S, LINK_SOURCE, MeasuredLink, _cached_link
from pictl.records.cache import JsonCache
from remote.floor.balance import Link


def test_a_cached_link_is_trusted_while_fresh_and_measured_again_after(tmp_path: Path) -> None:
    cache = JsonCache(tmp_path / "links")
    now = time.time()
    cache.put("fresh", MeasuredLink(latency_s=0.001, bytes_per_s=12.5e6, measured_at=now - 5).written())
    cache.put("old", MeasuredLink(latency_s=0.001, bytes_per_s=110e6, measured_at=now - LINK_MAX_AGE_S - 5).written())
    cache.put("undated", {"latency_s": 0.001, "bytes_per_s": 110e6})  # (kept by a pictl before the age: no date)
    assert _cached_link(cache.get("fresh"), LINK_MAX_AGE_S) == Link(0.001, 12.5e6)
    costed = MeasuredLink(latency_s=0.001, bytes_per_s=12.5e6, send_s_per_byte=1e-9, recv_s_per_byte=5e-8,
                          measured_at=now)
    cache.put("costed", costed.written())
    assert _cached_link(cache.get("costed"), LINK_MAX_AGE_S) == Link(0.001, 12.5e6, 1e-9, 5e-8)  # what bytes cost too
    assert _cached_link(cache.get("old"), LINK_MAX_AGE_S) is None
    assert _cached_link(cache.get("undated"), LINK_MAX_AGE_S) is None
    assert _cached_link(cache.get("fresh"), 1.0) is None  # (a caller that wants it fresher)
    future = MeasuredLink(latency_s=0.001, bytes_per_s=110e6, measured_at=now + 3600).written()
    assert _cached_link(future, LINK_MAX_AGE_S) is None  # a clock that went back: not trusted either


def test_a_measured_link_says_what_its_bytes_cost_each_ends_compute() -> None:
    """The link test itself (both ends as processes, over loopback): besides latency and rate, each end's CPU per
    byte, scaled by its wall time per CPU second (a short spin: at least 1), which `balanced` charges the stages."""
    server = subprocess.Popen([sys.executable, "-c", LINK_SOURCE, "serve", "127.0.0.1"], stdout=subprocess.PIPE,
                              text=True)
    try:
        port = server.stdout.readline().strip()  # type: ignore[union-attr]
        sent = subprocess.run([sys.executable, "-c", LINK_SOURCE, "send", "127.0.0.1", port, str(4 << 20)],
                              capture_output=True, text=True, timeout=120, check=True)
    finally:
        server.wait(timeout=30)
    measured = MeasuredLink.model_validate(json.loads(sent.stdout.strip().splitlines()[-1]))
    assert measured.bytes_per_s > 0 and measured.latency_s > 0
    # Moving 4 MB costs each end some CPU (copies and system calls), and no end a second a byte.
    assert 0 < measured.send_s_per_byte < 1e-6 and 0 < measured.recv_s_per_byte < 1e-6, measured
    assert json.loads(sent.stdout)["wall_per_cpu_s"] >= 0.9
    link = measured.link()
    assert (link.send_s_per_byte, link.recv_s_per_byte) == (measured.send_s_per_byte, measured.recv_s_per_byte)
