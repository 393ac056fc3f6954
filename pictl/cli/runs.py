"""`pictl runs`: past runs as data. List them (filtered, sorted), show one, compare several side by side,
export them as CSV. Runs are named by id, a unique id prefix, or their directory.

A record that does not keep the summary's contract is left out of a list with one `pictl: note:` line on
stderr naming it; named alone (`show`, `compare`), it is refused with one error line (exit 2). What a record
holds reaches the terminal as text (never Rich markup, no control characters); `--json` is strict JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from pictl import errors as E
from pictl.cli.common import (
    JsonOpt,
    RunsDirOpt,
    TrackerChoice,
    app,
    fail,
    note,
    runs_root,
    stderr,
    tracked,
    wide_console,
)
from pictl.console import Fitted
from pictl.records import catalog, catalog_rows
from pictl.records import waterfall_view as wv
from pictl.records.run_details import run_details

runs_app = typer.Typer(help="Past runs: list (filter, sort), show one, compare several, export as CSV.",
                       context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(runs_app, name="runs")

SinceOpt = Annotated[Optional[str], typer.Option(help="Runs started on or after this date (2026-11-23) or time.")]
StagesOpt = Annotated[Optional[int], typer.Option(help="Only runs with this many stages.")]
PolicyOpt = Annotated[Optional[str], typer.Option(help="Only runs with this policy (balanced, equal, explicit).")]
StatusOpt = Annotated[Optional[str], typer.Option(help="Only runs with this status (ok, suspect, failed, "
                                                           "interrupted).")]
SortOpt = Annotated[str, typer.Option(help=f"Sort by one of: {', '.join(catalog_rows.SORT_KEYS)} (largest first).")]
SHORT = ("run_id", "status", "stages", "policy", "chunk", "throughput_ips", "serial_ips", "speedup", "latency_p50_ms",
         "latency_p95_ms", "dominant", "outputs_match", "flags", "part_of")
"""The list's columns on a terminal (`--json` and the CSV have all of `catalog_rows.COLUMNS`)."""
HEADINGS = {"run_id": "run", "throughput_ips": "img/s", "serial_ips": "serial", "outputs_match": "match",
            "part_of": "part of", "energy_j_per_image": "J/img", "serial_energy_j_per_image": "serial J/img",
            **{key: key.removesuffix("_ms").replace("_", " ") + " ms" for key in wv.LATENCY_KEYS},
            **{f"{term}_points": ("fill/drain" if term == "fill_drain" else term.replace("_", " ")) + " points"
               for term in wv.KNOWN_TERMS}}
SHORT_HEADINGS = {**HEADINGS, "latency_p50_ms": "p50 ms", "latency_p95_ms": "p95 ms"}
"""The list's headings: latency is the pipeline's per image (`runs compare` says so in full)."""
LEFT_OUT_FIRST = ("latency_p95_ms", "part_of", "chunk", "policy", "dominant", "latency_p50_ms", "serial_ips", "stages",
                  "flags")
"""Where the terminal is too narrow for the list, these columns go first: the run, its status, img/s, speedup and
whether its outputs matched stay."""


@runs_app.callback(invoke_without_command=True)
def list_runs(
    ctx: typer.Context,
    since: SinceOpt = None,
    stages: StagesOpt = None,
    policy: PolicyOpt = None,
    status: StatusOpt = None,
    sort: SortOpt = "started",
    limit: Annotated[int, typer.Option(help="Show at most N runs.", min=1)] = 50,
    as_json: JsonOpt = False,
    runs_dir: RunsDirOpt = None,
) -> None:
    """List past runs, newest first (or sorted by --sort), filtered by date, stages, policy and status."""
    if ctx.invoked_subcommand is not None:
        return
    skipped: list[catalog.Skipped] = []
    try:
        root = runs_root(runs_dir)
        rows = catalog_rows.table_rows(root, catalog_rows.RunFilter(since, stages, policy, status), sort,
                                  skipped=skipped)[:limit]
    except E.PictlError as exc:
        fail(exc)
    _notes(skipped)
    if as_json:
        typer.echo(catalog_rows.json_text(rows))
        return
    if not rows:
        typer.echo(f"no runs in {catalog.terminal_text(root)} match", err=True)
        return
    wide_console().print(_table(rows, SHORT, title=f"runs in {catalog.terminal_text(root)}"))


@runs_app.command()
def show(
    run: Annotated[str, typer.Argument(help="Run id, unique id prefix, or directory.")],
    as_json: JsonOpt = False,
    runs_dir: RunsDirOpt = None,
) -> None:
    """One run's summary: figures, latency, why the speedup is not N (term by term), baseline, flags, stages
    and traces."""
    skipped: list[catalog.Skipped] = []
    try:
        path = catalog.resolve_run(runs_root(runs_dir), run)
        found = catalog.read_run(path, skipped)
    except E.PictlError as exc:
        fail(exc)
    _notes(skipped)
    if as_json:
        typer.echo(catalog_rows.json_text(catalog.as_written(found)))
        return
    wide_console().print(run_details(found))


