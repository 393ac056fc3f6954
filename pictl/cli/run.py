"""Experiments: the dashboard (`pictl` alone), `pictl run`, and the run presets it takes (`pictl profiles`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from pictl import errors as E
from pictl.cli.common import (
    HOSTS_PANEL,
    MEASURE_PANEL,
    MODEL_PANEL,
    ColdOpt,
    DataPathOpt,
    HostsOpt,
    JsonOpt,
    RunsDirOpt,
    TrackOpt,
    VerboseOpt,
    app,
    before_command,
    checked_runs_root,
    choices,
    default_of,
    fail,
    note_profile,
    read_cluster,
    run_job,
    tracked,
    wide_console,
)
from pictl.cli.option_groups import MeasureFlags, OptionGroup, grouped
from pictl.planning.options import DATASETS, POLICIES, RUN_FLAGS, given_options
from pictl.planning.presets import available_presets, resolve_options


def _version(value: bool) -> None:
    if value:
        from pictl import __version__

        typer.echo(f"pictl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    hosts: HostsOpt = None,
    runs_dir: RunsDirOpt = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print pictl's version and exit.")] = False,
) -> None:
    """Without a command: the interactive dashboard (r run, s stop, t traces, / filter, h history, ? help, q quit).
    --hosts and --runs-dir given here hold for the command after them."""
    before_command.hosts, before_command.runs_dir = hosts, runs_dir
    if ctx.invoked_subcommand is not None:
        return
    try:
        _need_a_terminal()
        cluster = read_cluster(hosts)
        root = checked_runs_root(runs_dir)
    except E.PictlError as exc:
        fail(exc)
    from pictl.tui.app import PictlApp

    PictlApp(cluster, runs_root=root).run()


def _need_a_terminal() -> None:
    """The dashboard draws a full screen and reads keys: into a pipe it would write escape codes and wait
    forever for a `q` that never comes."""
    import sys

    missing = [name for name, stream in (("stdin", sys.stdin), ("stdout", sys.stdout))
               if stream is None or not stream.isatty()]
    if missing:
        raise E.ConfigError(f"the dashboard needs a terminal ({' and '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not one); use `pictl run --headless` "
                            f"in scripts")


EXPERIMENT = "Experiment"
if TYPE_CHECKING:  # to mypy, str Enums; built from the options' Literals so the two cannot drift apart
    class PolicyChoice(StrEnum): ...

    class DataChoice(StrEnum): ...

    class HostLossChoice(StrEnum): ...
else:
    PolicyChoice = choices("PolicyChoice", POLICIES)
    DataChoice = choices("DataChoice", DATASETS)
    HostLossChoice = choices("HostLossChoice", RUN_FLAGS["on_host_loss"].value_type)


@dataclasses.dataclass(frozen=True)
class ExperimentFlags(OptionGroup):
    """What the experiment is: the pipeline, its split, what crosses the cuts."""

    stages: Annotated[Optional[int], typer.Option(help="Pipeline stages (1 = serial only)." + default_of("stages"),
                                                  rich_help_panel=EXPERIMENT)] = None
    replicas: Annotated[Optional[int], typer.Option(
        help="Copies of the pipeline (replicas x stages ranks over the hosts); images are dealt among them, every "
             "replica's outputs checked." + default_of("replicas"), rich_help_panel=EXPERIMENT)] = None
    split: Annotated[Optional[str], typer.Option(help="Split points: blocks.3,blocks.6 (stage starts); implies "
                                                      "--policy explicit.", rich_help_panel=EXPERIMENT)] = None
    policy: Annotated[Optional[PolicyChoice], typer.Option(
        rich_help_panel=EXPERIMENT,
        help="balanced: measured costs, corrected by the run; equal: parameter counts; explicit: --split."
             + default_of("policy"))] = None
    profile: Annotated[Optional[str], typer.Option(help="Named preset (see `pictl profiles`).",
                                                   rich_help_panel=EXPERIMENT)] = None
    chunk: Annotated[Optional[int], typer.Option(help="Microbatch size." + default_of("chunk"),
                                                 rich_help_panel=EXPERIMENT)] = None
    refine: Annotated[Optional[bool], typer.Option("--refine/--no-refine", rich_help_panel=EXPERIMENT,
                                                   help="balanced: correct the split from the stages' measured "
                                                        "compute before the timed passes (default) or keep the "
                                                        "profiles' one-shot split.")] = None
    recut: Annotated[Optional[bool], typer.Option(
        "--recut/--no-recut", rich_help_panel=EXPERIMENT,
        help="balanced: re-cut between timed passes when a host slows down or recovers (default), or keep the "
             "refined split.")] = None
    max_recuts: Annotated[Optional[int], typer.Option(help="balanced: re-cuts per run at most."
                                                      + default_of("max_recuts"), rich_help_panel=EXPERIMENT)] = None
    slowdown: Annotated[Optional[str], typer.Option(hidden=True, help="Tests: RANK:PASS:FACTOR slows a rank from a "
                                                                      "timed pass on.")] = None
    wire: Annotated[Optional[str], typer.Option(
        help="What travels between stages: fp32 (exact), fp16, bf16, int8, lowrank:R; for every cut, or per cut "
             "(blocks.4=fp16,blocks.8=int8)." + default_of("wire"), rich_help_panel=EXPERIMENT)] = None
    numerics: Annotated[Optional[str], typer.Option(
        help="Every stage's numerics: fp32, or int8-dynamic (int8 Linear layers). The pipeline is checked "
             "against a serial run in the same numerics; an fp32 serial run measures their gain and loss."
             + default_of("numerics"), rich_help_panel=EXPERIMENT)] = None
    min_agreement: Annotated[Optional[float], typer.Option(
        help="A lossy --wire passes when this share of images gets the serial run's top-1 class."
             + default_of("min_agreement"), rich_help_panel=EXPERIMENT)] = None


@dataclasses.dataclass(frozen=True)
class RunMeasureFlags(MeasureFlags):
    """How a run is measured: the shared passes and threads, then traces, the baseline and the match."""

    trace_steps: Annotated[Optional[int], typer.Option(help="Profile K steps on every rank (extra untimed pass); "
                                                            "traces land in the run directory.",
                                                       rich_help_panel=MEASURE_PANEL)] = None
    fresh_baseline: Annotated[bool, typer.Option("--fresh-baseline", help="Measure the serial run again.",
                                                 rich_help_panel=MEASURE_PANEL)] = False
    baseline_max_age: Annotated[Optional[float], typer.Option(help="Reuse a cached serial baseline only if it is "
                                                                   "younger than this many seconds.",
                                                              rich_help_panel=MEASURE_PANEL)] = None
    atol: Annotated[Optional[float], typer.Option(help="Largest logit difference that still matches."
                                                       + default_of("atol"), rich_help_panel=MEASURE_PANEL)] = None


@dataclasses.dataclass(frozen=True)
class ModelFlags(OptionGroup):
    """The model, its weights and the images it runs."""

    model: Annotated[Optional[str], typer.Option(
        help="timm model name (ViTs, ResNets, MobileNets, EfficientNets, VGGs, ConvNeXts, RegNets), a Hugging Face "
             "classifier (hf:bert-base, hf:roberta-base, hf:DIR on the hosts), or an artifact from `pictl prune`."
             + default_of("model"), rich_help_panel=MODEL_PANEL)] = None
    list_splits: Annotated[bool, typer.Option(
        "--list-splits", help="List every place the model can be split (a stage may begin at any), then exit.",
        rich_help_panel=MODEL_PANEL)] = False
    num_classes: Annotated[Optional[int], typer.Option(help="Classifier outputs." + default_of("num_classes"),
                                                       rich_help_panel=MODEL_PANEL)] = None
    tokens: Annotated[Optional[int], typer.Option(help="Token ids per input of a text model (hf:...)."
                                                  + default_of("tokens"), rich_help_panel=MODEL_PANEL)] = None
    checkpoint: Annotated[Optional[str], typer.Option(help="State dict (.safetensors / .pth).",
                                                      rich_help_panel=MODEL_PANEL)] = None
    allow_pickle: Annotated[Optional[bool], typer.Option("--allow-pickle", help="Trust a pickled checkpoint.",
                                                         rich_help_panel=MODEL_PANEL)] = None
    data: Annotated[Optional[DataChoice], typer.Option(rich_help_panel=MODEL_PANEL,
                                                       help="Inputs to run: images, or token ids (tokens) for a text "
                                                            "model." + default_of("data"))] = None
    data_path: DataPathOpt = None


@dataclasses.dataclass(frozen=True)
class RunOutputFlags(OptionGroup):
    """What `pictl run` prints, which hosts it runs on and where its record goes (run's own words for
    --headless, --json and --wait: a run has a console and a summary)."""

    headless: Annotated[bool, typer.Option("--headless", help="No console: progress on stderr, the result on stdout "
                                                              "(also when stdout is not a terminal, and with --json).",
                                           rich_help_panel=HOSTS_PANEL)] = False
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one JSON object on stdout.",
                                          rich_help_panel=HOSTS_PANEL)] = False
    strict: Annotated[bool, typer.Option("--strict", help="Exit 7 if the result raises any sanity flag (a SUSPECT "
                                                          "result exits 10 without it).",
                                         rich_help_panel=HOSTS_PANEL)] = False
    verbose: VerboseOpt = False
    hosts: HostsOpt = None
    runs_dir: RunsDirOpt = None
    master_port: Annotated[Optional[int], typer.Option(help="Rendezvous port on host 0 (default: a free one).",
                                                       rich_help_panel=HOSTS_PANEL)] = None
    wait: Annotated[bool, typer.Option("--wait", help="If another run holds a host, wait for it (else exit 8).",
                                       rich_help_panel=HOSTS_PANEL)] = False
    on_host_loss: Annotated[Optional[HostLossChoice], typer.Option(
        help=RUN_FLAGS["on_host_loss"].help_text, rich_help_panel=HOSTS_PANEL)] = None
    cold: ColdOpt = False
    track: TrackOpt = None


@app.command()
@grouped
def run(experiment: ExperimentFlags, measure: RunMeasureFlags, model_data: ModelFlags,
        out: RunOutputFlags) -> None:
    """Run one experiment: serial baseline, N-stage pipeline, speedup and output check."""
    from pictl.headless import HeadlessRenderer
    from pictl.run.session import RunSession
    from pictl.verdict import suspect_error

    profile, slowdown, as_json = experiment.profile, experiment.slowdown, out.as_json
    renderer = HeadlessRenderer(verbose=out.verbose)
    try:
        # The one mapping from flags to options, the run form's too (choices, split points, the flag to blame):
        # every option of the groups that is a run option.
        flags = {name: value for group in (experiment, measure, model_data, out)
                 for name, value in group.values().items() if name in RUN_FLAGS}
        overrides = {**given_options(flags), "track": tracked(out.track)}
        if slowdown is not None:  # fault injection (tests): RANK:PASS:FACTOR
            try:
                overrides["slowdown"] = [float(x) for x in slowdown.split(":")]
            except ValueError:
                raise E.ConfigError(f"--slowdown: '{slowdown}' is not RANK:PASS:FACTOR") from None
        options = resolve_options(profile, overrides)
        note_profile(profile)
        if model_data.list_splits:
            raise typer.Exit(_list_splits(read_cluster(out.hosts, cold=out.cold), options, as_json))
        if not (out.headless or as_json) and _on_a_terminal():
            raise typer.Exit(_in_the_console(read_cluster(out.hosts, cold=out.cold), options, profile,
                                             checked_runs_root(out.runs_dir)))
    except E.PictlError as exc:
        renderer.close()
        fail(exc)
    summary = run_job(lambda: RunSession(read_cluster(out.hosts, cold=out.cold), options, on_event=renderer,
                                         runs_root=checked_runs_root(out.runs_dir),
                                         reuse_baseline=not measure.fresh_baseline, profile=profile, wait=out.wait),
                      renderer, as_json=as_json)
    if out.strict and summary.flags:  # asked for: any flag, a SUSPECT result's included, is exit 7
        fail(E.Flagged(f"--strict: the result raised {len(summary.flags)} sanity flag(s): "
                        + ", ".join(dict.fromkeys(f.code for f in summary.flags))))
    if (suspect := suspect_error(summary)) is not None:  # an untrue result is never a success, --strict or not
        fail(suspect)


def _list_splits(cluster: Any, options: Any, as_json: bool) -> int:
    """`--list-splits`: the model's cuts, as its first host plans it (the model is built there, on the meta
    device: nothing is run or measured, no host is leased)."""
    import json

    from pictl.planning.specs import model_cuts

    cuts = asyncio.run(model_cuts(cluster, options))
    if as_json:
        print(json.dumps({"model": options.model, "cuts": cuts}))
    else:
        print(f"{options.model}: {len(cuts)} places a stage may begin (--split takes them, comma-separated):")
        print("\n".join(cuts))
    return 0


def _on_a_terminal() -> bool:
    import sys

    return all(stream is not None and stream.isatty() for stream in (sys.stdin, sys.stdout))


def _in_the_console(cluster: Any, options: Any, profile: str | None, root: Path) -> int:
    """`pictl run` on a terminal: the dashboard, following this run from its start; the run's exit code once
    the console is closed (q)."""
    from pictl.tui.app import PictlApp

    app = PictlApp(cluster, runs_root=root, start=(options, profile))
    app.run()
    return app.run_exit_code if app.run_exit_code is not None else E.EXIT_INTERRUPTED


@app.command("profiles")
def list_profiles(as_json: JsonOpt = False) -> None:
    """List the run presets: name, what each is for, and its file (yours first, then ./profiles/, then the shipped)."""
    from rich.table import Table
    from rich.text import Text

    from pictl.planning.presets import describe_preset

    try:
        found = [(name, *describe_preset(name)) for name in available_presets()]
    except E.PictlError as exc:
        fail(exc)
    if as_json:
        typer.echo(json.dumps([{"name": n, "description": d, "path": str(p)} for n, d, p in found]))
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for heading in ("profile", "description", "file"):
        table.add_column(heading, overflow="fold")
    for name, description, path in found:
        # As text, never markup: a preset's own words ("[rules]") are shown as written, not read as styles.
        table.add_row(Text(name), Text(description or "-"), Text(str(path)))
    wide_console().print(table)
