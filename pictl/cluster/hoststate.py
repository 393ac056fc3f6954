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

from pydantic import BaseModel, ValidationError

from pictl import errors as E
from pictl.cluster.clock import PROBE_SOURCE
from pictl.cluster.monitor import HostSample, summarize_samples
from pictl.cluster.transport import Transport
from pictl.inventory import Host, parse_cpu_list
from pictl.summary import validation_problem
from pictl.summary_models import HostState
from remote.floor.torch_support import unsupported

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


class _Venv(BaseModel):
    packages: dict[str, str | None] | None = None
    python: str | None = None


class _ProbeAnswer(BaseModel):
    """What `remote/host/probe.py state` prints: the host's state, its venv's versions, the checkpoint's hash."""

    state: dict[str, Any]
    venv: _Venv | None = None
    checkpoint: dict[str, Any] | None = None


State = HostState | dict[str, Any]
"""A host's state as the probe read it: the typed `HostState`, or the dict a record or the probe holds."""


def _typed(state: State) -> HostState:
    """The state read by field: its own values (not coerced), a key it lacks read as None."""
    return state if isinstance(state, HostState) else HostState.view(state)


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
    try:
        probe = _ProbeAnswer.model_validate(out)
    except ValidationError as exc:
        raise E.TransportError(f"host '{h.name}': its state is not what the probe writes "
                               f"({validation_problem(exc)})") from None
    venv = probe.venv or _Venv()
    return HostFacts(h.name, probe.state, venv.packages or {}, venv.python, probe.checkpoint)


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
    """Why `host`'s venv cannot run the host code for its torch (none, or outside `remote.floor.torch_support`'s
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


def capacity(state: State) -> float:
    """Cores the host's processes may use: its CPUs (the ones it is pinned to), or fewer under a CPU quota."""
    st = _typed(state)
    cpus = float(st.cpus or 1)
    quota = st.cpu_quota
    return min(cpus, float(quota)) if quota else cpus


def other_work_cores(state: State) -> float | None:
    """Cores of the host's own that other work took when the probe looked: its busy cores, less what they
    leave free beyond its quota. A host capped at 0.4 core on 2 CPUs loses nothing to 1.5 busy cores (0.5 are
    free, more than it may use), and its throttling is no busy core at all; an uncapped host loses them all."""
    st = _typed(state)
    busy = st.busy_cores
    if not isinstance(busy, int | float):
        return None
    cpus = float(st.cpus or 1)
    return round(max(0.0, float(busy) - (cpus - capacity(st))), 2)


def machines(states: dict[str, State]) -> list[list[str]]:
    """Hosts grouped by the cores they share: one kernel (the same boot id) and cores that overlap. Hosts
    pinned to cores of their own (`cpus`) on one workstation are machines apart; an unpinned host overlaps
    every other on its kernel. Inventory order is kept."""
    typed = {name: _typed(state) for name, state in states.items()}

    def cores(state: HostState) -> frozenset[int] | None:
        text = state.cpu_list
        try:
            return parse_cpu_list(text) if isinstance(text, str) else None
        except ValueError:
            return None

    def share(a: str, b: str) -> bool:
        if (typed[a].boot_id or f"host:{a}") != (typed[b].boot_id or f"host:{b}"):
            return False
        mine, theirs = cores(typed[a]), cores(typed[b])
        return mine is None or theirs is None or bool(mine & theirs)

    groups: list[list[str]] = []
    for name in states:
        joined = [g for g in groups if any(share(name, h) for h in g)]
        groups = [g for g in groups if g not in joined] + [[h for g in joined for h in g] + [name]]
    order = list(states)
    return sorted((sorted(g, key=order.index) for g in groups), key=lambda g: order.index(g[0]))


def machine_cpus(states: list[State]) -> int:
    """CPUs of hosts that share cores (`machines`): the union of their pinned cores, or the machine's CPUs when
    any of them is unpinned."""
    union: set[int] = set()
    typed = [_typed(state) for state in states]
    for state in typed:
        text = state.cpu_list
        if not isinstance(text, str):
            return max(int(s.cpus_online or s.cpus or 1) for s in typed)
        try:
            union |= parse_cpu_list(text)
        except ValueError:
            return max(int(s.cpus or 1) for s in typed)
    return len(union) or 1


def _hot(state: HostState) -> bool:
    return (state.temperature_c or 0.0) >= HOT_C


def state_change(then_state: State | None, now_state: State) -> str | None:
    """Why a serial run measured on a host in state `then` does not stand for one in state `now`; None if
    they compare: same CPUs, quota, governor and top frequency, the same throttling and heat, and other work
    within LOAD_TOLERANCE_CORES busy cores."""
    if not then_state:
        return "the cached baseline recorded no host state"
    then, now = _typed(then_state), _typed(now_state)
    changes = []
    for key, what in (("cpus", "CPUs"), ("cpu_list", "cores"), ("cpu_quota", "CPU quota"), ("governor", "governor"),
                      ("max_freq_mhz", "top frequency (MHz)")):
        if getattr(then, key) != getattr(now, key):
            changes.append(f"{what} {getattr(then, key)} -> {getattr(now, key)}")
    # Other work as the host feels it: under a quota, busy cores it could not have used change nothing (and
    # where the CPUs or the quota changed, that is the change to name).
    before, after = other_work_cores(then), other_work_cores(now)
    resized = any(getattr(then, key) != getattr(now, key) for key in ("cpus", "cpu_list", "cpu_quota"))
    if not resized and before is not None and after is not None and abs(before - after) > LOAD_TOLERANCE_CORES:
        changes.append(f"other work {before:.1f} -> {after:.1f} busy cores")
    if throttling(then.throttled) != throttling(now.throttled):
        changes.append(f"throttling {', '.join(throttling(then.throttled)) or 'none'} -> "
                       f"{', '.join(throttling(now.throttled)) or 'none'}")
    if _hot(then) != _hot(now):
        changes.append(f"temperature {then.temperature_c} -> {now.temperature_c} C")
    return "; ".join(changes) or None


def host_records(hosts: list[tuple[str, list[int], int | None]], facts: dict[str, HostFacts],
                 samples: list[HostSample], windows: dict[str, list[float]], *,
                 pipeline_ready_at: float | None = None) -> dict[str, Any]:
    """The summary's `hosts`: per (name, ranks, threads) of a run, its state and versions at the start and
    what its samples saw while the serial baseline (first host only) and the pipeline ran."""
    out: dict[str, Any] = {}
    for i, (name, ranks, threads) in enumerate(hosts):
        mine = [x for x in samples if x.host == name]
        during: dict[str, Any] = {}
        baseline, compute, pipeline = (windows.get(name) for name in ("baseline", "baseline_compute", "pipeline"))
        if baseline is not None and i == 0:  # its power over its passes alone (`compute`), not its start-up's
            during |= {"during_baseline": summarize_samples(mine, *baseline,
                                                             power_from=compute[0] if compute else None)}
        if pipeline is not None:
            start, end = pipeline
            during |= {"during_pipeline": summarize_samples(mine, pipeline_ready_at or start, end)}
        out[name] = {"stages": ranks, "threads": threads, **(facts[name].to_json() if name in facts else {}), **during,
                     "power_meter": next((x.power_source for x in mine if x.power_source), None)}
    return out
