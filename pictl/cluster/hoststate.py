"""What a run learns about its hosts before the serial baseline, and when two host states compare.

One round trip per host (`remote/host/probe.py state`, stdlib only, sent as `python -c`):
the host's state (other work's load, CPUs and CPU quota, governor and frequency,
temperature and throttling, its kernel's boot id), the venv's torch/timm versions
read from package metadata (no torch import), and, for the baseline's host, the
checkpoint's content hash (cached on the host by path, size and mtime).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from pictl import errors as E
from pictl.cluster.clock import PROBE_SOURCE
from pictl.cluster.monitor import HostSample, summarize_samples
from pictl.cluster.transport import Transport
from pictl.inventory import Host
from remote.torch_support import unsupported

LOAD_TOLERANCE_CORES = 0.5
"""Other work on a host may differ by this many busy cores between a baseline and its reuse."""
HOT_C = 80.0
"""A Raspberry Pi 4/5 starts throttling its clock at 80 C (its soft limit)."""
SAMPLE_S = 0.4
"""How long the baseline's host is watched for other work (the probe sleeps meanwhile), in 4 windows whose
least busy one counts (`remote/host/probe.py`): lasting work, not a process starting or exiting."""

# vcgencmd get_throttled: bits 0-3 describe now, bits 16-19 "since boot".
_THROTTLE_NOW = {0x1: "under-voltage", 0x2: "frequency capped", 0x4: "throttled", 0x8: "soft temperature limit"}


@dataclass(frozen=True)
class HostFacts:
    """One host as a run found it."""

    host: str
    state: dict[str, Any]
    packages: dict[str, str | None] = field(default_factory=dict)
    python: str | None = None
    checkpoint: dict[str, Any] | None = None
    """{"path", "sha256", "size", "cached"}, or {"path", "error"}; None when there is no checkpoint to hash."""

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "python": self.python, "packages": self.packages, "checkpoint": self.checkpoint}


async def read_facts(t: Transport, *, sample_s: float = 0.0, checkpoint: str | None = None,
                     base_dir: str | None = None) -> HostFacts:
    h = t.host
    argv = [h.base_python(), "-c", PROBE_SOURCE, "state", "--venv", h.venv_path(), "--sample-s", str(sample_s)]
    if checkpoint:
        argv += ["--checkpoint", checkpoint, "--base-dir", base_dir or h.workdir,
                 "--hash-cache", f"{h.workdir.rstrip('/')}/cache/checkpoint-sha256.json"]
    result = await t.run(argv, timeout_s=300)  # hashing a large checkpoint the first time takes a while
    try:
        out = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        out = None
    if result.returncode != 0 or not isinstance(out, dict):
        raise E.TransportError(f"host '{h.name}': cannot read its state with {h.base_python()}: "
                               f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    venv = out.get("venv") or {}
    return HostFacts(h.name, out["state"], venv.get("packages") or {}, venv.get("python"), out.get("checkpoint"))


async def read_run_facts(first: Transport, others: list[Transport], *, checkpoint: str | None,
                         base_dir: str) -> dict[str, HostFacts]:
    """Every host's facts; the first host (the baseline's) is read last and alone, watched for other work
    for `SAMPLE_S`, so the other hosts' probes (the same machine on a local cluster) are not counted."""
    found = await asyncio.gather(*(read_facts(t) for t in others), return_exceptions=True)
    facts = {t.host.name: f for t, f in zip(others, found, strict=True) if isinstance(f, HostFacts)}
    for t, f in zip(others, found, strict=True):
        if isinstance(f, BaseException):
            raise f if isinstance(f, E.PictlError) else E.TransportError(f"host '{t.host.name}': {f}")
    facts[first.host.name] = await read_facts(first, sample_s=SAMPLE_S, checkpoint=checkpoint, base_dir=base_dir)
    return facts


