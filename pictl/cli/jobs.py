"""Work made of many runs or of its own kind: `sweep` (every combination against one reference, in rounds) and
`prune`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    HeadlessOpt,
    RunsDirOpt,
    TrackerChoice,
    WaitOpt,
    app,
    before_runs_dir,
    checked_runs_root,
    fail,
    flag_names,
    note_profile,
    read_cluster,
    run_cancellable,
    run_job,
    stderr,
    tracked,
    wide_console,
)
from pictl.cli.option_groups import HostFlags, MeasureFlags, OptionGroup, OutputFlags, grouped
from pictl.planning.options import parse_split

TRAIN_PANEL = "Training (--train)"


@dataclasses.dataclass(frozen=True)
class TrainSweepFlags(OptionGroup):
    """`pictl sweep --train`: the switch, what a training sweep varies besides stages, chunks and wires, and the
    settings every job of it shares (`train_options`' names, but for --model-arg)."""

    train: Annotated[bool, typer.Option("--train", help="Sweep training jobs (`pictl train`) instead of runs.",
                                        rich_help_panel=TRAIN_PANEL)] = False
    modes: Annotated[Optional[str], typer.Option(help="Training modes, e.g. single,pipeline,ddp (default: all).",
                                                 rich_help_panel=TRAIN_PANEL)] = None
    split: Annotated[Optional[str], typer.Option(help="Pipeline training: where stages 2..N begin, e.g. blocks.2 "
                                                      "(for the stage count it cuts).",
                                                 rich_help_panel=TRAIN_PANEL)] = None
    workers: Annotated[Optional[str], typer.Option(help="Data-loading processes per image-reading rank to compare, "
                                                        "e.g. 0,1,2,4 (default 0).",
                                                   rich_help_panel=TRAIN_PANEL)] = None
    schedules: Annotated[Optional[str], typer.Option(help="Pipeline schedules, e.g. gpipe,1f1b (default: both).",
                                                     rich_help_panel=TRAIN_PANEL)] = None
    model: Annotated[Optional[str], typer.Option(help="Model to train.", rich_help_panel=TRAIN_PANEL)] = None
    model_arg: Annotated[Optional[list[str]], typer.Option(help="timm constructor argument KEY=VALUE.",
                                                           rich_help_panel=TRAIN_PANEL)] = None
    image_size: Annotated[Optional[int], typer.Option(help="Input side in pixels.",
                                                      rich_help_panel=TRAIN_PANEL)] = None
    batch_size: Annotated[Optional[int], typer.Option(help="Global batch per step.",
                                                      rich_help_panel=TRAIN_PANEL)] = None
    steps: Annotated[Optional[int], typer.Option(help="Optimizer steps per job.", rich_help_panel=TRAIN_PANEL)] = None
    train_images: Annotated[Optional[int], typer.Option(help="Training images.", rich_help_panel=TRAIN_PANEL)] = None
    eval_images: Annotated[Optional[int], typer.Option(help="Held-out images for top-1 (0: none).",
                                                       rich_help_panel=TRAIN_PANEL)] = None
    data: Annotated[Optional[str], typer.Option(help="synthetic | cifar10 | cifar100 | imagefolder.",
                                                rich_help_panel=TRAIN_PANEL)] = None
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory on the hosts.",
                                                     rich_help_panel=TRAIN_PANEL)] = None
    amp: Annotated[Optional[bool], typer.Option("--amp/--fp32", help="bf16 autocast.",
                                                rich_help_panel=TRAIN_PANEL)] = None
    error_feedback: Annotated[Optional[bool], typer.Option(
        "--error-feedback/--no-error-feedback", help="lowrank cuts: send each image's change (default on).",
        rich_help_panel=TRAIN_PANEL)] = None


