"""`pictl init`: a hosts.toml for N hosts from flags (or, on a terminal, a few questions), then each SSH
host's key offered for trust, then `pictl check` on the new inventory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from pictl import errors as E
from pictl.cli.common import app, fail, stderr
from pictl.cli.hosts import check as check_hosts
from pictl.cli.hosts import trust_host
from pictl.scaffold import MAX_HOSTS, new_cluster, write_inventory
from pictl.text import printable


@app.command()
def init(
    out: Annotated[Path, typer.Option(help="Where the inventory goes.")] = Path("hosts.toml"),
    name: Annotated[Optional[str], typer.Option(help="Cluster name (shown in the dashboard).")] = None,
    transport: Annotated[Optional[str], typer.Option(help="ssh (Pis) or local (this machine).")] = None,
    address: Annotated[Optional[list[str]], typer.Option(help="An SSH host as [user@]address[:port]; once per "
                                                              "host, in pipeline order.")] = None,
    count: Annotated[Optional[int], typer.Option(help="How many hosts (local: required).", min=1, max=64)] = None,
    names: Annotated[Optional[str], typer.Option(help="Host names, comma-separated (default pi0.. or "
                                                      "local0..).")] = None,
    user: Annotated[Optional[str], typer.Option(help="SSH user for every host.")] = None,
    key: Annotated[Optional[str], typer.Option(help="SSH private key file for every host.")] = None,
    workdir: Annotated[Optional[str], typer.Option(help="Directory pictl owns on each host.")] = None,
    venv: Annotated[Optional[str], typer.Option(help="The hosts' venv (see `pictl provision`).")] = None,
    interface: Annotated[Optional[str], typer.Option(help="Network interface gloo binds (e.g. eth0).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    trust: Annotated[bool, typer.Option("--trust/--no-trust", help="Offer each SSH host's key for trust.")] = True,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Trust the keys without asking.")] = False,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Run `pictl check` on the result.")] = True,
) -> None:
    """Write a hosts.toml for N hosts (flags, or questions on a terminal), offer to trust their keys, check them."""
    ask = sys.stdin.isatty()
    try:
        if transport is None:
            transport = typer.prompt("transport (ssh for Pis, local for this machine)", default="ssh") \
                if ask else ("ssh" if address else "local")
        if transport == "ssh" and not address and ask:
            n = count or typer.prompt("how many hosts", type=int, default=4)
            if not 1 <= n <= MAX_HOSTS:
                raise E.ConfigError(f"how many hosts: {n} (1 to {MAX_HOSTS})")
            address = [typer.prompt(f"host {i} address ([user@]address[:port])") for i in range(n)]
            user = user or typer.prompt("SSH user for every host (empty: ~/.ssh/config)", default="",
                                        show_default=False) or None
        if transport == "local" and count is None and ask:
            count = typer.prompt("how many local hosts", type=int, default=4)
        nc = new_cluster(name=name if name is not None else ("pis" if transport == "ssh" else "local"),
                         transport=transport,
                         count=count, addresses=address or [], names=[n for n in (names or "").split(",") if n],
                         user=user, key=key, workdir=workdir, venv=venv, interface=interface)
        cluster = write_inventory(out, nc, force=force)
    except E.PictlError as exc:
        fail(exc)
    written = Path(cluster.source)  # `~` expanded: the shell leaves it alone in `--out=~/x.toml`
    typer.echo(f"wrote {printable(written)} ({len(cluster.hosts)} {transport} hosts); "
               f"`pictl --hosts {printable(written)} hosts` shows it")
    if trust and transport == "ssh":
        for h in cluster.hosts:
            try:
                trust_host(h, yes=yes, timeout=10.0)
            except E.PictlError as exc:  # one host's key is that host's business: say so, go on
                stderr().print(f"pictl: {exc}", markup=False)
    if check:
        check_hosts(hosts=written, as_json=False)  # exits 4 or 6 when a host is not ready, as `pictl check`
