"""The hosts themselves: the inventory as read, readiness, the warm process, the code, their keys, stopping
what is left (their venvs: `provision`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    HostsOpt,
    JsonOpt,
    WaitOpt,
    app,
    confirm,
    fail,
    on_fleet,
    read_cluster,
    run_cancellable,
    stderr,
    wide_console,
)
from pictl.cluster.fleet import Fleet
from pictl.cluster.swept import ANOTHER_CONTROLLERS, Sweep, SweptGroup
from pictl.inventory import Host


@app.command("hosts")
def list_hosts(hosts: Annotated[Optional[Path], typer.Option(help="Inventory file.")] = None,
               as_json: JsonOpt = False) -> None:
    """Show the inventory as pictl reads it: one row per host, defaults filled in."""
    from rich.table import Table

    try:
        cluster = read_cluster(hosts)
    except E.PictlError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps({"cluster": cluster.name, "file": str(cluster.source),
                               "hosts": [h.model_dump() for h in cluster.hosts]}))
        return
    table = Table(title=f"{cluster.name}: {cluster.source}", title_justify="left", header_style="bold", box=None)
    for heading in ("host", "transport", "address", "user", "slots", "cpus", "workdir", "venv"):
        table.add_column(heading, overflow="fold")
    for h in cluster.hosts:
        address = f"{h.address}:{h.port}" if h.port else h.address
        table.add_row(h.name, h.transport, address, h.user or "-", str(h.slots), h.cpus or "-", h.workdir,
                      h.venv or "-")
    wide_console().print(table)


@app.command()
def check(
    hosts: HostsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Is every host ready? Reachability, python, venv, packages, memory, heat, clock, network."""
    import json

    from pictl.cluster.check import check_cluster
    from pictl.headless_check import check_table

    try:
        checks = asyncio.run(check_cluster(read_cluster(hosts)))
    except E.PictlError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps({"ready": all(c.ready for c in checks), "hosts": [c.as_dict() for c in checks]}))
    else:
        wide_console().print(check_table(checks))
    not_ready = [c for c in checks if not c.ready]
    err = stderr()
    for c in not_ready:
        reason = c.error or "; ".join(c.problems)
        err.print(f"pictl: host '{c.host}' is not ready: {reason}", markup=False)
    if not_ready:
        # A host we could not log in to (down, our key refused, its key untrusted) is 4, as in `pictl run`.
        raise typer.Exit(E.EXIT_UNREACHABLE if any(not c.authenticated for c in not_ready) else E.EXIT_NOT_READY)


