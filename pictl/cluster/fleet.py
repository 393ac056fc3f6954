"""Several hosts at once: their connections, opened once and shared, and "do this on every host" with a
result per host, so one dead Pi never hides the others.

    fleet = Fleet(hosts); await fleet.connect()      # every host connected, or one error naming each failure
    pushed = await fleet.each(push_to, "push failed")             # {host: result}, or an error
    answers = await fleet.results(probe)                          # {host: result or the exception}

A job opens its fleet through `pictl.cluster.jobs.HostJob`, which closes it on every path; `pictl check`
opens one alone (it reports an unreachable host instead of failing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from pictl.cluster.transport import Transport, raise_for_failures, transport_for
from pictl.inventory import Host

T = TypeVar("T")


class Fleet:
    """Open connections to some hosts, by name; the hosts a step works on are a subset by name."""

    def __init__(self, hosts: Iterable[Host]) -> None:
        self.transports: dict[str, Transport] = {h.name: transport_for(h) for h in hosts}

    def __getitem__(self, name: str) -> Transport:
        return self.transports[name]

    def __contains__(self, name: object) -> bool:
        return name in self.transports

    def __iter__(self) -> Iterator[Transport]:
        return iter(self.transports.values())

    def __len__(self) -> int:
        return len(self.transports)

    def only(self, names: Iterable[str]) -> list[Transport]:
        return [self.transports[n] for n in names]

    async def connect(self) -> None:
        """Connect every host; one TransportError naming every host that failed."""
        await self.each(lambda t: t.connect(), "")

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.transports.values()), return_exceptions=True)

    async def results(self, step: Callable[[Transport], Awaitable[T]], names: Iterable[str] | None = None,
                      ) -> dict[str, T | BaseException]:
        """`step` on every host (or the named ones) at once: a result or the exception, per host."""
        chosen = self.only(names) if names is not None else list(self.transports.values())
        done = await asyncio.gather(*(step(t) for t in chosen), return_exceptions=True)
        return {t.host.name: r for t, r in zip(chosen, done, strict=True)}

    async def each(self, step: Callable[[Transport], Awaitable[T]], what: str,
                   names: Iterable[str] | None = None) -> dict[str, T]:
        """`step` on every host (or the named ones) at once; if any failed, one error naming each of them."""
        found = await self.results(step, names)
        transports = self.only(found)
        raise_for_failures(list(found.values()), transports, what)
        return {name: r for name, r in found.items() if not isinstance(r, BaseException)}  # all of them
