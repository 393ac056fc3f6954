"""pictl as a library: load a cluster, run experiments and training jobs, get typed summaries back, read past
runs. The CLI and the dashboard are built on the same sessions; this is their programmatic face.

    import pictl

    cluster = pictl.load_cluster()                       # ./hosts.toml, else the shipped local cluster
    summary = pictl.run_experiment(cluster, stages=2, split=["blocks.6"], images=24)
    print(summary.speedup, summary.outputs_match, summary.waterfall.dominant if summary.waterfall else None)
    for past in pictl.runs():                             # newest first
        print(past.run_id, past.speedup)

Also `tune` (as `pictl tune`: every configuration, the measured ones first, fastest first), `sweep` (every
combination of stages, chunks, policies and wire formats against shared baselines, as `pictl sweep`), `train` and
`prune` (as `pictl train` and `pictl prune`), each returning its typed summary. Every function has an `async` twin
(`run_experiment_async`, `sweep_async`, `train_async`, `prune_async`) for notebooks and event loops that are
already running. A job that started returns its summary whatever its status (`summary.status`: ok, failed,
interrupted; `summary.error` says why); bad input, an unreachable host or a busy one raise `PictlError` subclasses
(`pictl.errors`: each has the CLI's exit code as `exit_code`) before anything starts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.events import SessionEvent
from pictl.inventory import Cluster
from pictl.inventory import load_cluster as _load_cluster
from pictl.job_summaries import PruneSummary, TrainSummary
from pictl.jobs.prune import PruneSession
from pictl.jobs.prune_options import PruneOptions
from pictl.jobs.training.options import TrainOptions
from pictl.jobs.training.session import TrainSession
from pictl.jobs.tune_verdicts import Measured
from pictl.planning.options import RunOptions
from pictl.planning.presets import resolve_options
from pictl.records.runs import default_runs_root
from pictl.run.session import RunSession
from pictl.shipped import shipped_path
from pictl.summary import read_summary
from pictl.summary_models import RunSummary

__all__ = ["Cluster", "PruneOptions", "PruneSummary", "RunOptions", "RunSummary", "SweepResult", "TrainOptions",
           "TrainSummary", "load_cluster", "prune", "prune_async", "run_experiment", "run_experiment_async", "runs",
           "sweep", "sweep_async", "train", "train_async", "tune", "tune_async"]
# (`pictl.run` is the package of a run's phases: the library's verb is `run_experiment`.)

EventHandler = Callable[[SessionEvent], None]


def load_cluster(hosts: str | Path | None = None, *, cold: bool = False) -> Cluster:
    """The inventory at `hosts`, else ./hosts.toml, else the shipped local cluster; `cold`: no warm processes."""
    path = Path(hosts) if hosts is not None else Path("hosts.toml")
    cluster = _load_cluster(path if hosts is not None or path.is_file() else shipped_path("hosts.toml"))
    if cold:
        cluster = cluster.model_copy(update={"hosts": tuple(h.model_copy(update={"warm": False})
                                                            for h in cluster.hosts)})
    return cluster


async def _ended(session: RunSession | TrainSession | PruneSession, kept: str) -> Any:
    """`session.run()`'s summary, whatever its status: a job that started and failed still has one (its
    attribute `kept`); a failure before anything started has none, and is raised."""
    try:
        return await session.run()
    except E.PictlError:
        summary = getattr(session, kept)
        if summary is None:
            raise
        return summary


def _options(options: RunOptions | None, profile: str | None, fields: dict[str, Any]) -> RunOptions:
    if options is not None:
        return options.model_copy(update=fields) if fields else options
    return resolve_options(profile, fields)


async def run_experiment_async(cluster: Cluster | None = None, options: RunOptions | None = None, *,
                               profile: str | None = None, runs_dir: str | Path | None = None,
                               on_event: EventHandler | None = None, fresh_baseline: bool = False, wait: bool = False,
                               **fields: Any) -> RunSummary:
    """One experiment (as `pictl run`): `options`, or a preset (`profile`) with `fields` over it (any
    `RunOptions` field: stages=3, split=["blocks.4", "blocks.8"], images=48, ...). Returns the typed summary."""
    session = RunSession(cluster or load_cluster(), _options(options, profile, fields), on_event=on_event,
                         runs_root=Path(runs_dir) if runs_dir else None, reuse_baseline=not fresh_baseline,
                         profile=profile, wait=wait)
    summary: RunSummary = await _ended(session, "last_summary")
    return summary


def run_experiment(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> RunSummary:
    """`run_experiment_async`, for code that is not in an event loop."""
    return asyncio.run(run_experiment_async(cluster, options, **kwargs))


@dataclass(frozen=True)
class SweepResult:
    """A sweep's directory (sweep.json, table.csv, table.md, plots, each point's run under runs/) and its rows,
    one per point in the order run (the columns of `pictl sweep --json`)."""

    directory: Path
    rows: list[dict[str, Any]]


async def sweep_async(cluster: Cluster | None = None, options: RunOptions | None = None, *,
                      stages: list[int] = [1, 2, 3, 4], chunks: list[int] = [1],  # noqa: B006 - never mutated
                      policies: list[str] = ["balanced"], wires: list[str] | None = None,  # noqa: B006
                      out: str | Path | None = None, profile: str | None = None, on_event: EventHandler | None = None,
                      wait: bool = False, **fields: Any) -> SweepResult:
    """Every combination (as `pictl sweep`), each point's options from `options` or the preset with `fields` over
    it; a failed point is a row saying why, and the others still run. Bad input raises before anything starts."""
    from pictl.jobs.sweep import run_sweep, sweep_points

    chosen_cluster = cluster or load_cluster()
    base = _options(options, profile, fields)
    points = sweep_points(chosen_cluster, base, list(stages), list(chunks), list(policies), wires)
    target = Path(out) if out else default_runs_root().parent / "sweeps" / time.strftime("%Y%m%d-%H%M%S")
    if target.exists():
        raise E.ConfigError(f"out: {target} already exists")
    rows = await run_sweep(chosen_cluster, base, points, target, on_event=on_event, wait=wait)
    return SweepResult(target, rows)


def sweep(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> SweepResult:
    """`sweep_async`, for code that is not in an event loop."""
    return asyncio.run(sweep_async(cluster, options, **kwargs))


async def tune_async(cluster: Cluster | None = None, options: RunOptions | None = None, *, allow_loss: bool = False,
                     min_agreement: float = 0.99, measure: int = 3, budget_s: float = 1800.0,
                     out: str | Path | None = None, profile: str | None = None, on_event: EventHandler | None = None,
                     wait: bool = False, **fields: Any) -> list[Measured]:
    """As `pictl tune` (without saving a preset): every candidate, the measured ones (with a `status`) first and
    fastest first; `winner(rows)` (from
    `pictl.jobs.tune_verdicts`) is the one `pictl tune` would save. `tune.json` is in `out`. Threads and chunk
    are searched unless `options`, the profile or `fields` set them."""
    from pictl.jobs.tune import plan_tune, run_tune

    chosen_cluster = cluster or load_cluster()
    target = Path(out) if out else default_runs_root().parent / "tunes" / time.strftime("%Y%m%d-%H%M%S")
    if target.exists():
        raise E.ConfigError(f"out: {target} already exists")
    base, settings = plan_tune(profile, fields, allow_loss=allow_loss, min_agreement=min_agreement, measure=measure,
                               budget_s=budget_s, wait=wait)
    if options is not None:  # given whole: nothing in it is searched but the shapes (and numerics)
        base = _options(options, profile, fields)
        settings = replace(settings, search_threads=False, search_chunk=False)
    return await run_tune(chosen_cluster, base, settings, target, on_event=on_event)


def tune(cluster: Cluster | None = None, options: RunOptions | None = None, **kwargs: Any) -> list[Measured]:
    """`tune_async`, for code that is not in an event loop."""
    return asyncio.run(tune_async(cluster, options, **kwargs))


async def train_async(cluster: Cluster | None = None, options: TrainOptions | None = None, *,
                      root: str | Path | None = None, on_event: EventHandler | None = None, wait: bool = False,
                      **fields: Any) -> TrainSummary:
    """One training job (as `pictl train`): `options`, or `TrainOptions` fields. Returns its typed summary,
    whatever its status."""
    chosen = options.model_copy(update=fields) if options is not None else TrainOptions(**fields)
    session = TrainSession(cluster or load_cluster(), chosen, on_event=on_event, root=Path(root) if root else None,
                           wait=wait)
    summary: TrainSummary = await _ended(session, "summary")
    return summary


def train(cluster: Cluster | None = None, options: TrainOptions | None = None, **kwargs: Any) -> TrainSummary:
    """`train_async`, for code that is not in an event loop."""
    return asyncio.run(train_async(cluster, options, **kwargs))


async def prune_async(options: PruneOptions | None = None, *, cluster: Cluster | None = None,
                      on_host: str | None = None, root: str | Path | None = None,
                      on_event: EventHandler | None = None, wait: bool = False, **fields: Any) -> PruneSummary:
    """One pruning job (as `pictl prune`): on the controller, or on the inventory's host `on_host`. Returns its
    typed summary (the artifact it wrote, to run with `run_experiment(model=...)`), whatever its status."""
    chosen = options.model_copy(update=fields) if options is not None else PruneOptions(**fields)
    session = PruneSession(chosen, cluster=(cluster or load_cluster()) if on_host else None, on_host=on_host,
                           root=Path(root) if root else None, on_event=on_event, wait=wait)
    summary: PruneSummary = await _ended(session, "summary")
    return summary


def prune(options: PruneOptions | None = None, **kwargs: Any) -> PruneSummary:
    """`prune_async`, for code that is not in an event loop."""
    return asyncio.run(prune_async(options, **kwargs))


def runs(runs_dir: str | Path | None = None) -> list[RunSummary]:
    """Past runs' summaries, newest first; a record that does not read as a summary is left out."""
    root = Path(runs_dir) if runs_dir else default_runs_root()
    found = []
    for path in sorted(root.glob("*/summary.json"), reverse=True):
        try:
            found.append(read_summary(path))
        except E.PictlError:
            continue
    return sorted(found, key=lambda s: s.started_at or 0.0, reverse=True)
