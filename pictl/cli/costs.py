"""`pictl profile`: what `--policy balanced` measures on every host and link, shown or as JSON."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pictl import errors as E
from pictl.cluster.fleet import Fleet
from pictl.planning.costs import CachedProfile

if TYPE_CHECKING:
    from pictl.planning.costs import Profiles
    from remote.floor.balance import Link

from pictl.cli.common import (
    HostsOpt,
    WaitOpt,
    app,
    fail,
    on_fleet,
    read_cluster,
    run_cancellable,
    stderr,
    wide_console,
)


class ShownProfile(CachedProfile):
    """A host's profile as the table shows it: with how its passes agreed (`remote.profiling.costs`)."""

    spread: float
    """(p90 - p10) / median of the passes' totals."""
    passes: int
    attempts: int
    """How many times it was measured (again while its passes disagreed by over 10 %)."""


@app.command("profile")
def profile_costs(
    model: Annotated[str, typer.Option(help="timm model name.")] = "deit_small_patch16_224",
    num_classes: Annotated[int, typer.Option(help="Classifier outputs.", min=1, max=100_000)] = 1000,
    chunk: Annotated[int, typer.Option(help="Microbatch size to time.", min=1, max=256)] = 1,
    threads: Annotated[int, typer.Option(help="torch threads, as the run will use.", min=1, max=256)] = 1,
    fresh: Annotated[bool, typer.Option("--fresh", help="Measure again even if cached.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The profiles as one JSON object on stdout.")] = False,
    hosts: HostsOpt = None,
    wait: WaitOpt = False,
) -> None:
    """Measure each piece's time on every host and the bytes at each cut (what `--policy balanced` uses)."""
    import json
    import tempfile

    from rich.table import Table

    from pictl.cluster.push import local_tree, manifest_digest, push_to
    from pictl.planning.costs import host_profiles, link_profiles
    from pictl.records.cache import JsonCache, cache_root

    async def work(fleet: Fleet) -> tuple[Profiles, tuple[dict[tuple[str, str], Link], list[str]]]:
        files = local_tree()
        await fleet.each(lambda t: push_to(t, files), "push failed")
        root = Path(tempfile.mkdtemp()) if fresh else cache_root()
        hosts = list(fleet)
        found = await host_profiles(hosts, JsonCache(root / "costs"), model=model, num_classes=num_classes,
                                    chunk=chunk, threads=threads, code=manifest_digest(files),
                                    announce=lambda line: stderr().print(f"pictl profile: {line}", markup=False))
        return found, await link_profiles(list(zip(hosts, hosts[1:], strict=False)), JsonCache(root / "links"))

    try:
        cluster = read_cluster(hosts)
        # Measuring while another run computes would skew both: the hosts are held as a run holds them.
        found, (links, links_measured) = asyncio.run(run_cancellable(
            on_fleet(cluster, work, lease="profile", wait=wait, check_python=True)))
    except E.PictlError as exc:
        fail(exc)
    profiles, measured = found.by_host, found.measured
    link_rows = {f"{a}->{b}": {"latency_ms": round(k.latency_s * 1000, 3), "MB_per_s": round(k.bytes_per_s / 1e6, 1)}
                 for (a, b), k in links.items()}
    if as_json:
        typer.echo(json.dumps({"measured": measured, "shared_machine": found.shared, "hosts": profiles,
                               "links": link_rows, "links_measured": links_measured}))
        return
    names = list(profiles)
    table = Table(title=f"{model}: ms per microbatch of {chunk} ({threads} thread(s)); cached unless measured now",
                  title_justify="left")
    for col in ["piece", "KB in", *(f"{n} ms" for n in names)]:
        table.add_column(col, justify="left" if col == "piece" else "right")
    shown = [ShownProfile.view(profiles[n]) for n in names]
    first = shown[0]
    for i, piece in enumerate(first.pieces):
        table.add_row(piece, f"{first.cut_bytes[i] / 1024:.0f}", *(f"{p.compute_s[i] * 1000:.2f}" for p in shown))
    table.add_row("total", "", *(f"{sum(p.compute_s) * 1000:.1f}" for p in shown))
    # How much the whole passes disagreed ((p90 - p10) / median); over 10 % the host was measured again.
    table.add_row("spread", "", *(f"{p.spread:.1%} ({p.passes} passes, {p.attempts} try)" for p in shown))
    table.add_row("correction", "", *(f"x{found.correction(n):.2f}" for n in names))
    out = wide_console()
    for group in found.shared:
        out.print(f"{', '.join(group)} share one machine: profiled one at a time")
    out.print(table)
    hops = Table(title="links (host to next host, as a stage's output travels)", title_justify="left")
    for col in ("link", "latency ms", "MB/s", ""):
        hops.add_column(col)
    for name, row in link_rows.items():
        hops.add_row(name, f"{row['latency_ms']:.3f}", f"{row['MB_per_s']:.1f}",
                     "measured now" if name in links_measured else "cached")
    out.print(hops)
    typer.echo(f"measured now: {', '.join(measured) or 'none (all cached)'}")
