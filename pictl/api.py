"""pictl as a library: load a cluster, run experiments and training jobs, get typed summaries back, read past
runs. The CLI and the dashboard are built on the same sessions; this is their programmatic face.

    import pictl

    cluster = pictl.load_cluster()                       # ./hosts.toml, else the shipped local cluster
    summary = pictl.run_experiment(cluster, stages=2, split=["blocks.6"], images=24)
    print(summary.speedup, summary.outputs_match, summary.waterfall.dominant if summary.waterfall else None)
    for past in pictl.runs():                             # newest first
        print(past.run_id, past.speedup)

Also `tune` (as `pictl tune`: every configuration, the measured ones first, fastest first), `sweep` (every
combination of stages, chunks, policies and wire formats against one serial reference in interleaved rounds, as
`pictl sweep`), `train` and `prune` (as `pictl train` and `pictl prune`), each returning its typed summary. Every
function has an `async` twin (`run_experiment_async`, `sweep_async`, `train_async`, `prune_async`) for notebooks
and event loops that are already running. A job that started returns its summary whatever its status
(`summary.status`: ok, failed, interrupted; `summary.error` says why); bad input, an unreachable host or a busy one
raise `PictlError` subclasses (`pictl.errors`: each has the CLI's exit code as `exit_code`) before anything starts.

Every argument is checked before a host is touched, by the same models and bounds the CLI's flags are (options
are always made anew through `resolve_options`, `train_options`, `prune_options`, `sweep_axes` and `plan_tune`,
never copied past their checks): a bad value raises `pictl.errors.ConfigError` naming the keyword as it is
spelled here (`images: must be between 1 and 2000 (got 1000000000)`), as `pictl run` exits 2 naming the flag."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from pictl import errors as E
from pictl.events import SessionEvent
from pictl.inventory import Cluster
from pictl.inventory import load_cluster as _load_cluster
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.jobs.contract import Job
from pictl.jobs.generation.figures import GenerateSummary
from pictl.jobs.generation.options import GenerateOptions, generate_options
from pictl.jobs.generation.session import GenerateSession, default_generations_root
from pictl.jobs.prune import PruneSession, default_prunes_root
from pictl.jobs.prune_options import PruneOptions, prune_options
from pictl.jobs.training.options import TrainOptions, train_options
from pictl.jobs.training.session import TrainSession, default_trains_root
from pictl.jobs.tune_verdicts import Measured
from pictl.planning.options import RunOptions
from pictl.planning.presets import preset_path, resolve_options
from pictl.records.runs import default_runs_root, writable_dir
from pictl.run.session import RunSession
from pictl.shipped import shipped_path
from pictl.summary import read_summary
from pictl.summary_models import RunSummary
from pictl.validation import got

S = TypeVar("S", RunSummary, TrainSummary, PruneSummary, GenerateSummary)

__all__ = ["Cluster", "GenerateOptions", "GenerateSummary", "PruneOptions", "PruneSummary", "RunOptions", "RunSummary",
           "SweepResult", "TrainOptions", "TrainSummary", "generate", "generate_async", "load_cluster", "prune",
           "prune_async", "run_experiment", "run_experiment_async", "runs", "sweep", "sweep_async", "train",
           "train_async", "tune", "tune_async"]
# (`pictl.run` is the package of a run's phases: the library's verb is `run_experiment`.)

EventHandler = Callable[[SessionEvent], None]


# -- the arguments that are not options: checked here, each named by its keyword --------------------------------

def _refuse(name: str, expected: str, value: Any) -> NoReturn:
    raise E.ConfigError(f"{name}: must be {expected} (got {got(value)})")


def _flag(name: str, value: Any) -> bool:
    """A yes/no argument: `cold="no"` is truthy, and would quietly mean yes."""
    if not isinstance(value, bool):
        _refuse(name, "True or False", value)
    return value


def _path(name: str, value: Any) -> Path | None:
    """A path argument (None: not given): text or a path, never empty, a number or bytes."""
    if value is None:
        return None
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if not isinstance(text, str) or not text.strip() or "\x00" in text:
        _refuse(name, "a path (a str or a pathlib.Path)", value)
    return Path(text)


def _directory(name: str, value: Any, default: Callable[[], Path], what: str) -> Path:
    """Where a job writes (`value`, else `default()`), checked as the CLI checks `--runs-dir` before anything
    starts: a directory that cannot be made there is refused now, not after the code was pushed."""
    given = _path(name, value)
    return writable_dir(given or default(), name if given else what)


def _new_directory(name: str, value: Any, default: Path) -> Path:
    """A sweep's or a tune's own directory: new, and one that can be made."""
    target = _path(name, value) or default
    if os.path.lexists(target):
        raise E.ConfigError(f"{name}: {target} already exists")
    return writable_dir(target, name)


def _handler(on_event: Any) -> EventHandler | None:
    if on_event is not None and not callable(on_event):
        _refuse("on_event", "a function that takes an event (or None)", on_event)
    return on_event


def _cluster(cluster: Any) -> Cluster:
    if cluster is None:
        return load_cluster()
    if not isinstance(cluster, Cluster):
        _refuse("cluster", "a pictl.Cluster, from pictl.load_cluster()", cluster)
    return cluster


def _listed(values: Any) -> Any:
    """A tuple or a range as the list a sweep's axis is; anything else as given, for the model to check."""
    return list(values) if isinstance(values, tuple | range) else values


