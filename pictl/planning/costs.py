"""Cost profiles for the `balanced` policy: measured on each host, cached, turned into a CostTable.

`remote.profiling.costs` times every piece of the model on the host inside whole passes run
back to back (with the run's chunk and thread count), and reports the bytes entering
each cut and what copying them costs the host. Hosts that share one machine are
profiled one at a time. A profile is cached per host, interpreter, model, chunk,
threads and remote code, so only the first balanced run (or `pictl profile`) pays
the measurement; a run that measured its stages slower or faster than their
profiles stores the correction beside the profile, and the next run starts from it.

Links are measured too (`remote/profiling/linktest.py`, stdlib, sent with `python -c`):
from each stage host to the next, the round-trip latency of small pings and the
rate of a stage-sized stream, cached per host pair and addresses. A hop between
two stages on one host is costed as a local copy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from pydantic import ValidationError

import remote
from pictl import errors as E
from pictl.cluster.artifacts import Artifact
from pictl.cluster.commands import python_module, worker_env
from pictl.cluster.hoststate import torch_refusal
from pictl.cluster.transport import Transport
from pictl.events import command_outcome
from pictl.inventory import Host
from pictl.records.cache import JsonCache
from pictl.summary_figures import Open
from pictl.text import ascii_count
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.balance import CostTable, Link
from remote.floor.run_records import Costs
from remote.floor.spec import HF_PREFIX, RunSpec

T = TypeVar("T")
LAN_LINK = Link(latency_s=0.0002, bytes_per_s=110e6)  # what 1 GbE delivers between Pis
LOCAL_LINK = Link(latency_s=0.00002, bytes_per_s=2e9)
LINK_SOURCE = remote.source("profiling/linktest.py")
LINK_BYTES = 16 << 20  # a few stage outputs' worth: 0.15 s on gigabit Ethernet
LINK_MAX_AGE_S = 60.0
"""How long a measured link stands for the next runs. A link is shared and changes (another team's traffic, Wi-Fi
against Ethernet, a switch port): one cached longer once led `balanced` to cut ResNet-50 where 3.2 MB an image
crossed a link by then ten times slower (`bench.models`, 0.49x against equal's 0.96x). Measuring one costs a
stream of LINK_BYTES, 0.15 s at a gigabit: a sweep's points within the minute share it."""


class MeasuredLink(Open):
    """A link as `linktest.py send` prints it (its other figures let through), and as the link cache keeps it."""

    latency_s: float
    """Half the median round trip of the small pings."""
    bytes_per_s: float
    """The rate of the stage-sized stream."""
    send_s_per_byte: float = 0.0
    """What a byte sent costs the sender's compute (CPU time times its wall time per CPU second; 0: not measured)."""
    recv_s_per_byte: float = 0.0
    """... and what a byte received costs the receiver's."""
    measured_at: float | None = None
    """When it was measured (the cache's; None: an entry from before, measured again)."""

    def link(self) -> Link:
        return Link(self.latency_s, self.bytes_per_s, self.send_s_per_byte, self.recv_s_per_byte)


class CachedProfile(Open):
    """A host's cost profile as the cache keeps it (`PROFILE_FIELDS` of the host's `Costs`, and the correction a
    run stored beside it, `keep_corrections`), read as written: `usable_profile` checks the fields are there."""

    pieces: list[str]
    compute_s: list[float]
    """Seconds per piece, per microbatch."""
    cut_bytes: list[int]
    """The bytes entering the cut after each piece, per microbatch."""
    piece_bytes: list[int]
    comm_s_per_byte: float
    """What copying a byte costs the host."""
    pass_ms: float
    measured_until: float
    correction: float = 1.0
    """Measured / profiled time of the host's stages in the last run that corrected it (1.0: never corrected)."""
    corrected_at: Any = None
    """When it was corrected (seconds since the epoch; None: never, or an older record)."""


def link_key(src: Host, dst: Host) -> str:
    return JsonCache.key({"link": [src.name, src.address, dst.name, dst.rendezvous_address]})


async def measure_link(src: Transport, dst: Transport, nbytes: int = LINK_BYTES) -> Link:
    """Stream `nbytes` from src to dst's rendezvous address (the path gloo takes) after timing pings."""
    address = dst.host.rendezvous_address
    server = await dst.start([dst.host.base_python(), "-c", LINK_SOURCE, "serve", address])
    try:
        port = None
        async for stream, line in server.lines():
            if stream == "stdout":
                port = ascii_count(line, most=65535)
            break
        if port is None:
            raise E.TransportError(f"host '{dst.host.name}': cannot listen on {address} to measure the link")
        result = await src.run([src.host.base_python(), "-c", LINK_SOURCE, "send", address, str(port), str(nbytes)],
                               timeout_s=120)
        if result.returncode != 0:
            raise E.TransportError(f"link {src.host.name} -> {dst.host.name}: "
                                   f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
        measured = MeasuredLink.model_validate(json.loads(result.stdout.strip().splitlines()[-1]))
    finally:
        await server.stop(grace_s=1)
    return measured.link()


def _cached_link(cached: dict[str, Any] | None, max_age_s: float) -> Link | None:
    """The link the cache holds, None when it holds none it can be trusted for (measured again): none, one that
    is not a link, or one older than `max_age_s`."""
    try:
        found = MeasuredLink.model_validate(cached)
    except ValidationError:
        return None
    fresh = found.measured_at is not None and 0 <= time.time() - found.measured_at <= max_age_s
    return found.link() if found.bytes_per_s > 0 and fresh else None


async def link_profiles(pairs: list[tuple[Transport, Transport]], cache: JsonCache, *,
                        max_age_s: float = LINK_MAX_AGE_S) -> tuple[dict[tuple[str, str], Link], list[str]]:
    """{(src, dst): Link} for each pair of different hosts, one at a time (they share the network); a link measured
    within `max_age_s` is taken from the cache, any other is measured now."""
    links: dict[tuple[str, str], Link] = {}
    measured: list[str] = []
    for src, dst in pairs:
        names = (src.host.name, dst.host.name)
        if names in links or names[0] == names[1]:
            continue
        cached = _cached_link(cache.get(link_key(src.host, dst.host)), max_age_s)
        if cached is not None:
            links[names] = cached
            continue
        links[names] = link = await measure_link(src, dst)
        cache.put(link_key(src.host, dst.host),
                  MeasuredLink(**dataclasses.asdict(link), measured_at=round(time.time(), 3)).written())
        measured.append(f"{names[0]}->{names[1]}")
    return links, measured


def profile_key(host: Host, model: str, num_classes: int, chunk: int, threads: int, *, code: str,
                artifact: Artifact | None = None, tokens: int = RunSpec.tokens) -> str:
    """A profile depends on the host, its interpreter, the model (a text model's tokens per input too), the
    microbatch, the threads and the code (`code`: the pushed tree's digest)."""
    fields = {"host": [host.name, host.address, host.python_path()], "model": model,
              "artifact": artifact.digest if artifact else None,
              "num_classes": num_classes, "chunk": chunk, "threads": threads, "code": code}
    if model.startswith(HF_PREFIX):  # (a key of its own: images' keys stay as they were)
        fields["tokens"] = tokens
    return JsonCache.key(fields)


PROFILE_FIELDS = ("pieces", "compute_s", "cut_bytes", "piece_bytes", "chunk", "threads", "torch", "spread",
                  "passes", "pass_ms", "attempts", "comm_s_per_byte", "measured_from", "measured_until")


def usable_profile(profile: object) -> TypeGuard[dict[str, Any]]:
    """A corrupt, truncated or old-format profile is measured again, never trusted."""
    if not isinstance(profile, dict) or not all(k in profile for k in PROFILE_FIELDS):
        return False
    found = CachedProfile.view(profile)
    n = len(found.pieces)
    return n > 0 and all(len(figures) == n for figures in (found.compute_s, found.cut_bytes, found.piece_bytes))


async def measure_host(t: Transport, model: str, num_classes: int, chunk: int, threads: int,
                       artifact: Artifact | None = None, tokens: int = RunSpec.tokens) -> dict[str, Any]:
    h = t.host
    argv = python_module(h, entries.COSTS.module, "--model", model, "--num-classes", str(num_classes),
                         "--chunk", str(chunk), "--threads", str(threads), "--tokens", str(tokens))
    if artifact:  # a pruned model has its own cost shape: profile the artifact, not its base
        argv += ["--checkpoint", artifact.host_path(h)]
    result = await t.run(argv, env=worker_env(h, threads), timeout_s=600)
    costs, reason = command_outcome(result, Costs)
    if costs is None and result.returncode == P.EXIT_BAD_INPUT:  # the model itself is wrong: bad input, exit 2
        raise E.ConfigError(reason)
    if costs is None:  # (under balanced, the first thing to run torch on a host: a torch outside the range is exit 6)
        raise await torch_refusal(t) or E.RunFailed(f"host '{h.name}': cost profiling failed: {reason}")
    return {k: getattr(costs, k) for k in PROFILE_FIELDS}


MACHINE_ID = "cat /etc/machine-id /proc/sys/kernel/random/boot_id 2>/dev/null || true"


async def machine_of(t: Transport) -> str:
    """What identifies the machine behind a host: machine id and boot id where readable, else its address.

    Hosts on one machine (the local cluster, network namespaces, containers) share its cores: timed at
    once, each would measure the others' load.
    """
    if t.host.transport == "local":
        return "this machine"
    result = await t.run(["sh", "-c", MACHINE_ID], timeout_s=30)
    ids = result.stdout.split()
    return " ".join(ids) if len(ids) == 2 else f"{t.host.address}:{t.host.port or 22}"


async def measure_one_at_a_time(transports: list[Transport], measure: Callable[[Transport], Awaitable[T]],
                                same: Callable[[Transport], Hashable]) -> tuple[list[T], list[list[str]]]:
    """`measure` on every host: hosts on different machines at once, hosts sharing a machine one after
    another, and hosts of one machine with the same `same(t)` (one address, interpreter and thread count:
    the shipped local cluster) once for all of them.
    Returns the results in order, and the groups of host names that shared a machine."""
    machines = await asyncio.gather(*(machine_of(t) for t in transports))
    groups: dict[str, dict[Hashable, list[int]]] = {}
    for i, machine in enumerate(machines):
        groups.setdefault(machine, {}).setdefault(same(transports[i]), []).append(i)
    results: list[Any] = [None] * len(transports)

    async def in_turn(twins: dict[Hashable, list[int]]) -> None:
        for indices in twins.values():
            result = await measure(transports[indices[0]])
            for i in indices:
                results[i] = result

    await asyncio.gather(*(in_turn(twins) for twins in groups.values()))
    shared = [[transports[i].host.name for ix in twins.values() for i in ix]
              for twins in groups.values() if sum(map(len, twins.values())) > 1]
    return results, shared


@dataclass(frozen=True)
class Profiles:
    """Cost profiles of some hosts, where each came from, and the corrections earlier runs measured."""

    by_host: dict[str, dict[str, Any]]
    measured: list[str]
    """Hosts profiled now (the others came from the cache)."""
    shared: list[list[str]]
    """Groups of just-measured hosts that share one machine (profiled one at a time)."""

    use_corrections: bool = True
    """False (`--no-refine`): the profiles alone, as measured."""

    def profile(self, host: str) -> CachedProfile:
        """The host's profile read by field, as measured or cached."""
        return CachedProfile.view(self.by_host[host])

    def correction(self, host: str) -> float:
        """How much slower than its profile a run found the host (1.0: never corrected, or not used)."""
        return float(self.profile(host).correction) if self.use_corrections else 1.0

    def correction_age_s(self, host: str) -> float | None:
        """How long ago a run corrected the host's profile (None: never, an older record, or not used)."""
        at = self.profile(host).corrected_at
        return max(0.0, time.time() - at) if self.use_corrections and isinstance(at, (int, float)) else None


async def host_profiles(transports: list[Transport], cache: JsonCache, *, model: str, num_classes: int,
                        chunk: int, threads: int | dict[str, int], code: str, artifact: Artifact | None = None,
                        tokens: int = RunSpec.tokens, use_corrections: bool = True,
                        announce: Callable[[str], None] = lambda _line: None) -> Profiles:
    """Every host's profile: from the cache, or measured now (hosts sharing a machine one at a time).

    `threads` is one count for all hosts, or one per host (a host running two stages gives each half its cores).
    `announce` hears a line as each host's profiling starts and ends (10-20 s each on a first run: never silent).
    """
    def count(t: Transport) -> int:
        return threads.get(t.host.name, 1) if isinstance(threads, dict) else threads

    def key(t: Transport) -> str:
        return profile_key(t.host, model, num_classes, chunk, count(t), code=code, artifact=artifact, tokens=tokens)

    async def measure(t: Transport) -> dict[str, Any]:
        announce(f"profiling {t.host.name}: each piece of {model} timed in whole passes (once per host, model, "
                 "chunk and threads; cached after)")
        began = time.monotonic()
        profile = await measure_host(t, model, num_classes, chunk, count(t), artifact, tokens)
        announce(f"{t.host.name} profiled in {time.monotonic() - began:.0f} s "
                 f"({CachedProfile.view(profile).pass_ms:.0f} ms a pass)")
        return profile

    def same(t: Transport) -> Hashable:
        return t.host.address, t.host.python_path(), count(t)

    profiles: dict[str, dict[str, Any]] = {}
    missing: list[Transport] = []
    for t in transports:
        if usable_profile(cached := cache.get(key(t))):
            profiles[t.host.name] = cached
        else:
            missing.append(t)
    measured, shared = await measure_one_at_a_time(missing, measure, same) if missing else ([], [])
    for t, profile in zip(missing, measured, strict=True):
        cache.put(key(t), profile)
        profiles[t.host.name] = profile
    return Profiles(profiles, [t.host.name for t in missing], shared, use_corrections)


def keep_corrections(cache: JsonCache, hosts: dict[str, Host], corrections: dict[str, float], *,
                     model: str, num_classes: int, chunk: int, threads: dict[str, int], code: str,
                     artifact: Artifact | None = None, tokens: int = RunSpec.tokens) -> None:
    """Store what a run measured (per host: measured / profiled time) with the host's profile, so the next
    run on the cluster starts from the corrected model."""
    for name, factor in corrections.items():
        key = profile_key(hosts[name], model, num_classes, chunk, threads.get(name, 1), code=code, artifact=artifact,
                          tokens=tokens)
        if usable_profile(profile := cache.get(key)):
            cache.put(key, {**profile, "correction": round(factor, 4), "corrected_at": round(time.time(), 1)})


def cost_table(stage_hosts: list[str], profiles: Profiles,
               links: dict[tuple[str, str], Link] | None = None, *, wire_ratio: float = 1.0) -> CostTable:
    """Stage s runs on stage_hosts[s]; its pieces cost what that host measured (times the correction an
    earlier run found), each hop what its link did (gigabit Ethernet where a link was not measured, a
    local copy between stages on one host). `wire_ratio`: the bytes a cut sends under `--wire`, over fp32
    (a slow link then moves cuts to where the compressed state is small)."""
    stages = [profiles.profile(h) for h in stage_hosts]
    measured = links or {}
    hops = [LOCAL_LINK if a == b else measured.get((a, b), LAN_LINK)
            for a, b in zip(stage_hosts, stage_hosts[1:], strict=False)]
    table = CostTable(compute_s=[p.compute_s for p in stages], cut_bytes=[b * wire_ratio for b in stages[0].cut_bytes],
                      links=hops, comm_s_per_byte=[p.comm_s_per_byte for p in stages],
                      piece_bytes=stages[0].piece_bytes)
    return table.corrected([profiles.correction(h) for h in stage_hosts])
