"""What every command shares: the Typer app, the options most commands take, one-line errors,
signals turned into a clean stop, and "connect to every host, do this, always close"."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional, TypeVar

import typer
from rich.console import Console
from typer import rich_utils as typer_help

from pictl import errors as E
from pictl.cli.help_layout import draw_option_tables_whole
from pictl.cluster.fleet import Fleet
from pictl.inventory import Cluster, load_cluster
from pictl.jobs.contract import Job
from pictl.planning.options import RunOptions
from pictl.records.trackers import TRACKERS
from pictl.shipped import shipped_path
from pictl.text import printable

T = TypeVar("T")

draw_option_tables_whole(typer_help)  # `--help` at 80 columns cut `--checkpoint-activations` short
app = typer.Typer(no_args_is_help=False, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Pipeline-parallel inference on a small cluster. Plain `pictl` opens the dashboard; "
                       "`pictl COMMAND -h` explains a command.")
SHIPPED_HOSTS = shipped_path("hosts.toml")

MEASURE_PANEL, HOSTS_PANEL, MODEL_PANEL = "Measurement", "Output and hosts", "Model and data"


def choices(name: str, values: tuple[str, ...]) -> Any:
    """A str Enum of `values`: Typer lists them in help and refuses anything else (exit 2)."""
    return StrEnum(name, {v: v for v in values})


def chosen(value: Enum | None) -> str | None:
    return None if value is None else str(value.value)


def default_of(name: str) -> str:
    """A run option's default as help shows it (the flags default to None so that a profile can set them)."""
    default = RunOptions.model_fields[name].default
    return f" \\[default: {default if default is not None else 'none'}]"  # escaped: Rich markup would eat it


def flag_names(**renamed: str) -> Callable[[str], str]:
    """How a command's error names an option's field: its flag, `--field-name` unless it is spelled otherwise
    (`model_args="--model-arg"`)."""
    from pictl.planning.options import as_flag

    return lambda field: renamed.get(field) or as_flag(field)


def path_arg(value: str) -> Path:
    """A path flag's value: an empty one is refused (Path('') would quietly mean the current directory)."""
    if not value.strip():
        raise typer.BadParameter("empty path")
    return Path(value)


HostsOpt = Annotated[Optional[Path], typer.Option(help="Inventory file (default ./hosts.toml, else shipped).",
                                                  rich_help_panel=HOSTS_PANEL, parser=path_arg)]
RunsDirOpt = Annotated[Optional[Path], typer.Option(help="Where run directories go.", rich_help_panel=HOSTS_PANEL,
                                                    parser=path_arg)]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait for hosts another run holds (else exit 8).",
                                       rich_help_panel=HOSTS_PANEL)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object on stdout.",
                                       rich_help_panel=HOSTS_PANEL)]
HeadlessOpt = Annotated[bool, typer.Option("--headless", help="No console: progress on stderr, the result on "
                                           "stdout (what a command that has no console always does).",
                                           rich_help_panel=HOSTS_PANEL)]
ColdOpt = Annotated[bool, typer.Option("--cold", help="Start every process afresh (each imports torch), not "
                                       "from the hosts' warm processes.", rich_help_panel=HOSTS_PANEL)]
if TYPE_CHECKING:  # (the commands import these when they run: `pictl --help` stays quick)
    from pictl.headless import HeadlessRenderer
    from pictl.job_summaries import PruneSummary, TrainSummary
    from pictl.jobs.generation.figures import GenerateSummary
    from pictl.summary_models import RunSummary

    S = TypeVar("S", RunSummary, TrainSummary, PruneSummary, GenerateSummary)

if TYPE_CHECKING:  # to mypy, a str Enum; built from the trackers' Literal so the two cannot drift apart
    class TrackerChoice(StrEnum): ...
else:
    TrackerChoice = choices("TrackerChoice", TRACKERS)
TrackOpt = Annotated[Optional[list[TrackerChoice]], typer.Option(
    "--track", help="Also write the result to an experiment tracker (repeat for both; W&B offline; default: the "
                    "inventory's [cluster] track).", rich_help_panel=HOSTS_PANEL)]


def tracked(values: list[TrackerChoice] | None) -> list[str] | None:
    """`--track` as the options take it (None: not given, the preset's or the inventory's stand)."""
    return [str(v.value) for v in values] if values else None


JobDirOpt = Annotated[Optional[Path], typer.Option(help="Where job directories go (default: beside the runs).",
                                                  rich_help_panel=HOSTS_PANEL)]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show every host's output.",
                                          rich_help_panel=HOSTS_PANEL)]
DataPathOpt = Annotated[Optional[str], typer.Option(help="Data set directory on the hosts (--data tokens: a file).",
                                                  rich_help_panel=MODEL_PANEL)]
ImagesOpt = Annotated[Optional[int], typer.Option(help="Images per pass." + default_of("images"),
                                                  rich_help_panel=MEASURE_PANEL)]
WarmupOpt = Annotated[Optional[int], typer.Option(help="Untimed warm-up passes." + default_of("warmup"),
                                                  rich_help_panel=MEASURE_PANEL)]
