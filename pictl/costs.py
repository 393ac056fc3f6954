"""Cost profiles for the `balanced` policy: measured on each host, cached, turned into a CostTable.

`remote.costs` times every piece of the model on the host (with the run's chunk
and thread count) and reports the bytes entering each cut. A profile is cached
per host, interpreter, model, chunk, threads and remote code, so only the first
balanced run (or `pictl profile`) pays the measurement.

Links are not measured yet: a hop between hosts is costed as gigabit Ethernet,
a hop between two stages on one host as a local copy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pictl import errors as E
from pictl.balance import CostTable, Link
from pictl.cache import JsonCache
from pictl.inventory import Host
from pictl.launch import worker_env
from pictl.push import tree_digest
from pictl.telemetry import command_outcome
from pictl.transport import Transport
from remote import protocol as P

LAN_LINK = Link(latency_s=0.0002, bytes_per_s=110e6)  # what 1 GbE delivers between Pis
LOCAL_LINK = Link(latency_s=0.00002, bytes_per_s=2e9)


def profile_key(host: Host, model: str, num_classes: int, chunk: int, threads: int) -> str:
    return JsonCache.key({"host": [host.name, host.address, host.python_path()], "model": model,
                          "num_classes": num_classes, "chunk": chunk, "threads": threads, "code": tree_digest()})


def _usable(profile: dict[str, Any] | None) -> bool:
    """A corrupt or truncated profile is measured again, never trusted."""
    if not profile:
        return False
    n = len(profile.get("pieces", []))
    return n > 0 and all(len(profile.get(k, [])) == n for k in ("compute_s", "cut_bytes", "piece_bytes"))


async def measure_host(t: Transport, model: str, num_classes: int, chunk: int, threads: int) -> dict[str, Any]:
    h = t.host
    argv = [h.python_path(), "-m", "remote.costs", "--model", model, "--num-classes", str(num_classes),
            "--chunk", str(chunk), "--threads", str(threads)]
    result = await t.run(argv, env=worker_env(h, threads), timeout_s=600)
    costs, reason = command_outcome(result, P.COSTS)
    if costs is None:
        raise E.RunFailed(f"host '{h.name}': cost profiling failed: {reason}")
    return {k: costs[k] for k in ("pieces", "compute_s", "cut_bytes", "piece_bytes", "chunk", "threads", "torch")}


async def host_profiles(transports: list[Transport], cache: JsonCache, *, model: str, num_classes: int,
                        chunk: int, threads: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{host name: profile}, measuring in parallel only where the cache has none; and the hosts measured."""
    profiles: dict[str, dict[str, Any]] = {}
    missing: list[Transport] = []
    for t in transports:
        key = profile_key(t.host, model, num_classes, chunk, threads)
        if _usable(cached := cache.get(key)):
            profiles[t.host.name] = cached
        else:
            missing.append(t)
    measured = await asyncio.gather(*(measure_host(t, model, num_classes, chunk, threads) for t in missing))
    for t, profile in zip(missing, measured, strict=True):
        cache.put(profile_key(t.host, model, num_classes, chunk, threads), profile)
        profiles[t.host.name] = profile
    return profiles, [t.host.name for t in missing]


def cost_table(stage_hosts: list[str], profiles: dict[str, dict[str, Any]]) -> CostTable:
    """Stage s runs on stage_hosts[s]; its pieces cost what that host measured."""
    first = profiles[stage_hosts[0]]
    links = [LOCAL_LINK if a == b else LAN_LINK for a, b in zip(stage_hosts, stage_hosts[1:], strict=False)]
    return CostTable(compute_s=[profiles[h]["compute_s"] for h in stage_hosts], cut_bytes=first["cut_bytes"],
                     links=links, piece_bytes=first["piece_bytes"])
