"""Experiments and their records: the dashboard, `run`, `traces` from a live run, `report`, `profiles`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    HostsOpt,
    ImagesOpt,
    RepeatsOpt,
    RunsDirOpt,
    ThreadsOpt,
    VerboseOpt,
    WarmupOpt,
    app,
    checked_runs_root,
    fail,
    note_profile,
    read_cluster,
    run_cancellable,
)
from pictl.planning.profiles import available_profiles, resolve_options


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    hosts: HostsOpt = None,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Without a command: the interactive dashboard (r run, s stop, t traces, / filter, h history, ? help, q quit)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        cluster = read_cluster(hosts)
        runs_root = checked_runs_root(runs_dir)
    except E.PictlError as exc:
        fail(exc)
    from pictl.tui.app import PictlApp

    PictlApp(cluster, runs_root=runs_root).run()


@app.command()
def run(
    stages: Annotated[Optional[int], typer.Option(help="Pipeline stages (1 = serial only).")] = None,
    split: Annotated[Optional[str], typer.Option(help="Split points: blocks.3,blocks.6 (stage starts).")] = None,
    policy: Annotated[Optional[str], typer.Option(help="balanced (default: measured costs) | equal | explicit")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Named preset from profiles/.")] = None,
    chunk: Annotated[Optional[int], typer.Option(help="Microbatch size.")] = None,
    images: ImagesOpt = None,
    warmup: WarmupOpt = None,
    repeats: RepeatsOpt = None,
    threads: ThreadsOpt = None,
    model: Annotated[Optional[str], typer.Option(help="timm model name.")] = None,
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="State dict (.safetensors / .pth).")] = None,
    allow_pickle: Annotated[Optional[bool], typer.Option("--allow-pickle", help="Trust a pickled checkpoint.")] = None,
    data: Annotated[Optional[str], typer.Option(help="synthetic | cifar10 | cifar100 | imagefolder")] = None,
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory on the hosts.")] = None,
    atol: Annotated[Optional[float], typer.Option(help="Largest logit difference that still matches.")] = None,
    master_port: Annotated[Optional[int], typer.Option(help="Rendezvous port on host 0 (default: a free one).")] = None,
    trace_steps: Annotated[Optional[int], typer.Option(help="Profile K steps on every rank (extra untimed pass); "
                                                            "traces land in the run directory.")] = None,
    refine: Annotated[Optional[bool], typer.Option("--refine/--no-refine", help="balanced: correct the split from "
                                                   "the stages' measured compute before the timed passes "
                                                   "(default) or keep the profiles' one-shot split.")] = None,
    headless: Annotated[bool, typer.Option("--headless", help="No dashboard: progress on stderr.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    hosts: HostsOpt = None,
    runs_dir: RunsDirOpt = None,
    fresh_baseline: Annotated[bool, typer.Option("--fresh-baseline", help="Measure the serial run again.")] = False,
    baseline_max_age: Annotated[Optional[float], typer.Option(help="Reuse a cached serial baseline only if it is "
                                                                   "younger than this many seconds.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 7 if the result raises any sanity flag.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="If another run holds a host, wait for it (else exit 8).")]
    = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run one experiment: serial baseline, N-stage pipeline, speedup and output check."""
    from pictl.headless import HeadlessRenderer, print_summary
    from pictl.run.session import RunSession

    overrides: dict[str, Any] = {
        "stages": stages, "split": None, "policy": policy, "chunk": chunk, "images": images, "warmup": warmup,
        "repeats": repeats, "threads": threads, "model": model, "num_classes": num_classes, "checkpoint": checkpoint,
        "allow_pickle": allow_pickle, "data": data, "data_path": data_path, "atol": atol, "master_port": master_port,
        "trace_steps": trace_steps, "refine": refine, "baseline_max_age": baseline_max_age}
    renderer = HeadlessRenderer(verbose=verbose)
    session = None
    try:
        overrides["split"] = split_points(split)
        options = resolve_options(profile, overrides)
        note_profile(profile)
        session = RunSession(read_cluster(hosts), options, on_event=renderer, runs_root=checked_runs_root(runs_dir),
                             reuse_baseline=not fresh_baseline, profile=profile, wait=wait)
        summary = asyncio.run(run_cancellable(session.run()))
    except E.PictlError as exc:
        renderer.close()
        if session is not None and session.last_summary:
            print_summary(session.last_summary, as_json=as_json)
        fail(exc)
    renderer.close()
    print_summary(summary, as_json=as_json)
    if strict and summary.get("flags"):
        fail(E.Flagged(f"--strict: the result raised {len(summary['flags'])} sanity flag(s): "
                        + ", ".join(dict.fromkeys(f["code"] for f in summary["flags"]))))


def split_points(value: str | None) -> list[str] | None:
    if value is None:
        return None
    points = [p.strip() for p in value.split(",")]
    if not any(points):
        raise E.ConfigError(f"--split: {value!r} names no split point (give module names, e.g. blocks.4,blocks.8)")
    if not all(points):
        raise E.ConfigError(f"--split: {value!r} has an empty split point")
    return points


@app.command()
def traces(
    run: Annotated[Optional[str], typer.Argument(help="Run id or directory (default: the run in progress).")] = None,
    steps: Annotated[int, typer.Option(help="Pipeline steps to profile on every rank.", min=1, max=10_000)] = 8,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each rank's trace.", min=1, max=3600)] = 120.0,
    runs_dir: Annotated[Optional[Path], typer.Option(help="Where run directories are.")] = None,
) -> None:
    """Profile K steps on every rank of a running pipeline, download the traces and merge them."""
    from pictl.records.runs import default_runs_root
    from pictl.run.traces import grab_from_outside, live_run

    try:
        path = live_run(runs_dir or default_runs_root(), run)
        grab = asyncio.run(run_cancellable(grab_from_outside(path, steps, timeout)))
    except E.PictlError as exc:
        fail(exc)
    for rank, file in sorted(grab.files.items()):
        share = grab.per_rank.get(rank, {})
        typer.echo(f"rank {rank}: {file}  compute {share.get('compute_pct')}%  send {share.get('send_pct')}%  "
                   f"recv-wait {share.get('recv_wait_pct')}%  idle {share.get('idle_pct')}%")
    for rank, why in sorted(grab.missing.items()):
        typer.echo(f"rank {rank}: missing: {why}", err=True)
    if grab.timeline:
        typer.echo(f"timeline: {grab.timeline}")
    if not grab.files:
        raise typer.Exit(E.EXIT_RUN_FAILED)


@app.command()
def report(
    sources: Annotated[list[Path], typer.Argument(help="Run and sweep directories.")],
    out: Annotated[Path, typer.Option(help="Where report.md and its charts go.")] = Path("pictl-report"),
) -> None:
    """A Markdown report: headline figures, per-stage breakdown chart, link bytes/s, sweep tables and plots."""
    from pictl.records.report import write_report

    try:
        path = write_report(sources, out)
    except E.PictlError as exc:
        fail(exc)
    typer.echo(f"report: {path}")


@app.command("profiles")
def list_profiles() -> None:
    """List the run presets."""
    for name in available_profiles():
        typer.echo(name)