RepeatsOpt = Annotated[Optional[int], typer.Option(help="Timed passes." + default_of("repeats"),
                                                   rich_help_panel=MEASURE_PANEL)]
ThreadsOpt = Annotated[Optional[int], typer.Option(help="torch threads per rank (0: the host's cores shared "
                                                        "among its stages)." + default_of("threads"),
                                                   rich_help_panel=MEASURE_PANEL)]


def stderr() -> Console:
    # One line, however long: scripts grep it, and a wrapped path is a broken path.
    return Console(stderr=True, highlight=False, soft_wrap=True)


def note(message: str) -> None:
    stderr().print(f"pictl: note: {printable(message)}", markup=False, emoji=False)


def fail(exc: E.PictlError) -> NoReturn:
    stderr().print(f"pictl: error: {printable(exc)}", markup=False, emoji=False)
    raise typer.Exit(exc.exit_code)


def run_job(make: Callable[[], Job[S]], renderer: HeadlessRenderer, *, as_json: bool) -> S:
    """A job (`pictl run`, `train`, `prune`) run to its end as every command ends one: its events through
    `renderer`, then its result printed (`headless.print_result`) first, so a measured result is never lost to a
    full disk; a job that failed prints what it had and exits with its error's code; a record not written whole
    is said (exit 11 when the job itself ended well). `make` may refuse bad input (its ConfigError is the exit)."""
    from pictl.headless import print_result

    job: Job[S] | None = None
    try:
        job = make()
        summary = asyncio.run(run_cancellable(job.run()))
    except E.PictlError as exc:
        renderer.close()
        if job is not None and job.summary is not None:
            print_result(job.summary, as_json=as_json)
        if job is not None and job.write_error is not None and job.write_error is not exc:
            note(str(job.write_error))  # the job's own failure is the exit code; the record's is said too
        fail(exc)
    renderer.close()
    print_result(summary, as_json=as_json)
    if job.write_error is not None:
        fail(job.write_error)
    return summary


class _BeforeCommand:
    """`--hosts`/`--runs-dir` given before the command (`pictl --hosts x.toml run`): the app's callback
    records them, and every command's own option falls back to them."""

    hosts: Path | None = None
    runs_dir: Path | None = None


before_command = _BeforeCommand()


def top_level(name: str, value: Path | None) -> Path | None:
    """A command's `--hosts`/`--runs-dir`, or the one given before the command; two different values are
    refused rather than one silently winning."""
    before = getattr(before_command, name)
    if value is not None and before is not None and Path(value).resolve() != Path(before).resolve():
        flag = "--" + name.replace("_", "-")
        raise E.ConfigError(f"{flag}: given before the command ({before}) and after it ({value}); give it once")
    return value if value is not None else before


def before_runs_dir() -> Path | None:
    """`--runs-dir` given before the command (`pictl --runs-dir R train`)."""
    return getattr(before_command, "runs_dir", None)


def read_cluster(path: Path | None, *, cold: bool = False) -> Cluster:
    """The inventory (`--hosts`, else ./hosts.toml, else the shipped one); with `cold`, every host cold."""
    path = top_level("hosts", path)
    if path is None:
        local = Path.cwd() / "hosts.toml"
        path = local if local.is_file() else SHIPPED_HOSTS
    cluster = load_cluster(path)
    if cold:
        cluster = cluster.model_copy(update={"hosts": tuple(h.model_copy(update={"warm": False})
                                                            for h in cluster.hosts)})
    return cluster


def runs_root(runs_dir: Path | None) -> Path:
    """Where run directories are: `--runs-dir` (after or before the command), else the user's data folder."""
    from pictl.records.runs import default_runs_root

    return top_level("runs_dir", runs_dir) or default_runs_root()


def checked_runs_root(runs_dir: Path | None) -> Path:
    """Where run directories go, checked before anything starts (a file there is bad input, not a crash)."""
    from pictl.records.runs import writable_dir

    given = top_level("runs_dir", runs_dir)
    return writable_dir(runs_root(given), "--runs-dir" if given else "the runs directory")


def note_profile(profile: str | None) -> None:
    from pictl.planning.presets import shadowed_preset

    note = shadowed_preset(profile)
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
    """Connect to every host in parallel, run `work(fleet)`, always close (a job on the hosts like any
    other: `HostJob`). With `lease` (what is done, e.g. "push"), hold every host's lease meanwhile: the code
    or venv a live run uses is not replaced under it (a busy host: HostBusy, exit 8, or wait)."""
    import time

    from pictl.cluster.jobs import HostJob, no_tidy, to_the_end

    job = HostJob(hosts.hosts, f"{lease or 'hosts'}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        if lease:
            await job.hold(wait=wait, check_python=check_python)
        else:
            await job.connect()
        return await work(job.fleet)
    finally:
        await to_the_end(job.close(tidy=no_tidy))


def confirm(question: str) -> bool:
    """Ask on the terminal (or read an answer from stdin); no answer (end of input) is no."""
    try:
        return typer.confirm(question, default=False)
    except typer.Abort:
        return False


def wide_console() -> Console:
    """Tables on stdout: the terminal's width, or plain text never wrapped or padded when piped."""
    from pictl.console import result_console

    return result_console()

