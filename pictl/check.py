"""`pictl check`: is every host ready to run? One result per host, gathered in parallel.

The probe (`remote/probe.py`, stdlib only) travels as `python -c SOURCE`, so a
host needs no pushed code and no venv to be checked. Host 0 opens a temporary
listener, and every host connects to it at host 0's rendezvous address: the
real path gloo's rendezvous will take.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.inventory import Cluster, Host
from pictl.transport import RemoteProcess, Transport, transport_for

PROBE_SOURCE = (Path(__file__).resolve().parent.parent / "remote" / "probe.py").read_text()


@dataclass
class HostCheck:
    host: str
    reachable: bool = False
    authenticated: bool = False
    error: str | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    clock_offset_ms: float | None = None
    clock_uncertainty_ms: float | None = None
    """Half the round trip not spent in the probe: the offset is good to about this much."""
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.authenticated and not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ready": self.ready}


def _problems(host: Host, probe: dict[str, Any]) -> list[str]:
    out = []
    if not probe.get("python_ok"):
        out.append(f"python {probe.get('python')} at {host.base_python()} is older than 3.11")
    venv = probe.get("venv", {})
    if not venv.get("exists"):
        out.append(f"no venv at {host.venv_path()} (run `pictl provision`)")
    else:
        missing = [p for p, v in venv.get("packages", {}).items() if v is None] or (["?"] if "error" in venv else [])
        if missing:
            out.append(f"venv lacks {', '.join(missing)} (run `pictl provision`)")
    iface = probe.get("interface")
    if iface and not iface.get("exists"):
        out.append(f"interface {iface['name']} does not exist")
    reach = probe.get("rendezvous")
    if reach and not reach.get("ok"):
        out.append(f"cannot reach the rendezvous {reach['target']}: {reach.get('error')}")
    return out


async def _probe(t: Transport, rendezvous: str | None) -> tuple[dict[str, Any], float, float]:
    h = t.host
    argv = [h.base_python(), "-c", PROBE_SOURCE, "report", "--venv", h.venv_path()]
    if h.interface:
        argv += ["--interface", h.interface]
    if rendezvous:
        argv += ["--connect", rendezvous]
    sent = time.time()
    result = await t.run(argv, timeout_s=60)
    received = time.time()
    if result.returncode != 0:
        raise E.TransportError(f"host '{h.name}': probe failed with {h.base_python()}: "
                               f"{(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    # NTP's estimate: the time the probe itself ran is not network delay.
    one_way = ((received - sent) - (probe["time_end"] - probe["time_start"])) / 2
    return probe, (probe["time_start"] - (sent + one_way)) * 1000.0, one_way * 1000.0


async def _listen(t: Transport) -> tuple[RemoteProcess, int]:
    proc = await t.start([t.host.base_python(), "-c", PROBE_SOURCE, "listen"])
    async for stream, line in proc.lines():
        if stream == "stdout" and line.strip().isdigit():
            return proc, int(line)
        break
    await proc.stop(grace_s=1)
    raise E.TransportError(f"host '{t.host.name}': cannot open a test listener")


async def check_cluster(cluster: Cluster) -> list[HostCheck]:
    transports = [transport_for(h) for h in cluster.hosts]
    checks = [HostCheck(h.name) for h in cluster.hosts]
    connected = await asyncio.gather(*(t.connect() for t in transports), return_exceptions=True)
    for check, res in zip(checks, connected, strict=True):
        check.reachable = not isinstance(res, BaseException) or isinstance(res, E.HostKeyError | E.AuthError)
        check.authenticated = not isinstance(res, BaseException)
        if isinstance(res, BaseException):
            check.error = str(res)
    listener: RemoteProcess | None = None
    try:
        rendezvous = None
        if checks[0].authenticated:
            try:
                listener, port = await _listen(transports[0])
                rendezvous = f"{cluster.hosts[0].rendezvous_address}:{port}"
            except E.PictlError as exc:
                checks[0].problems.append(str(exc))
        live = [(c, t) for c, t in zip(checks, transports, strict=True) if c.authenticated]
        probes = await asyncio.gather(*(_probe(t, rendezvous) for _, t in live), return_exceptions=True)
        for (check, t), res in zip(live, probes, strict=True):
            if isinstance(res, BaseException):
                check.problems.append(str(res))
                continue
            check.probe, check.clock_offset_ms, check.clock_uncertainty_ms = res[0], round(res[1], 1), round(res[2], 1)
            check.problems += _problems(t.host, res[0])
    finally:
        if listener is not None:
            await listener.stop(grace_s=2)
        await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
    return checks