@app.command()
def warm(
    hosts: HostsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start every host's warm process (torch, timm and the runtime imported once; jobs are forked from it),
    after pushing the code it will serve."""
    import time

    from pictl.cluster.push import local_tree, push_to
    from pictl.cluster.warm import WarmState, warm_up

    async def push_and_warm(t: Any, files: dict[str, bytes]) -> WarmState:
        await push_to(t, files)
        return await warm_up(t)

    async def work(fleet: Fleet) -> list[WarmState | BaseException]:
        files = local_tree()
        return list((await fleet.results(lambda t: push_and_warm(t, files))).values())

    try:
        cluster = read_cluster(hosts)
        start = time.perf_counter()
        results = asyncio.run(run_cancellable(on_fleet(cluster, work, lease="warm")))
    except E.PictlError as exc:
        fail(exc)
    failed = [r for r in results if isinstance(r, BaseException)]
    if as_json:
        typer.echo(json.dumps({"hosts": {h.name: (r.as_dict() if isinstance(r, WarmState) else {"error": str(r)})
                                         for h, r in zip(cluster.hosts, results, strict=True)},
                               "seconds": round(time.perf_counter() - start, 3)}))
    for h, r in zip(cluster.hosts, results, strict=True):
        if isinstance(r, BaseException):
            stderr().print(f"pictl: error: {r if isinstance(r, E.PictlError) else f'host {h.name!r}: {r}'}",
                           markup=False, soft_wrap=True)
        elif not as_json:
            typer.echo(f"{h.name}: {r.text()}")
    if not as_json:
        typer.echo(f"warmed {len(results) - len(failed)} of {len(results)} host(s) in "
                   f"{time.perf_counter() - start:.2f}s")
    if failed:
        raise typer.Exit(max(f.exit_code if isinstance(f, E.PictlError) else E.EXIT_INTERNAL for f in failed))


@app.command()
def push(
    hosts: HostsOpt = None,
    wait: WaitOpt = False,
) -> None:
    """Sync remote/ to every host (only what changed)."""
    import time

    from pictl.cluster.push import PushResult, local_tree, push_to
    from pictl.cluster.transport import preload

    async def work(fleet: Fleet) -> list[PushResult]:
        files = local_tree()
        return list((await fleet.each(lambda t: push_to(t, files), "push failed")).values())

    try:
        cluster = read_cluster(hosts)
        preload(cluster)  # the timing below is the push, not Python importing asyncssh
        start = time.perf_counter()
        results = asyncio.run(run_cancellable(on_fleet(cluster, work, lease="push", wait=wait)))
    except E.PictlError as exc:
        fail(exc)
    for r in results:
        state = "up to date" if not (r.sent or r.removed) else f"sent {r.sent} file(s), {r.bytes_sent:,} bytes"
        typer.echo(f"{r.host}: {state}" + (f", removed {r.removed}" if r.removed else ""))
    typer.echo(f"pushed to {len(results)} host(s) in {time.perf_counter() - start:.2f}s")


@app.command()
def stop(
    all_runs: Annotated[bool, typer.Option("--all", help="Also other controllers' runs in the same workdirs.")]
    = False,
    hosts: HostsOpt = None,
) -> None:
    """Stop what this controller's runs left on the hosts (SIGTERM, then SIGKILL) and its jobs in each workdir's
    warm process, which ends once nothing else runs in it; other controllers' runs are kept (and named)
    unless --all."""
    from pictl.cluster.commands import cleanup_host
    from pictl.cluster.leases import controller_name
    from pictl.cluster.warm import WarmState, warm_stop

    async def stop_host(t: Any) -> tuple[Sweep, WarmState | None]:
        # The warm server first: it knows whose each of its jobs is, and says so; the sweep then stops the rest.
        try:
            warm: WarmState | None = await warm_stop(t, owner)
        except E.PictlError:  # no pushed code to ask with: no warm process either
            warm = None
        return Sweep.model_validate(await cleanup_host(t, orphans_only=False, owner=owner)), warm

    async def work(fleet: Fleet) -> list[tuple[Sweep, WarmState | None] | BaseException]:
        return list((await fleet.results(stop_host)).values())

    try:
        owner = None if all_runs else controller_name()
        cluster = read_cluster(hosts)
        results = asyncio.run(on_fleet(cluster, work))
    except E.PictlError as exc:
        fail(exc)
    unreachable = silent = False
    for host, res in zip(cluster.hosts, results, strict=True):
        if isinstance(res, BaseException):
            unreachable = True
            typer.echo(f"{host.name}: {res}", err=True)
            continue
        found, warm = res
        others = [k for k in found.kept if k.reason == ANOTHER_CONTROLLERS]
        foreign = [k for k in found.kept if k.reason != ANOTHER_CONTROLLERS]
        stopped_others = _holders(found.stopped, owner)
        line = (f"{host.name}: stopped {len(found.stopped)} process group(s)"
                + (f" ({stopped_others})" if stopped_others else "")
                + (f", kept {len(others)} of other controllers' runs ({_holders(others, None)}; --all stops them)"
                   if others else "")
                + (f", {len(foreign)} not ours" if foreign else ""))
        if warm is not None and warm.running and not warm.answering:
            silent = True
        typer.echo(line + _warm_stopped(warm, owner))
    if unreachable:
        raise typer.Exit(E.EXIT_UNREACHABLE)
    if silent:
        raise typer.Exit(E.EXIT_NOT_READY)


def _holders(groups: list[SweptGroup], owner: str | None) -> str:
    """Whose runs these process groups were, the controllers other than `owner` ("A's, B's"; "" if none)."""
    names = sorted({str(g.owner) for g in groups if g.owner and g.owner != owner})
    return ", ".join(f"{name}'s" for name in names)


def _warm_stopped(warm: Any, owner: str | None) -> str:
    """What `pictl stop` did to a host's warm processes, in words (`warm`: its WarmState, None if none)."""
    if warm is None or not warm.enabled:
        return ""
    if warm.running and not warm.answering:
        return f"; its warm process does not answer: {warm.error}; left as it is"
    parts = []
    if warm.stopped_jobs:
        owners = sorted({j.owner for j in warm.stopped_jobs if j.owner != owner})
        parts.append(f"ended {len(warm.stopped_jobs)} warm job(s)"
                     + (f", of {', '.join(owners)}" if owners else ""))
    if warm.kept_jobs:
        owners = sorted({j.owner for j in warm.kept_jobs})
        parts.append(f"kept its warm process (pid {warm.pid}): it runs {len(warm.kept_jobs)} job(s) of "
                     f"{', '.join(owners)} (--all ends them)")
    elif warm.pid is not None:
        parts.append(f"ended its warm process (pid {warm.pid})")
    if warm.root_ended:
        parts.append("and the root it was forked from" if parts else "ended its warm root process")
    return "; " + ", ".join(parts) if parts else ""


@app.command()
def trust(
    host: Annotated[str, typer.Argument(help="Host name from the inventory.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust the key without asking.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the host's key.", min=0.1, max=300)] = 10.0,
    hosts: HostsOpt = None,
) -> None:
    """Show a host's SSH key (type, SHA256 fingerprint), ask, and record it where pictl's connection looks."""
    try:
        trust_host(read_cluster(hosts).host(host), yes=yes, timeout=timeout)
    except E.PictlError as exc:
        fail(exc)


def trust_host(h: Host, *, yes: bool, timeout: float) -> None:
    """Fetch `h`'s key, show it, ask (unless `yes`), record it; HostKeyError if the answer is no."""
    from pictl.cluster.trust import fetch_key, record_key, resolve

    async def offered() -> Any:
        target = await resolve(h, timeout_s=timeout)
        return target, await fetch_key(target, timeout_s=timeout)

    target, key = asyncio.run(offered())
    typer.echo(f"{target.describe()} presents a {key.algorithm} key {key.fingerprint}")
    if key.already_trusted:
        typer.echo(f"already trusted as '{target.entry}' in {target.known_hosts}: nothing to do")
        return
    for old in key.replaces:
        typer.echo(f"WARNING: {target.known_hosts} trusts another key for '{target.entry}' ({old}); "
                   "trusting this one replaces it: do so only if the host was reinstalled or re-keyed")
    typer.echo(f"it would be recorded as '{target.entry}' in {target.known_hosts}")
    if not yes and not confirm(f"Trust this key for {h.name}?"):
        raise E.HostKeyError(f"host '{h.name}': key not trusted (the answer was no); nothing was written")
    record_key(target, key)
    typer.echo(f"trusted {h.name}: {key.fingerprint} recorded as '{target.entry}' in {target.known_hosts}")