def _given(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields given over an options object: None is "not given" (as a flag left out), never "erase it"."""
    return {k: v for k, v in fields.items() if v is not None}


def _run_options(options: Any, profile: Any, fields: dict[str, Any]) -> RunOptions:
    """`options` (or the preset `profile`) with `fields` over it, made anew by the one path every front end's
    options take (`resolve_options`): an options object edited after it was made is checked again, whole."""
    if options is None:
        return resolve_options(profile, fields, source="", name_of=str)
    if not isinstance(options, RunOptions):
        _refuse("options", "a pictl.RunOptions (or its fields as keywords)", options)
    if profile is not None:
        preset_path(profile)  # given beside options it names the run: it must still be a profile
    return resolve_options(None, {**options.model_dump(warnings=False), **_given(fields)}, source="", name_of=str)


def load_cluster(hosts: str | Path | None = None, *, cold: bool = False) -> Cluster:
    """The inventory at `hosts`, else ./hosts.toml, else the shipped local cluster; `cold`: no warm processes."""
    given = _path("hosts", hosts)
    cold = _flag("cold", cold)
    path = given or Path("hosts.toml")
    cluster = _load_cluster(path if given is not None or path.is_file() else shipped_path("hosts.toml"))
    if cold:
        cluster = cluster.model_copy(update={"hosts": tuple(h.model_copy(update={"warm": False})
                                                            for h in cluster.hosts)})
    return cluster


async def _ended(job: Job[S]) -> S:
    """The job's summary, whatever its status (`pictl.jobs.contract.Job`): a job that started and failed still
    has one; a failure before anything started has none, and is raised."""
    try:
        return await job.run()
    except E.PictlError:
        if job.summary is None:
            raise
        return job.summary


async def run_experiment_async(cluster: Cluster | None = None, options: RunOptions | None = None, *,
                               profile: str | None = None, runs_dir: str | Path | None = None,
                               on_event: EventHandler | None = None, fresh_baseline: bool = False, wait: bool = False,
                               **fields: Any) -> RunSummary:
    """One experiment (as `pictl run`): `options`, or a preset (`profile`) with `fields` over it (any
    `RunOptions` field: stages=3, split=["blocks.4", "blocks.8"], images=48, ...). Returns the typed summary."""
    reuse, wait = not _flag("fresh_baseline", fresh_baseline), _flag("wait", wait)
    handler = _handler(on_event)
    chosen = _run_options(options, profile, fields)
    root = _directory("runs_dir", runs_dir, default_runs_root, "the runs directory")
    session = RunSession(_cluster(cluster), chosen, on_event=handler, runs_root=root, reuse_baseline=reuse,
                         profile=profile, wait=wait)
    summary: RunSummary = await _ended(session)
    return summary


def run_experiment(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> RunSummary:
    """`run_experiment_async`, for code that is not in an event loop."""
    return asyncio.run(run_experiment_async(cluster, options, **kwargs))


@dataclass(frozen=True)
class SweepResult:
    """A sweep's directory (sweep.json, table.csv, table.md, plots; its runs are under the runs root, each naming
    the sweep) and its rows, one per point, fastest first (the columns of `pictl sweep --json`)."""

    directory: Path
    rows: list[dict[str, Any]]


async def sweep_async(cluster: Cluster | None = None, options: RunOptions | None = None, *,
                      stages: list[int] | None = None, chunks: list[int] | None = None,
                      policies: list[str] | None = None, wires: list[str] | None = None,
                      out: str | Path | None = None, profile: str | None = None, on_event: EventHandler | None = None,
                      wait: bool = False, rounds: int | None = None, max_rounds: int | None = None,
                      budget_s: float | None = None, runs_dir: str | Path | None = None, **fields: Any) -> SweepResult:
    """Every combination (as `pictl sweep`: against one serial reference in `rounds` interleaved rounds, more up
    to `max_rounds` while two are too close to call, none added after `budget_s`; its runs under `runs_dir`, the
    runs root by default), each point's options from `options` or the preset with `fields` over it; a failed point
    is a row saying why, and the others still run. Bad input raises before anything starts. As `pictl sweep`:
    `stages`, `chunks` and `policies` not given are the preset's [sweep] values (stages 1-4, chunk 1, equal
    without one), and the preset's `slots` let a stage count beyond the inventory's slots run."""
    from pictl.jobs.sweep import run_sweep, sweep_points, wire_formats
    from pictl.jobs.sweep_rounds import rounds_plan
    from pictl.planning.presets import sweep_axes, sweep_settings

    plan = rounds_plan(rounds, max_rounds, budget_s, names=("rounds", "max_rounds", "budget_s"))
    wait, handler = _flag("wait", wait), _handler(on_event)
    base = _run_options(options, profile, fields)
    preset = sweep_settings(profile)  # (checked by _run_options above; the values given win over its [sweep])
    axes = sweep_axes(preset.stages if stages is None else _listed(stages),
                      preset.chunks if chunks is None else _listed(chunks),
                      preset.policy if policies is None else _listed(policies),
                      name_of=lambda field: "policies" if field == "policy" else field, slots=preset.slots)
    formats = wire_formats("wires", _listed(wires)) if wires is not None else None
    root = _directory("runs_dir", runs_dir, default_runs_root, "the runs directory")
    target = _new_directory("out", out, root.parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S"))
    chosen_cluster = _cluster(cluster)
    points = sweep_points(chosen_cluster, base, axes, formats)
    rows = await run_sweep(chosen_cluster, base, points, target, on_event=handler, wait=wait, rounds=plan,
                           runs_root=root)
    return SweepResult(target, rows)


def sweep(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> SweepResult:
    """`sweep_async`, for code that is not in an event loop."""
    return asyncio.run(sweep_async(cluster, options, **kwargs))


async def tune_async(cluster: Cluster | None = None, options: RunOptions | None = None, *, allow_loss: bool = False,
                     min_agreement: float = 0.99, measure: int | None = None, budget_s: float = 1800.0,
                     out: str | Path | None = None, profile: str | None = None, on_event: EventHandler | None = None,
                     wait: bool = False, max_rounds: int = 9, **fields: Any) -> list[Measured]:
    """As `pictl tune` (without saving a preset): every candidate, those measured in rounds first and fastest
    first; `winner(rows)` (from `pictl.jobs.tune_verdicts`) is the one the rounds decided on, which `pictl tune`
    would save. `tune.json` is in `out`. Threads and chunk are searched unless `options`, the profile or
    `fields` set them; `measure` is 3 by default, 5 with `allow_loss`; `max_rounds` as `--max-rounds`."""
    from pictl.jobs.tune import plan_tune, run_tune

    handler = _handler(on_event)
    base, settings = plan_tune(profile if options is None else None, fields, allow_loss=allow_loss,
                               min_agreement=min_agreement, measure=measure, budget_s=budget_s, wait=wait,
                               max_rounds=max_rounds, name_of=str)
    if options is not None:  # given whole: nothing in it is searched but the shapes (and numerics)
        base = _run_options(options, profile, fields)
        settings = replace(settings, search_threads=False, search_chunk=False)
    target = _new_directory("out", out, default_runs_root().parent / "tunes" / time.strftime("%Y%m%d-%H%M%S"))
    return await run_tune(_cluster(cluster), base, settings, target, on_event=handler)


def tune(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> list[Measured]:
    """`tune_async`, for code that is not in an event loop."""
    return asyncio.run(tune_async(cluster, options, **kwargs))


def _job_options(options: Any, fields: dict[str, Any],
                 kind: type[TrainOptions] | type[PruneOptions] | type[GenerateOptions],
                 check: Callable[..., Any]) -> Any:
    """A training, pruning or generation job's options, made anew by the path its command takes."""
    if options is not None and not isinstance(options, kind):
        _refuse("options", f"a pictl.{kind.__name__} (or its fields as keywords)", options)
    values = {**options.model_dump(warnings=False), **_given(fields)} if options is not None else fields
    return check(values, name_of=str)


