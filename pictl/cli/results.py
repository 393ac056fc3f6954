"""What runs leave, read back: `pictl traces` (profile a live run's ranks from another process) and
`pictl report` (a Markdown report of runs, training jobs, sweeps and pruning jobs)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer

from pictl import errors as E
from pictl.cli.common import RunsDirOpt, app, fail, note, run_cancellable, runs_root


@app.command()
def traces(
    run: Annotated[Optional[str], typer.Argument(help="Run id or directory (default: the run in progress).")] = None,
    steps: Annotated[int, typer.Option(help="Pipeline steps to profile on every rank.", min=1, max=10_000)] = 8,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each rank's trace.", min=1, max=3600)] = 120.0,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Profile K steps on every rank of a running pipeline, download the traces and merge them."""
    from pictl.records.run_details import trace_rank_text
    from pictl.run.traces import grab_from_outside, live_run, perfetto_hint
    from pictl.summary_models import RankShare

    try:
        path = live_run(runs_root(runs_dir), run)
        grab = asyncio.run(run_cancellable(grab_from_outside(path, steps, timeout)))
    except E.PictlError as exc:
        fail(exc)
    for rank, file in sorted(grab.files.items()):
        typer.echo(f"{trace_rank_text(rank, RankShare.model_validate(grab.per_rank.get(rank, {})))}  ({file})")
    for rank, why in sorted(grab.missing.items()):
        typer.echo(f"rank {rank}: missing: {why}", err=True)
    if grab.timeline:
        typer.echo(f"traces: {perfetto_hint(grab.timeline)}")
    if not grab.files:
        raise typer.Exit(E.EXIT_RUN_FAILED)


@app.command()
def report(
    sources: Annotated[list[str], typer.Argument(help="Runs and training jobs (ids, unique id prefixes or "
                                                      "directories), sweep and pruning job directories.")],
    out: Annotated[Path, typer.Option(help="Where report.md and its charts go.")] = Path("pictl-report"),
    runs_dir: RunsDirOpt = None,
) -> None:
    """A Markdown report: headline figures, per-stage breakdown chart, link bytes/s, sweep tables and plots."""
    from pictl.records.report import write_report
    from pictl.summary import terminal_text

    try:
        root = runs_root(runs_dir)
        path = write_report([_resolve_source(root, s) for s in sources], out, note)
    except E.PictlError as exc:  # a source it cannot read: 2; a file --out refused (a full disk): 9
        fail(exc)
    typer.echo(f"report: {terminal_text(path)}")


def _resolve_source(root: Path, ref: str) -> Path:
    """A run (or a directory) under the runs root, else a training job beside it (`pictl train`)."""
    from pictl.records.catalog import resolve_run
    from pictl.summary import terminal_text

    try:
        return resolve_run(root, ref)
    except E.ConfigError:
        trains = root.parent / "trains"
        if "/" in ref or not ref.strip() or not trains.is_dir():
            raise
        try:
            return resolve_run(trains, ref)
        except E.ConfigError:
            raise E.ConfigError(f"run '{terminal_text(ref, 120)}': no such run or training job "
                                "(see `pictl runs`)") from None
