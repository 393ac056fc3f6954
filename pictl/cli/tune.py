"""`pictl tune`: search replicas x stages (and, with --allow-loss, int8 numerics and compressing wires), measure
the best predicted, print the ranked table, save the winner as a preset (`pictl.jobs.tune`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    ColdOpt,
    HostsOpt,
    ImagesOpt,
    JsonOpt,
    RepeatsOpt,
    RunsDirOpt,
    VerboseOpt,
    WaitOpt,
    WarmupOpt,
    app,
    checked_runs_root,
    fail,
    note_profile,
    read_cluster,
    run_cancellable,
    stderr,
    wide_console,
)


@app.command()
def tune(
    profile: Annotated[Optional[str], typer.Option(help="Preset the search starts from (model, images, chunk, "
                                                        "passes); the lab's fixes chunk 1.")] = None,
    allow_loss: Annotated[bool, typer.Option("--allow-loss", help="Also try int8-dynamic numerics and compressing "
                                             "wire formats, kept when their top-1 agreement with the fp32 serial "
                                             "run is at least --min-agreement.")] = False,
    min_agreement: Annotated[float, typer.Option(min=0.0, max=1.0, help="Lossy candidates' bound.")] = 0.99,
    measure: Annotated[Optional[int], typer.Option(min=1, max=64, help="Candidates measured at most (the pipeline "
                                                                       "over every host first) [default: 3; 5 with "
                                                                       "--allow-loss]")] = None,
    budget: Annotated[float, typer.Option(min=1.0, help="Wall-time budget in seconds: no new measurement starts "
                                                        "after it.")] = 1800.0,
    save_as: Annotated[str, typer.Option(help="Preset the winner is saved as (./profiles/NAME.toml).")] = "tuned",
    images: ImagesOpt = None,
    chunk: Annotated[Optional[int], typer.Option(help="Microbatch size, fixed [default: the preset's, else 1, 2, 4 "
                                                      "and 8 are searched]")] = None,
    threads: Annotated[Optional[int], typer.Option(min=0, max=256, help="torch threads per rank, fixed [default: "
                                                   "the preset's, else 1, 2, 4 ... up to the hosts' cores are "
                                                   "searched]")] = None,
    warmup: WarmupOpt = None,
    repeats: RepeatsOpt = None,
    model: Annotated[Optional[str], typer.Option(help="timm model name, or an artifact from `pictl prune`.")] = None,
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs.")] = None,
    checkpoint: Annotated[Optional[str], typer.Option(help="State dict (.safetensors / .pth).")] = None,
    data: Annotated[Optional[str], typer.Option(help="Images to run: synthetic, cifar10, cifar100, imagefolder "
                                                     "(labelled data adds accuracy to every candidate).")] = None,
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory on the hosts.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Tune directory (default: under the runs root).")] = None,
    hosts: HostsOpt = None,
    wait: WaitOpt = False,
    cold: ColdOpt = False,
    runs_dir: RunsDirOpt = None,
    verbose: VerboseOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest configuration the cluster allows: exact (bit-identical outputs) unless --allow-loss."""
    from pictl.headless import HeadlessRenderer
    from pictl.jobs.tune import plan_tune, run_tune
    from pictl.jobs.tune_report import finish, legend, table
    from pictl.planning.presets import PRESET_NAME
    from pictl.records.runs import writable_dir
    from pictl.run.baselines import BaselineCache

    renderer = HeadlessRenderer(verbose=verbose)
    rows = []
    target: Path | None = None
    try:
        if not PRESET_NAME.fullmatch(save_as):
            raise E.ConfigError(f"--save-as: {save_as!r} is not a profile name (letters, digits, '-' and '_')")
        cluster = read_cluster(hosts, cold=cold)
        base, settings = plan_tune(profile, {"images": images, "chunk": chunk, "warmup": warmup, "repeats": repeats,
                                             "model": model, "num_classes": num_classes, "checkpoint": checkpoint,
                                             "data": data, "data_path": data_path, "threads": threads},
                                   allow_loss=allow_loss, min_agreement=min_agreement, measure=measure,
                                   budget_s=budget, wait=wait)
        note_profile(profile)
        root = checked_runs_root(runs_dir)
        target = out or root.parent / "tunes" / time.strftime("%Y%m%d-%H%M%S")
        if os.path.lexists(target):
            raise E.ConfigError(f"--out: {target} already exists")
        writable_dir(target, "--out")
        rows = asyncio.run(run_cancellable(run_tune(cluster, base, settings, target, on_event=renderer,
                                                    cache=BaselineCache())))
    except E.Interrupted as exc:
        renderer.close()
        if target is not None:
            _print_kept(target)
        fail(exc)
    except E.PictlError as exc:
        renderer.close()
        if target is not None and target.is_dir() and not any(target.iterdir()):
            target.rmdir()  # refused before it measured anything: the directory it made is empty, and goes
        fail(exc)
    renderer.close()
    assert target is not None
    best, preset = finish(target, rows, base, cluster.source, Path.cwd() / "profiles", save_as)
    shown = table(rows, best, base, unmeasured=8) + "\n" + legend(base)
    console = stderr() if as_json else wide_console()
    console.print(shown, markup=False)
    lines = [f"tune directory: {target}"]
    if best is not None:
        # Short lines: the table is read on an 80-column terminal.
        lines += [f"winner: {best.candidate.label}",
                  f"  {best.throughput_ips:.2f} img/s, {best.speedup_vs_fp32}x the fp32 serial run ({best.why})",
                  f"  run it again: pictl run --profile {save_as}"]
    else:
        lines.append("no candidate was kept: see the table's verdicts")
    for line in lines:
        console.print(line, markup=False)
    if as_json:
        every = json.loads((target / "tune.json").read_text())
        typer.echo(json.dumps({"tune_dir": str(target), "preset": str(preset) if preset else None, **every}))
    if best is None:
        raise typer.Exit(E.EXIT_RUN_FAILED)


def _print_kept(target: Path) -> None:
    path = target / "tune.json"
    if path.is_file():
        stderr().print(f"tune interrupted: what it measured is in {path}", markup=False)