def torch_problem(host: Host, packages: dict[str, str | None]) -> str | None:
    """Why `host`'s venv cannot run the host code for its torch (none, or outside `remote.torch_support`'s
    range), in words that say what to do; None when it can."""
    why = unsupported(packages.get("torch"))
    return f"its venv {host.venv_path()} {why}: run `pictl provision`" if why else None


def refuse_unsupported_torch(hosts: list[Host], facts: dict[str, HostFacts]) -> None:
    """NotReady (exit 6) naming every host whose torch the host code does not run on, before anything runs there."""
    why = [f"host '{h.name}': {problem}" for h in hosts
           if h.name in facts and (problem := torch_problem(h, facts[h.name].packages))]
    if why:
        raise E.NotReady("; ".join(why))


async def torch_refusal(t: Transport) -> E.NotReady | None:
    """After a failure on a host: the refusal to report instead when its torch is the cause (None when it is
    not, or cannot be read)."""
    try:
        facts = await read_facts(t)
        refuse_unsupported_torch([t.host], {t.host.name: facts})
    except E.NotReady as exc:
        return exc
    except E.PictlError:
        pass
    return None


def throttling(value: str | None) -> list[str]:
    """What `vcgencmd get_throttled` says is happening now (empty: nothing, or not a Pi)."""
    try:
        bits = int(value, 16) if value else 0
    except ValueError:
        return []
    return [why for bit, why in _THROTTLE_NOW.items() if bits & bit]


def capacity(state: dict[str, Any]) -> float:
    """Cores the host's processes may use: its CPUs, or fewer under a CPU quota."""
    cpus = float(state.get("cpus") or 1)
    quota = state.get("cpu_quota")
    return min(cpus, float(quota)) if quota else cpus


def _hot(state: dict[str, Any]) -> bool:
    return (state.get("temperature_c") or 0.0) >= HOT_C


def state_change(then: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """Why a serial run measured on a host in state `then` does not stand for one in state `now`; None if
    they compare: same CPUs, quota, governor and top frequency, the same throttling and heat, and other work
    within LOAD_TOLERANCE_CORES busy cores."""
    if not then:
        return "the cached baseline recorded no host state"
    changes = []
    for key, what in (("cpus", "CPUs"), ("cpu_quota", "CPU quota"), ("governor", "governor"),
                      ("max_freq_mhz", "top frequency (MHz)")):
        if then.get(key) != now.get(key):
            changes.append(f"{what} {then.get(key)} -> {now.get(key)}")
    before, after = then.get("busy_cores"), now.get("busy_cores")
    if before is not None and after is not None and abs(before - after) > LOAD_TOLERANCE_CORES:
        changes.append(f"other work {before:.1f} -> {after:.1f} busy cores")
    if throttling(then.get("throttled")) != throttling(now.get("throttled")):
        changes.append(f"throttling {', '.join(throttling(then.get('throttled'))) or 'none'} -> "
                       f"{', '.join(throttling(now.get('throttled'))) or 'none'}")
    if _hot(then) != _hot(now):
        changes.append(f"temperature {then.get('temperature_c')} -> {now.get('temperature_c')} C")
    return "; ".join(changes) or None


def host_records(hosts: list[tuple[str, list[int], int | None]], facts: dict[str, HostFacts],
                 samples: list[HostSample], windows: dict[str, list[float]], *,
                 pipeline_ready_at: float | None = None) -> dict[str, Any]:
    """The summary's `hosts`: per (name, ranks, threads) of a run, its state and versions at the start and
    what its samples saw while the serial baseline (first host only) and the pipeline ran."""
    out: dict[str, Any] = {}
    for i, (name, ranks, threads) in enumerate(hosts):
        mine = [x for x in samples if x.host == name]
        during = {}
        if "baseline" in windows and i == 0:
            during["during_baseline"] = summarize_samples(mine, *windows["baseline"])
        if "pipeline" in windows:
            start, end = windows["pipeline"]
            during["during_pipeline"] = summarize_samples(mine, pipeline_ready_at or start, end)
        out[name] = {"stages": ranks, "threads": threads, **(facts[name].to_json() if name in facts else {}), **during}
    return out
