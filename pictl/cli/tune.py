"""`pictl tune`: search replicas x stages (and, with --allow-loss, int8 numerics and compressing wires), screen
the best predicted, measure the finalists in rounds against one serial reference, print the ranked table and
what the rounds decided, save the winner as a preset (`pictl.jobs.tune`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    ImagesOpt,
    JsonOpt,
    RepeatsOpt,
    VerboseOpt,
    WarmupOpt,
    app,
    checked_runs_root,
    fail,
    flag_names,
    note,
    note_profile,
    read_cluster,
    run_cancellable,
    stderr,
    wide_console,
)
from pictl.cli.option_groups import HostFlags, OptionGroup, grouped

if TYPE_CHECKING:
    from rich.console import Console

    from pictl.jobs.tune_verdicts import Measured
    from pictl.planning.options import RunOptions


@dataclasses.dataclass(frozen=True)
class TuneRunFlags(OptionGroup):
    """What every candidate run shares (the preset's unless given): `plan_tune`'s run options, by their names."""

    images: ImagesOpt = None
    chunk: Annotated[Optional[int], typer.Option(help="Microbatch size, fixed [default: the preset's, else 1, 2, 4 "
                                                      "and 8 are searched]")] = None
    threads: Annotated[Optional[int], typer.Option(help="torch threads per rank, fixed [default: the preset's, "
                                                        "else 1, 2, 4 ... up to the hosts' cores are "
                                                        "searched]")] = None
    warmup: WarmupOpt = None
    repeats: RepeatsOpt = None
    model: Annotated[Optional[str], typer.Option(help="timm model name, hf:... (a Hugging Face classifier), "
                                                      "package.module:factory, or an artifact from `pictl prune`.")] \
        = None
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs.")] = None
    tokens: Annotated[Optional[int], typer.Option(help="Token ids per input of a text model (hf:...).")] = None
    checkpoint: Annotated[Optional[str], typer.Option(help="State dict (.safetensors / .pth).")] = None
    data: Annotated[Optional[str], typer.Option(help="Images to run: synthetic, cifar10, cifar100, imagefolder "
                                                     "(labelled data adds accuracy to every candidate).")] = None
    data_path: Annotated[Optional[str], typer.Option(help="Data set directory on the hosts.")] = None


@app.command()
@grouped
def tune(
    profile: Annotated[Optional[str], typer.Option(help="Preset the search starts from (model, images, chunk, "
                                                        "passes); the lab's fixes chunk 1.")] = None,
    allow_loss: Annotated[bool, typer.Option("--allow-loss", help="Also try int8-dynamic numerics and compressing "
                                             "wire formats, kept when their top-1 agreement with the fp32 serial "
                                             "run is at least --min-agreement.")] = False,
    # (bounds: TuneSettings', checked in plan_tune as the Python API's are)
    min_agreement: Annotated[float, typer.Option(help="Lossy candidates' bound, 0 to 1.")] = 0.99,
    measure: Annotated[Optional[int], typer.Option(help="Candidates screened at most, 1 to 64 (the pipeline over "
                                                        "every host first; the best kept, at most 4, go on to "
                                                        "the rounds) [default: 3; 5 with --allow-loss]")] = None,
    budget: Annotated[float, typer.Option(help="Wall-time budget in seconds (at least 1): no screening run starts "
                                               "after half of it, no round's run after it.")] = 1800.0,
    max_rounds: Annotated[int, typer.Option(help="Rounds at most, 3 to 30: the finalists and the serial run are "
                                                 "measured 3 times, then again while the top is too close to "
                                                 "call.")] = 9,
    save_as: Annotated[str, typer.Option(help="Preset the winner is saved as, in your presets directory "
                                              "($PICTL_PROFILES_DIR, else ~/.config/pictl/profiles).")] = "tuned",
    force: Annotated[bool, typer.Option("--force", help="Save the winner even under the name of a shipped preset "
                                                        "(it then shadows that preset).")] = False,
    *,
    run_flags: TuneRunFlags,
    out: Annotated[Optional[Path], typer.Option(help="Tune directory (default: under the runs root).")] = None,
    where: HostFlags,
    verbose: VerboseOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest configuration the cluster allows: exact (bit-identical outputs) unless --allow-loss,
    decided in rounds against one serial reference, a winner only beyond the noise."""
    from pictl.headless import HeadlessRenderer
    from pictl.jobs.tune import plan_tune, run_tune
    from pictl.planning.presets import preset_target, protocol_of, user_presets_dir
    from pictl.records.runs import writable_dir
    from pictl.run.baselines import BaselineCache

    renderer = HeadlessRenderer(verbose=verbose)
    latest: list[Measured] = []  # every row so far: printed if the tune's files cannot be written

    def keep(now: list[Measured]) -> None:
        latest[:] = now

    write_failed: list[E.RecordWriteFailed] = []
    target: Path | None = None
    profiles = user_presets_dir()
    try:
        # Everything that can refuse the tune is asked before its first run: the preset's place and name too.
        preset_target(save_as, profiles, force=force)
        cluster = read_cluster(where.hosts, cold=where.cold)
        base, settings = plan_tune(profile, run_flags.values(), allow_loss=allow_loss, min_agreement=min_agreement,
                                   measure=measure, budget_s=budget, wait=where.wait, max_rounds=max_rounds,
                                   name_of=flag_names(budget_s="--budget"))
        note_profile(profile)
        protocol = protocol_of(profile)  # what the saved preset measures with: the user's, not the tune's own
        root = checked_runs_root(where.runs_dir)
        target = out or root.parent / "tunes" / time.strftime("%Y%m%d-%H%M%S")
        if os.path.lexists(target):
            raise E.ConfigError(f"--out: {target} already exists")
        writable_dir(target, "--out")
        rows = asyncio.run(run_cancellable(run_tune(cluster, base, settings, target, on_event=renderer,
                                                    cache=BaselineCache(), on_rows=keep,
                                                    write_failed=write_failed, runs_root=root)))
    except E.Interrupted as exc:
        renderer.close()
        if target is not None:
            _print_kept(target, "interrupted")
        fail(exc)
    except E.RecordWriteFailed as exc:  # measured, but its files could not be written: what it measured first
        renderer.close()
        if latest:
            _print_table(latest, None, base, as_json)
        fail(exc)
    except E.PictlError as exc:
        renderer.close()
        if target is not None:
            _print_kept(target, "failed")  # (a tune that measured nothing left no tune.json to point at)
        fail(exc)
    renderer.close()
    assert target is not None
    _verdict_and_files(rows, base, target, cluster.source, profiles, save_as, force=force, as_json=as_json,
                       write_failed=write_failed, protocol=protocol)


def _verdict_and_files(rows: list[Measured], base: RunOptions, target: Path, source: str, profiles: Path,
                       save_as: str, *, force: bool, as_json: bool, write_failed: list[E.RecordWriteFailed],
                       protocol: dict[str, int] | None = None) -> None:
    """The table first (a measured result is never lost to a full disk), then the files and the preset, then the
    verdict: exit 3 when nothing was saved (nothing kept, or nothing beat the serial run), 9 when a file could
    not be written."""
    from pictl.jobs.tune_report import finish
    from pictl.jobs.tune_verdicts import winner

    found = winner(rows)
    console = _print_table(rows, found, base, as_json)
    try:
        found, preset = finish(target, rows, base, source, profiles, save_as, force=force, protocol=protocol)
    except E.RecordWriteFailed as exc:
        console.print(f"tune directory: {target}", markup=False)
        fail(exc)
    lines = [f"tune directory: {target}"]
    decided = _decision(target)
    serial = next((m for m in rows if m.reference), None)
    if serial is not None and serial.rounds:
        lines.append(f"reference: the serial run on {decided.get('host', '?')}, {serial.throughput_ips:.2f} img/s "
                     f"(median of {len(serial.rounds)} rounds)")
    # Short lines: the table is read on an 80-column terminal.
    lines += [f"  {line}" for line in decided.get("lines", [])[:-1]]
    if found is not None:
        spread = f", {found.interval[0]:.2f}-{found.interval[1]:.2f}" if found.interval else ""
        lines += [(decided.get("lines") or [f"winner: {found.candidate.label}"])[-1],
                  f"  {found.throughput_ips:.2f} img/s, {found.speedup_vs_fp32:.2f}x the serial run "
                  f"({len(found.rounds)} rounds{spread}; {found.why})",
                  f"  saved: {preset}", f"  run it again: pictl run --profile {save_as}"]
    else:
        lines += [decided.get("lines", ["no candidate was kept: see the table's verdicts"])[-1],
                  f"  nothing saved as {save_as}"]
    if found is None and (profiles / f"{save_as}.toml").is_file():
        lines.append(f"  {profiles / f'{save_as}.toml'} (saved before) is left as it was")
    for line in lines:
        console.print(line, markup=False)
    if as_json:
        every = json.loads((target / "tune.json").read_text())
        typer.echo(json.dumps({"tune_dir": str(target), "preset": str(preset) if preset else None, **every}))
    if found is None:  # nothing saved: that is the exit status; a file not written is said too
        if write_failed:
            note(str(write_failed[0]))
        raise typer.Exit(E.EXIT_RUN_FAILED)
    if write_failed:
        fail(write_failed[0])


def _decision(target: Path) -> dict[str, Any]:
    """What the tune decided and where its reference ran, as tune.json keeps them (empty if it cannot be read)."""
    try:
        every = json.loads((target / "tune.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"lines": list(every.get("decision") or []), "host": (every.get("reference") or {}).get("host")}


def _print_table(rows: list[Measured], found: Measured | None, base: RunOptions, as_json: bool) -> Console:
    """The ranked table and its legend (on stderr under --json: stdout is the JSON)."""
    from pictl.jobs.tune_report import legend, table

    console = stderr() if as_json else wide_console()
    console.print(table(rows, found, base, unmeasured=8) + "\n" + legend(base), markup=False)
    return console


def _print_kept(target: Path, how: str) -> None:
    path = target / "tune.json"
    if path.is_file():
        stderr().print(f"tune {how}: what it measured is in {path}", markup=False)
