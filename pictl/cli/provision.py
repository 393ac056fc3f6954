"""The hosts' venvs: `pictl provision` (the pinned torch stack, online or from wheels) and `pictl wheels`
(those wheels gathered for the hosts' platform, for a lab without internet)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer

from pictl import errors as E
from pictl.cli.common import HostsOpt, WaitOpt, app, fail, on_fleet, read_cluster, run_cancellable, stderr
from pictl.cluster.fleet import Fleet


@app.command()
def provision(
    wheels: Annotated[Optional[Path], typer.Option(help="Offline: install only from these wheels.")] = None,
    installer: Annotated[str, typer.Option(help="auto (uv when the host has it, else pip) | uv | pip")] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Install again even when up to date.")] = False,
    extra_index_url: Annotated[Optional[str], typer.Option(help="Online: another index, e.g. CPU-only torch.")] = None,
    hosts: HostsOpt = None,
    wait: WaitOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every installer line.")] = False,
) -> None:
    """Create each host's venv and install the pinned torch stack (only where something changed)."""
    import time

    from pictl.cluster.provision import ProvisionError, ProvisionResult, Wheelhouse, provision_all

    err = stderr()
    last_step: dict[str, str] = {}

    def progress(host: str, message: str) -> None:
        # Step changes always; installer lines only with -v (pip is chatty).
        step = message.split(":", 1)[0]
        if verbose or (message.endswith("...") and last_step.get(host) != step) or message.startswith("sending"):
            err.print(f"{host}: {message}", markup=False)
        last_step[host] = step

    async def work(fleet: Fleet) -> list[ProvisionResult | BaseException]:
        return await provision_all(list(fleet), Wheelhouse(wheels) if wheels else None, force=force,
                                   installer=installer, extra_index_url=extra_index_url, progress=progress,
                                   wait=wait)

    start = time.perf_counter()
    try:
        if installer not in ("auto", "uv", "pip"):
            raise E.ConfigError(f"--installer: '{installer}' is not one of auto, uv, pip")
        if wheels is not None and not wheels.is_dir():
            raise E.ConfigError(f"--wheels: {wheels} is not a directory")
        if wheels is not None and extra_index_url:
            raise E.ConfigError("--extra-index-url: offline (--wheels) installs use no index")
        cluster = read_cluster(hosts)
        results = asyncio.run(run_cancellable(on_fleet(cluster, work)))
    except E.PictlError as exc:
        fail(exc)
    failures = []
    for host, r in zip(cluster.hosts, results, strict=True):
        if isinstance(r, BaseException):
            failures.append(r)
            err.print(f"pictl: error: {r if isinstance(r, E.PictlError) else f'host {host.name!r}: {r}'}",
                      markup=False, soft_wrap=True)
        elif r.state == "installed":
            typer.echo(f"{r.host}: installed with {r.installer} in {r.seconds:.1f}s")
        elif r.state == "skipped":
            typer.echo(f"{r.host}: uses the controller's Python (no venv configured), nothing to do")
        else:
            typer.echo(f"{r.host}: up to date")
    typer.echo(f"provisioned {len(results) - len(failures)} of {len(results)} host(s) "
               f"in {time.perf_counter() - start:.2f}s")
    if failures:
        codes = {f.exit_code if isinstance(f, E.PictlError) else E.EXIT_INTERNAL for f in failures}
        raise typer.Exit(E.EXIT_UNREACHABLE if E.EXIT_UNREACHABLE in codes else
                         ProvisionError.exit_code if ProvisionError.exit_code in codes else max(codes))


@app.command()
def wheels(
    dest: Annotated[Path, typer.Argument(help="Directory to fill with wheels (created if missing).")],
    platform: Annotated[str, typer.Option(help="Host CPU: aarch64 (Raspberry Pi 4/5), armv7l or x86_64.")] = "aarch64",
    python_version: Annotated[str, typer.Option(help="The hosts' python, e.g. 3.11.")] = "3.11",
    extra_index_url: Annotated[Optional[str], typer.Option(help="Another index, e.g. a CPU-only torch one.")] = None,
) -> None:
    """Gather the pinned requirements as wheels for the hosts' platform (for `provision --wheels`)."""
    from pictl.cluster.wheels import gather_wheels
    from pictl.records.runs import writable_dir

    try:
        writable_dir(dest, "DEST")
        files = gather_wheels(dest, platform=platform, python_version=python_version,
                              extra_index_url=extra_index_url)
    except E.PictlError as exc:
        fail(exc)
    typer.echo(f"{len(files)} wheel(s) in {dest} ({sum(f.stat().st_size for f in files) / 1e6:.0f} MB)")