async def train_async(cluster: Cluster | None = None, options: TrainOptions | None = None, *,
                      root: str | Path | None = None, on_event: EventHandler | None = None, wait: bool = False,
                      **fields: Any) -> TrainSummary:
    """One training job (as `pictl train`): `options`, or `TrainOptions` fields. Returns its typed summary,
    whatever its status."""
    wait, handler = _flag("wait", wait), _handler(on_event)
    chosen: TrainOptions = _job_options(options, fields, TrainOptions, train_options)
    where = _directory("root", root, default_trains_root, "the training jobs' directory")
    session = TrainSession(_cluster(cluster), chosen, on_event=handler, root=where, wait=wait)
    summary: TrainSummary = await _ended(session)
    return summary


def train(cluster: Cluster | None = None, options: TrainOptions | None = None, **kwargs: Any) -> TrainSummary:
    """`train_async`, for code that is not in an event loop."""
    return asyncio.run(train_async(cluster, options, **kwargs))


async def generate_async(cluster: Cluster | None = None, options: GenerateOptions | None = None, *,
                         root: str | Path | None = None, on_event: EventHandler | None = None, wait: bool = False,
                         **fields: Any) -> GenerateSummary:
    """One generation job (as `pictl generate`): `options`, or `GenerateOptions` fields (`prompts` as token-id
    lists). Returns its typed summary, whatever its status."""
    wait, handler = _flag("wait", wait), _handler(on_event)
    chosen: GenerateOptions = _job_options(options, fields, GenerateOptions, generate_options)
    where = _directory("root", root, default_generations_root, "the generation jobs' directory")
    session = GenerateSession(_cluster(cluster), chosen, on_event=handler, root=where, wait=wait)
    summary: GenerateSummary = await _ended(session)
    return summary


