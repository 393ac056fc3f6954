"""`pictl check`: is every host ready to run? One result per host, gathered in parallel.

The probe (`remote/host/probe.py`, stdlib only) travels as `python -c SOURCE`, so a
host needs no pushed code and no venv to be checked. Host 0 opens a temporary
listener, and every host connects to it at host 0's rendezvous address: the
real path gloo's rendezvous will take. Each host's clock is measured NTP-style
(`pictl.cluster.clock`) over the same connection.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pictl import errors as E
from pictl.cluster.clock import PROBE_SOURCE, ClockOffset, measure_clock
from pictl.cluster.fleet import Fleet
from pictl.cluster.hoststate import torch_problem
from pictl.cluster.monitor import HostSample, load_now
from pictl.cluster.transport import RemoteProcess, Transport
from pictl.cluster.warm import WarmState, warm_status
from pictl.inventory import Cluster, Host
from pictl.summary_figures import Open
from pictl.text import ascii_count


class VenvReport(Open):
    """The probe's look at the host's venv (`remote/host/probe.py`'s `_venv`)."""

    exists: Any = None
    packages: Any = None
    """Each package the run needs -> its version (None: not installed)."""
    error: Any = None
    """Why the packages could not be listed (the venv's python would not run)."""


class PackageVersions(Open):
    torch: Any = None
    timm: Any = None
    transformers: Any = None
    """Reported, not required: only `pictl generate` needs it, and says so itself."""


class InterfaceReport(Open):
    """The network interface hosts.toml names for the host, as the probe found it."""

    name: Any = None
    exists: Any = None
    address: Any = None


class ReachReport(Open):
    """Whether the host reached host 0's test listener at the rendezvous address (`--connect`)."""

    target: Any = None
    ok: Any = None
    error: Any = None


class ProbeReport(Open):
    """What `remote/host/probe.py report` says of a host (`HostCheck.probe`), read as the host wrote it: its python,
    its venv, the interface and whether it reached the rendezvous (None where the probe was not asked)."""

    python: Any = None
    python_ok: Any = None
    venv: Any = None
    interface: Any = None
    rendezvous: Any = None


@dataclass
class HostCheck:
    host: str
    reachable: bool = False
    authenticated: bool = False
    error: str | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    clock_offset_ms: float | None = None
    clock_uncertainty_ms: float | None = None
    """Half the best round trip of many exchanges: the true offset lies within this of the estimate."""
    problems: list[str] = field(default_factory=list)
    warm: dict[str, Any] | None = None
    """The host's warm process (`pictl.cluster.warm.WarmState`): pid, age, memory, what it preloaded."""
    load: dict[str, Any] | None = None
    """What keeps the host busy now, over half a second: `busy_cores` (of `cpus` online), `runnable` (the run
    queue), `cpu_wait` (the share of the time some thread waited for a CPU) and `load1`: other work, seen."""

    @property
    def ready(self) -> bool:
        return self.authenticated and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ready": self.ready}


def _problems(host: Host, report: dict[str, Any]) -> list[str]:
    out = []
    probe = ProbeReport.view(report)
    if not probe.python_ok:
        out.append(f"python {probe.python} at {host.base_python()} is older than 3.11")
    venv = VenvReport.view(probe.venv)
    if not venv.exists:
        out.append(f"no venv at {host.venv_path()} (run `pictl provision`)")
    else:
        packages: dict[str, Any] = venv.packages or {}
        # (transformers is reported, not required: only `pictl generate` needs it, and says so itself)
        missing = [p for p, v in packages.items() if v is None and p != "transformers"] or (
            ["?"] if venv.error is not None else [])
        if missing:
            out.append(f"venv lacks {', '.join(missing)} (run `pictl provision`)")
        torch = PackageVersions.view(packages).torch
        if torch is not None and (problem := torch_problem(host, {"torch": torch})):
            out.append(problem)
    if probe.interface and not (iface := InterfaceReport.view(probe.interface)).exists:
        out.append(f"interface {iface.name} does not exist")
    if probe.rendezvous and not (reach := ReachReport.view(probe.rendezvous)).ok:
        out.append(f"cannot reach the rendezvous {reach.target}: {reach.error}")
    return out


async def _probe(t: Transport, rendezvous: str | None) -> tuple[dict[str, Any], ClockOffset]:
    h = t.host
    argv = [h.base_python(), "-c", PROBE_SOURCE, "report", "--venv", h.venv_path()]
    if h.interface:
        argv += ["--interface", h.interface]
    if rendezvous:
        argv += ["--connect", rendezvous]
    result = await t.run(argv, timeout_s=60)
    if result.returncode != 0:
        raise E.TransportError(f"host '{h.name}': probe failed with {h.base_python()}: "
                               f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    return probe, await measure_clock(t)


async def _listen(t: Transport) -> tuple[RemoteProcess, int]:
    proc = await t.start([t.host.base_python(), "-c", PROBE_SOURCE, "listen"])
    async for stream, line in proc.lines():
        if stream == "stdout" and (port := ascii_count(line, most=65535)) is not None:
            return proc, port
        break
    await proc.stop(grace_s=1)
    raise E.TransportError(f"host '{t.host.name}': cannot open a test listener")


async def check_cluster(cluster: Cluster) -> list[HostCheck]:
    fleet = Fleet(cluster.hosts)  # one unreachable host is reported, not raised: the others are checked
    checks = {h.name: HostCheck(h.name) for h in cluster.hosts}
    for name, res in (await fleet.results(lambda t: t.connect())).items():
        check = checks[name]
        check.reachable = not isinstance(res, BaseException) or isinstance(res, E.HostKeyError | E.AuthError)
        check.authenticated = not isinstance(res, BaseException)
        if isinstance(res, BaseException):
            check.error = str(res)
    first = cluster.hosts[0].name
    listener: RemoteProcess | None = None
    try:
        rendezvous = None
        if checks[first].authenticated:
            try:
                listener, port = await _listen(fleet[first])
                rendezvous = f"{cluster.hosts[0].rendezvous_address}:{port}"
            except E.PictlError as exc:
                checks[first].problems.append(str(exc))
        live = [name for name, c in checks.items() if c.authenticated]
        for name, found in (await fleet.results(lambda t: _probe(t, rendezvous), live)).items():
            check = checks[name]
            if isinstance(found, BaseException):
                check.problems.append(str(found))
                continue
            probe, clock = found
            check.probe = probe
            check.clock_offset_ms = round(clock.offset_ns / 1e6, 3)
            check.clock_uncertainty_ms = round(clock.uncertainty_ns / 1e6, 3)
            check.problems += _problems(fleet[name].host, probe)
        for name, sample in (await fleet.results(load_now, live)).items():
            if isinstance(sample, HostSample) and sample.up:  # (a host that cannot be sampled shows no load)
                checks[name].load = {"busy_cores": sample.busy_cores, "cpus": sample.cpus,
                                     "runnable": sample.runnable, "cpu_wait": sample.cpu_wait, "load1": sample.load1,
                                     "power_w": sample.power_w, "power_source": sample.power_source}
        ready = [name for name in live if checks[name].probe and not checks[name].problems]
        for name, state in (await fleet.results(warm_status, ready)).items():
            # (a host whose code was never pushed has no client to ask: it shows as unknown, not as a problem)
            checks[name].warm = state.as_dict() if isinstance(state, WarmState) else {"error": str(state)}
            if isinstance(state, WarmState) and state.running and not state.answering:
                # (every job there would wait for it, then run cold: the host is not ready as it stands)
                checks[name].problems.append(f"its warm process does not answer: {state.error}")
    finally:
        if listener is not None:
            await listener.stop(grace_s=2)
        await fleet.close()
    return list(checks.values())