@app.command()
@grouped
def sweep(
    stages: Annotated[Optional[str], typer.Option(help="Stage counts, e.g. 1,2,3,4,6 (default 1,2,3,4).")] = None,
    chunks: Annotated[Optional[str], typer.Option(help="Microbatch sizes, e.g. 1,2,4,8 (default 1).")] = None,
    policy: Annotated[Optional[str], typer.Option(help="Policies to compare, e.g. equal,balanced.")] = None,
    wire: Annotated[Optional[str], typer.Option(help="Wire formats to compare, e.g. fp32,fp16,int8,lowrank:8 "
                                                     "(default fp32).")] = None,
    profile: Annotated[Optional[str], typer.Option(help="Preset: run options, and its \\[sweep] values.")] = None,
    *,
    measure: MeasureFlags,
    trace_steps: Annotated[Optional[int], typer.Option(help="Profile K steps of every pipeline run.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Sweep directory (default: under the runs root).")] = None,
    rounds: Annotated[Optional[int], typer.Option(help="Rounds: each measures the reference and every "
                                                       "combination once, interleaved (default 3).")] = None,
    max_rounds: Annotated[Optional[int], typer.Option(help="Rounds at most, added one at a time while two "
                                                           "combinations are too close to call (default 6).")] = None,
    budget: Annotated[Optional[float], typer.Option(help="Seconds after which no round is added.")] = None,
    where: HostFlags,
    output: OutputFlags,
    training: TrainSweepFlags,
) -> None:
    """Measure every combination against one serial reference in interleaved rounds and rank them, a winner only
    beyond the noise (or, with --train, run every training job); write a table and plots."""
    import time

    from pictl.headless import HeadlessRenderer
    from pictl.jobs.sweep import plan_sweep, run_sweep
    from pictl.jobs.sweep_rounds import rounds_plan

    write_failed: list[E.RecordWriteFailed] = []
    from pictl.records.runs import writable_dir

    train, as_json = training.train, output.as_json
    if train and profile is not None:  # profiles hold run options: a training sweep would drop it unsaid
        fail(E.ConfigError("--profile: a training sweep (--train) takes no profile; give its settings as flags"))
    if training.split is not None and not train:  # a run sweep varies its stages: split points would not fit them all
        fail(E.ConfigError("--split: split points are a training sweep's setting (add --train)"))
    if training.workers is not None and not train:  # a run has no data loader: the flag would be dropped unsaid
        fail(E.ConfigError("--workers: data-loading workers are a training setting (add --train)"))
    if train and (rounds, max_rounds, budget) != (None, None, None):  # training jobs are not compared in rounds
        fail(E.ConfigError("--rounds: a training sweep (--train) runs each job once"))
    renderer = HeadlessRenderer(verbose=output.verbose)
    if train:
        _train_sweep(renderer, training, where, threads=measure.threads, track=output.track, stages=stages,
                     chunks=chunks, out=out, as_json=as_json, wires=wire)
        return
    try:
        plan = rounds_plan(rounds, max_rounds, budget)
        cluster = read_cluster(where.hosts, cold=where.cold)
        # The run options a sweep takes as flags (SWEEP_FLAGS); what it varies has flags of its own.
        base, points = plan_sweep(cluster, profile, {**measure.values(), "trace_steps": trace_steps,
                                                   "track": tracked(output.track)},
                                  stages=stages, chunks=chunks, policies=policy, wires=wire)
        note_profile(profile)
        root = checked_runs_root(where.runs_dir)
        target = out or root.parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S")
        if os.path.lexists(target):  # (False for a name too long to look up: writable_dir names that)
            raise E.ConfigError(f"--out: {target} already exists")
        writable_dir(target, "--out")
        rows = asyncio.run(run_cancellable(run_sweep(cluster, base, points, target, on_event=renderer,
                                                      wait=where.wait, write_failed=write_failed, runs_root=root,
                                                      rounds=plan)))
    except E.PictlError as exc:
        renderer.close()
        fail(exc)
    renderer.close()
    table = _sweep_table(target, rows)
    if as_json:  # the rows on stdout; the table a person reads goes to stderr
        stderr().print(table, markup=False)
        typer.echo(json.dumps({"sweep_dir": str(target), "rows": rows}))
    else:
        wide_console().print(table, markup=False)
        typer.echo(f"sweep directory: {target}")
    if write_failed:  # printed first: the rows were measured
        fail(write_failed[0])
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(E.EXIT_RUN_FAILED)


def _sweep_table(target: Path, rows: list[dict[str, Any]]) -> str:
    """The ranked table with its reference and verdicts, as table.md holds it (the bare rows when it could not
    be written: the disk's refusal is said after it)."""
    from pictl.jobs.sweep import markdown_table

    try:
        return (target / "table.md").read_text()
    except OSError:
        return markdown_table(rows)


def _train_sweep(renderer: Any, training: TrainSweepFlags, where: HostFlags, *, threads: int | None,
                 track: list[TrackerChoice] | None, stages: str | None, chunks: str | None, out: Path | None,
                 as_json: bool, wires: str | None) -> None:
    """`pictl sweep --train`: training jobs over modes, schedules, rank counts, chunk counts and loader workers."""
    import time

    from pictl.jobs.prune_options import parse_model_args
    from pictl.jobs.sweep import parse_ints, parse_wires
    from pictl.jobs.training.options import train_options
    from pictl.jobs.training.sweep import run_train_sweep, train_points
    from pictl.records.runs import writable_dir

    modes, schedules, workers = training.modes, training.schedules, training.workers
    # The group's settings are every job's `train_options`, by their names; the rest say what is swept.
    settings = {name: value for name, value in training.values().items()
                if name not in ("train", "modes", "schedules", "workers", "model_arg")}
    try:
        settings["model_args"] = parse_model_args(training.model_arg)
        settings["split"] = parse_split(training.split, "--split")
        settings.update(threads=threads, track=tracked(track))
        base = train_options(settings, name_of=flag_names(model_args="--model-arg"))
        wanted = [m for m in (modes or "single,pipeline,ddp").replace(" ", "").split(",") if m]
        kinds = [k for k in (schedules or "gpipe,1f1b").replace(" ", "").split(",") if k]
        for name, values, allowed in (("--modes", wanted, ("single", "pipeline", "ddp")),
                                      ("--schedules", kinds, ("gpipe", "1f1b"))):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise E.ConfigError(f"{name}: '{','.join(bad) or '(none)'}' is not among {', '.join(allowed)}")
        cluster = read_cluster(where.hosts, cold=where.cold)
        points, skipped = train_points(cluster, base, wanted, parse_ints("--stages", stages or "2"),
                                       parse_ints("--chunks", chunks or "1,4,8"), kinds,
                                       parse_ints("--workers", workers, least=0) if workers else None,
                                       parse_wires("--wire", wires) if wires else None)
        target = out or checked_runs_root(where.runs_dir).parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S-train")
        if os.path.lexists(target):  # (False for a name too long to look up: writable_dir names that)
            raise E.ConfigError(f"--out: {target} already exists")
        writable_dir(target, "--out")
        rows = asyncio.run(run_cancellable(run_train_sweep(cluster, base, points, skipped, target, on_event=renderer,
                                                           wait=where.wait)))
    except E.PictlError as exc:
        renderer.close()
        fail(exc)
    renderer.close()
    if as_json:
        stderr().print((target / "table.md").read_text(), markup=False)
        typer.echo(json.dumps({"sweep_dir": str(target), "rows": rows, "skipped": skipped}))
    else:
        wide_console().print((target / "table.md").read_text(), markup=False)
        typer.echo(f"sweep directory: {target}")
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(E.EXIT_RUN_FAILED)