def generate(cluster: Cluster | None = None, options: GenerateOptions | None = None, **kwargs: Any) -> GenerateSummary:
    """`generate_async`, for code that is not in an event loop."""
    return asyncio.run(generate_async(cluster, options, **kwargs))


async def prune_async(options: PruneOptions | None = None, *, cluster: Cluster | None = None,
                      on_host: str | None = None, root: str | Path | None = None,
                      on_event: EventHandler | None = None, wait: bool = False, **fields: Any) -> PruneSummary:
    """One pruning job (as `pictl prune`): on the controller, or on the inventory's host `on_host`. Returns its
    typed summary (the artifact it wrote, to run with `run_experiment(model=...)`), whatever its status."""
    wait, handler = _flag("wait", wait), _handler(on_event)
    if on_host is not None and (not isinstance(on_host, str) or not on_host):
        _refuse("on_host", "the name of a host in the inventory", on_host)
    chosen: PruneOptions = _job_options(options, fields, PruneOptions, prune_options)
    where = _directory("root", root, default_prunes_root, "the pruning jobs' directory")
    session = PruneSession(chosen, cluster=_cluster(cluster) if on_host else None, on_host=on_host, root=where,
                           on_event=handler, wait=wait)
    summary: PruneSummary = await _ended(session)
    return summary


def prune(options: PruneOptions | None = None, **kwargs: Any) -> PruneSummary:
    """`prune_async`, for code that is not in an event loop."""
    return asyncio.run(prune_async(options, **kwargs))


def runs(runs_dir: str | Path | None = None) -> list[RunSummary]:
    """Past runs' summaries, newest first; a record that does not read as a summary is left out."""
    root = _path("runs_dir", runs_dir) or default_runs_root()
    found = []
    for path in sorted(root.glob("*/summary.json"), reverse=True):
        try:
            found.append(read_summary(path))
        except E.PictlError:
            continue
    return sorted(found, key=lambda s: s.started_at or 0.0, reverse=True)
