"""How pictl reaches a host: one small async interface, one implementation per kind."""

from __future__ import annotations

from pictl.inventory import Host
from pictl.transport.base import CommandResult, RemoteProcess, Transport

__all__ = ["CommandResult", "RemoteProcess", "Transport", "transport_for"]


def transport_for(host: Host) -> Transport:
    if host.transport == "local":
        from pictl.transport.local import LocalTransport

        return LocalTransport(host)
    from pictl.transport.ssh import SshTransport

    return SshTransport(host)