@dataclasses.dataclass(frozen=True)
class PruneFlags(OptionGroup):
    """What is pruned and how it is fine-tuned: `prune_options`' names, but for --model-arg."""

    model: Annotated[Optional[str], typer.Option(help="timm ViT/DeiT to prune.")] = None
    checkpoint: Annotated[Optional[str], typer.Option(help="Base weights (.safetensors / .pth state dict).")] = None
    ratio: Annotated[Optional[float], typer.Option(help="Channel pruning ratio, in (0, 1).")] = None
    importance: Annotated[Optional[str], typer.Option(help="l1 | l2 | taylor | hessian (default).")] = None
    global_pruning: Annotated[Optional[bool], typer.Option("--global/--uniform",
                                                           help="Rank channels across layers.")] = None
    prune_heads: Annotated[Optional[bool], typer.Option("--prune-heads", help="Remove whole heads.")] = None
    round_to: Annotated[Optional[int], typer.Option(help="Keep widths multiples of N (e.g. 8 for SIMD).")] = None
    epochs: Annotated[Optional[int], typer.Option(help="Fine-tuning epochs (0: none).")] = None
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (cosine schedule).")] = None
    batch_size: Annotated[Optional[int], typer.Option(help="Fine-tuning batch size.")] = None
    optimizer: Annotated[Optional[str], typer.Option(help="sgd (momentum) | adamw.")] = None
    calib_batches: Annotated[Optional[int], typer.Option(help="Batches scoring taylor/hessian.")] = None
    train_images: Annotated[Optional[int], typer.Option(help="Fine-tune on at most N images (0: all).")] = None
    eval_images: Annotated[Optional[int], typer.Option(help="Evaluate on at most N images (0: all).")] = None
    data: Annotated[Optional[str], typer.Option(help="cifar10 | cifar100 | imagefolder")] = None
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory (on the machine that prunes).")] = None
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs (default: the data set's).")] = None
    model_arg: Annotated[Optional[list[str]], typer.Option(help="timm constructor argument KEY=VALUE.")] = None
    threads: Annotated[Optional[int], typer.Option(help="torch threads (0: all cores).")] = None
    device: Annotated[Optional[str], typer.Option(help="auto | cpu | cuda.")] = None
    seed: Annotated[Optional[int], typer.Option(help="Seed for data order and random weights.")] = None


@app.command()
@grouped
def prune(
    job: PruneFlags,
    on: Annotated[Optional[str], typer.Option(help="Prune on this inventory host (default: here).")] = None,
    hosts: Annotated[Optional[Path], typer.Option(help="Inventory file (for --on).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Where job directories go (default: beside the runs).")] = None,
    runs_dir: RunsDirOpt = None,
    headless: HeadlessOpt = False,
    wait: WaitOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the job's own output.")] = False,
) -> None:
    """Prune a ViT/DeiT (torch-pruning), fine-tune it, and write an artifact `pictl run --model` takes."""
    from pictl.headless import HeadlessRenderer
    from pictl.jobs.prune import PruneSession
    from pictl.jobs.prune_options import parse_model_args, prune_options

    renderer = HeadlessRenderer(verbose=verbose)

    def pruning() -> PruneSession:
        given = job.values()
        given["model_args"] = parse_model_args(given.pop("model_arg"))
        options = prune_options(given, name_of=flag_names(model_args="--model-arg", global_pruning="--global"))
        if out is not None:
            from pictl.records.runs import writable_dir

            writable_dir(out, "--out")
        root = out or (checked_runs_root(runs_dir).parent / "prunes" if runs_dir or before_runs_dir() else None)
        return PruneSession(options, cluster=read_cluster(hosts) if on else None, on_host=on, root=root,
                            on_event=renderer, wait=wait)

    run_job(pruning, renderer, as_json=as_json)
