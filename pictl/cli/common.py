"""What every command shares: the Typer app, the options most commands take, one-line errors,
signals turned into a clean stop, and "connect to every host, do this, always close"."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, NoReturn, Optional, TypeVar

import typer
from rich.console import Console

from pictl import PROJECT_ROOT
from pictl import errors as E
from pictl.cluster.fleet import Fleet, connected
from pictl.inventory import Cluster, load_cluster

T = TypeVar("T")

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Pipeline-parallel inference on a small cluster.")
SHIPPED_HOSTS = PROJECT_ROOT / "hosts.toml"

HostsOpt = Annotated[Optional[Path], typer.Option(help="Inventory file (default ./hosts.toml, else shipped).")]
RunsDirOpt = Annotated[Optional[Path], typer.Option(help="Where run directories go.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait for hosts another run holds (else exit 8).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show every host's output.")]
ImagesOpt = Annotated[Optional[int], typer.Option(help="Images per pass.")]
WarmupOpt = Annotated[Optional[int], typer.Option(help="Untimed warm-up passes.")]
RepeatsOpt = Annotated[Optional[int], typer.Option(help="Timed passes.")]
ThreadsOpt = Annotated[Optional[int], typer.Option(help="torch threads per rank.")]


def stderr() -> Console:
    # One line, however long: scripts grep it, and a wrapped path is a broken path.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(exc: E.PictlError) -> NoReturn:
    stderr().print(f"pictl: error: {exc}", markup=False)
    raise typer.Exit(exc.exit_code)


def read_cluster(path: Path | None) -> Cluster:
    if path is None:
        local = Path.cwd() / "hosts.toml"
        path = local if local.is_file() else SHIPPED_HOSTS
    return load_cluster(path)


def checked_runs_root(runs_dir: Path | None) -> Path:
    """Where run directories go, checked before anything starts (a file there is bad input, not a crash)."""
    from pictl.records.runs import default_runs_root, writable_dir

    return writable_dir(runs_dir or default_runs_root(), "--runs-dir" if runs_dir else "the runs directory")


def note_profile(profile: str | None) -> None:
    from pictl.planning.profiles import shadowed_profile

    note = shadowed_profile(profile)
    if note:
        stderr().print(f"pictl: note: {note}", markup=False)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def run_cancellable(coro: Awaitable[T]) -> T:
    """Run `coro`, turning Ctrl-C, SIGTERM and SIGHUP (a closed terminal) into task cancellation, so
    clean-up code runs and records close. A second signal does not cut the clean-up short: the hosts
    still confirm that everything stopped (it is bounded: each host gets a few seconds)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    err = stderr()
    signalled: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        signalled.append(sig)
        if len(signalled) == 1:
            task.cancel()
            return
        try:
            err.print(f"pictl: {sig.name} again: still stopping, waiting for every host to confirm", markup=False)
        except OSError:
            pass  # the terminal is gone (SIGHUP): keep stopping quietly

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await task
    except asyncio.CancelledError:
        raise E.Interrupted("interrupted: what was running on the hosts was stopped") from None
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def on_fleet(hosts: Cluster, work: Callable[[Fleet], Awaitable[T]], *, lease: str | None = None,
                   wait: bool = False, check_python: bool = False) -> T:
    """Connect to every host in parallel, run `work(fleet)`, always close. With `lease` (what is
    done, e.g. "push"), hold every host's lease meanwhile: the code or venv a live run uses is not
    replaced under it (a busy host: HostBusy, exit 8, or wait)."""
    import time

    from pictl.cluster.leases import release_all, take_leases

    async with connected(hosts.hosts) as fleet:
        leases = []
        try:
            if lease:
                leases = await take_leases(list(fleet), f"{lease}-{time.strftime('%Y%m%d-%H%M%S')}", wait=wait,
                                           check_python=check_python)
            return await work(fleet)
        finally:
            await release_all(leases)


def confirm(question: str) -> bool:
    """Ask on the terminal (or read an answer from stdin); no answer (end of input) is no."""
    import click

    try:
        return typer.confirm(question, default=False)
    except click.exceptions.Abort:
        return False


def wide_console() -> Console:
    """Tables on stdout: the terminal's width, or wide enough not to wrap when piped."""
    import sys

    return Console(width=None if sys.stdout.isatty() else 160)

