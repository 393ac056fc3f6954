"""Cost profiles for the `balanced` policy: measured on each host, cached, turned into a CostTable.

`remote.costs` times every piece of the model on the host (with the run's chunk
and thread count) and reports the bytes entering each cut. A profile is cached
per host, interpreter, model, chunk, threads and remote code, so only the first
balanced run (or `pictl profile`) pays the measurement.

Links are measured too (`remote/linktest.py`, stdlib, sent with `python -c`):
from each stage host to the next, the round-trip latency of small pings and the
rate of a stage-sized stream, cached per host pair and addresses. A hop between
two stages on one host is costed as a local copy.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.artifacts import Artifact
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
LINK_SOURCE = (Path(__file__).resolve().parent.parent / "remote" / "linktest.py").read_text()
LINK_BYTES = 16 << 20  # a few stage outputs' worth: 0.15 s on gigabit Ethernet


def link_key(src: Host, dst: Host) -> str:
    return JsonCache.key({"link": [src.name, src.address, dst.name, dst.rendezvous_address]})


async def measure_link(src: Transport, dst: Transport, nbytes: int = LINK_BYTES) -> Link:
    """Stream `nbytes` from src to dst's rendezvous address (the path gloo takes) after timing pings."""
    address = dst.host.rendezvous_address
    server = await dst.start([dst.host.base_python(), "-c", LINK_SOURCE, "serve", address])
    try:
        port = None
        async for stream, line in server.lines():
            if stream == "stdout" and line.strip().isdigit():
                port = int(line)
            break
        if port is None:
            raise E.TransportError(f"host '{dst.host.name}': cannot listen on {address} to measure the link")
        result = await src.run([src.host.base_python(), "-c", LINK_SOURCE, "send", address, str(port), str(nbytes)],
                               timeout_s=120)
        if result.returncode != 0:
            raise E.TransportError(f"link {src.host.name} -> {dst.host.name}: "
                                   f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
        measured = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        await server.stop(grace_s=1)
    return Link(latency_s=float(measured["latency_s"]), bytes_per_s=float(measured["bytes_per_s"]))


async def link_profiles(pairs: list[tuple[Transport, Transport]], cache: JsonCache
                        ) -> tuple[dict[tuple[str, str], Link], list[str]]:
    """{(src, dst): Link} for each pair of different hosts, one at a time (they share the network)."""
    links: dict[tuple[str, str], Link] = {}
    measured: list[str] = []
    for src, dst in pairs:
        names = (src.host.name, dst.host.name)
        if names in links or names[0] == names[1]:
            continue
        cached = cache.get(link_key(src.host, dst.host))
        if cached and cached.get("bytes_per_s", 0) > 0 and "latency_s" in cached:
            links[names] = Link(cached["latency_s"], cached["bytes_per_s"])
            continue
        links[names] = link = await measure_link(src, dst)
        cache.put(link_key(src.host, dst.host), {"latency_s": link.latency_s, "bytes_per_s": link.bytes_per_s})
        measured.append(f"{names[0]}->{names[1]}")
    return links, measured


def profile_key(host: Host, model: str, num_classes: int, chunk: int, threads: int,
                artifact: Artifact | None = None) -> str:
    return JsonCache.key({"host": [host.name, host.address, host.python_path()], "model": model,
                          "artifact": artifact.digest if artifact else None,
                          "num_classes": num_classes, "chunk": chunk, "threads": threads, "code": tree_digest()})


def _usable(profile: dict[str, Any] | None) -> bool:
    """A corrupt or truncated profile is measured again, never trusted."""
    if not profile:
        return False
    n = len(profile.get("pieces", []))
    return n > 0 and all(len(profile.get(k, [])) == n for k in ("compute_s", "cut_bytes", "piece_bytes"))


async def measure_host(t: Transport, model: str, num_classes: int, chunk: int, threads: int,
                       artifact: Artifact | None = None) -> dict[str, Any]:
    h = t.host
    argv = [h.python_path(), "-m", "remote.costs", "--model", model, "--num-classes", str(num_classes),
            "--chunk", str(chunk), "--threads", str(threads)]
    if artifact:  # a pruned model has its own cost shape: profile the artifact, not its base
        argv += ["--checkpoint", artifact.host_path(h)]
    result = await t.run(argv, env=worker_env(h, threads), timeout_s=600)
    costs, reason = command_outcome(result, P.COSTS)
    if costs is None:
        raise E.RunFailed(f"host '{h.name}': cost profiling failed: {reason}")
    return {k: costs[k] for k in ("pieces", "compute_s", "cut_bytes", "piece_bytes", "chunk", "threads", "torch",
                                  "sustained_scale")}


async def host_profiles(transports: list[Transport], cache: JsonCache, *, model: str, num_classes: int,
                        chunk: int, threads: int | dict[str, int], artifact: Artifact | None = None,
                        ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{host name: profile}, measuring in parallel only where the cache has none; and the hosts measured.

    `threads` is one count for all hosts, or one per host (a host running two stages gives each half its cores).
    """
    def threads_of(t: Transport) -> int:
        return threads.get(t.host.name, 1) if isinstance(threads, dict) else threads

    profiles: dict[str, dict[str, Any]] = {}
    missing: list[Transport] = []
    for t in transports:
        key = profile_key(t.host, model, num_classes, chunk, threads_of(t), artifact)
        if _usable(cached := cache.get(key)):
            profiles[t.host.name] = cached
        else:
            missing.append(t)
    measured = await asyncio.gather(*(measure_host(t, model, num_classes, chunk, threads_of(t), artifact)
                                      for t in missing))
    for t, profile in zip(missing, measured, strict=True):
        cache.put(profile_key(t.host, model, num_classes, chunk, threads_of(t), artifact), profile)
        profiles[t.host.name] = profile
    return profiles, [t.host.name for t in missing]


def cost_table(stage_hosts: list[str], profiles: dict[str, dict[str, Any]],
               links: dict[tuple[str, str], Link] | None = None) -> CostTable:
    """Stage s runs on stage_hosts[s]; its pieces cost what that host measured, each hop what its link did
    (gigabit Ethernet where a link was not measured, a local copy between stages on one host)."""
    first = profiles[stage_hosts[0]]
    measured = links or {}
    links = [LOCAL_LINK if a == b else measured.get((a, b), LAN_LINK)
             for a, b in zip(stage_hosts, stage_hosts[1:], strict=False)]
    return CostTable(compute_s=[profiles[h]["compute_s"] for h in stage_hosts], cut_bytes=first["cut_bytes"],
                     links=links, piece_bytes=first["piece_bytes"])