@runs_app.command()
def compare(
    runs: Annotated[list[str], typer.Argument(help="Two or more runs: ids, unique id prefixes, or directories.")],
    as_json: JsonOpt = False,
    runs_dir: RunsDirOpt = None,
) -> None:
    """Runs side by side: one column per run, one line per figure (latency and each waterfall term among them);
    runs of one sweep are judged from its rounds (a winner only beyond the noise, else a tie)."""
    try:
        if len(runs) < 2:
            raise E.ConfigError("compare: name two runs or more")
        root = runs_root(runs_dir)
        rows = catalog_rows.compare_rows([catalog.resolve_run(root, r) for r in runs])
    except E.PictlError as exc:
        fail(exc)
    if as_json:
        typer.echo(catalog_rows.json_text(rows))
        return
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for r in rows:
        table.add_column(_cell(r["run_id"]), overflow="fold")
    for key in catalog_rows.COMPARE_COLUMNS[1:]:
        table.add_row(HEADINGS.get(key, key), *(_cell(r[key], key) for r in rows))
    wide_console().print(table)
    for r in rows[1:]:  # each against the first: a winner only beyond the noise, from one sweep's rounds
        typer.echo(catalog.terminal_text(f"{r['run_id']} against {rows[0]['run_id']}: {r['verdict']['text']}"))


@runs_app.command()
def export(
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Write CSV here (default: stdout).")] = None,
    since: SinceOpt = None,
    stages: StagesOpt = None,
    policy: PolicyOpt = None,
    status: StatusOpt = None,
    sort: SortOpt = "started",
    runs_dir: RunsDirOpt = None,
) -> None:
    """Every matching run as one CSV row (all columns)."""
    skipped: list[catalog.Skipped] = []
    try:
        rows = catalog_rows.table_rows(runs_root(runs_dir), catalog_rows.RunFilter(since, stages, policy, status), sort,
                                  skipped=skipped)
        text = catalog_rows.to_csv(rows)
        if csv_path is not None:
            try:
                csv_path.write_text(text)
            except OSError as exc:
                raise E.ConfigError(f"--csv: {catalog.terminal_text(csv_path)}: {exc.strerror or exc}") from None
    except E.PictlError as exc:
        fail(exc)
    _notes(skipped)
    if csv_path is None:
        typer.echo(text, nl=False)
    else:
        typer.echo(f"{len(rows)} runs: {catalog.terminal_text(csv_path)}", err=True)


def _notes(skipped: list[catalog.Skipped]) -> None:
    """One line on stderr per record left out (emoji off: a `:name:` in a directory's name stays text)."""
    err = stderr()
    for item in skipped:
        err.print(f"pictl: note: {item}", markup=False, emoji=False)


def _cell(value: Any, key: str = "") -> Text:
    """A value from a record as a table cell: a figure as every view writes it, anything else plain text (never
    Rich markup), printable, not megabytes long."""
    return Text(catalog_rows.cell(key, value))


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...], title: str) -> Fitted:
    table = Table(title=Text(title), show_header=True, header_style="bold", title_justify="left")
    for key in columns:
        table.add_column(SHORT_HEADINGS.get(key, key), no_wrap=key == "run_id")
    for r in rows:
        table.add_row(*(_cell(r[k], k) for k in columns))
    return Fitted(table, [SHORT_HEADINGS.get(k, k) for k in LEFT_OUT_FIRST], whole="; --json has every column")


@app.command("track")
def track(
    record: Annotated[str, typer.Argument(help="A run (id, unique id prefix, or directory), a training job's or "
                                               "a sweep's directory.")],
    to: Annotated[list[TrackerChoice], typer.Option("--to", help="Tracker to write it to (repeat for both).")],
    runs_dir: RunsDirOpt = None,
) -> None:
    """Write a past run, training job or sweep to TensorBoard or W&B (offline), beside its record."""
    from pictl.records.tracker_writers import check_trackers, said, write_series
    from pictl.records.trackers import record_series

    kinds = tracked(to) or []
    try:
        check_trackers(kinds, "--to")
        path = catalog.resolve_run(runs_root(runs_dir), record)  # a directory is taken as it is
        series = record_series(path)
        for line in series.notes:  # what of the record was left out (a file read only up to its cap)
            note(line)
        written = write_series(kinds, path, series)
    except E.PictlError as exc:
        fail(exc)
    for kind, where in written.items():
        typer.echo(said(kind, where))
