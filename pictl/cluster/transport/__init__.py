"""How pictl reaches a host: one small async interface, one implementation per kind."""

from __future__ import annotations

from pictl.cluster.transport.base import CommandResult, RemoteProcess, Transport
from pictl.inventory import Cluster, Host

__all__ = ["CommandResult", "RemoteProcess", "Transport", "preload", "raise_for_failures", "transport_for"]


def preload(cluster: Cluster) -> None:
    """Import the transports a cluster needs now (asyncssh takes about 0.35 s to import)."""
    if any(h.transport == "ssh" for h in cluster.hosts):
        import pictl.cluster.transport.ssh  # noqa: F401


def transport_for(host: Host) -> Transport:
    if host.transport == "local":
        from pictl.cluster.transport.local import LocalTransport

        return LocalTransport(host)
    from pictl.cluster.transport.ssh import SshTransport

    return SshTransport(host)


def raise_for_failures(results: list[object], transports: list[Transport], what: str) -> None:
    """One TransportError naming every host whose step failed (results from gather(return_exceptions=True))."""
    from pictl.errors import PictlError, TransportError

    failed = [str(r) if isinstance(r, PictlError) else f"host '{t.host.name}': {r}"
              for t, r in zip(transports, results, strict=True) if isinstance(r, BaseException)]
    if failed:
        raise TransportError(f"{what}: " + "; ".join(failed) if what else "; ".join(failed))
