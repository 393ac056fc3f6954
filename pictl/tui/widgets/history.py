"""Past runs from the run directory with their key figures: sort, filter, mark and compare, export CSV;
the highlighted run's summary and traces below the table."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from pictl import errors as E
from pictl.records.catalog import FoundRun, load_runs
from pictl.records.catalog_rows import SORT_KEYS, RunFilter, RunRow, cell, row, to_csv
from pictl.records.run_details import run_details
from pictl.text import markup_safe, printable

COLUMNS = (("run", "run_id"), ("status", "status"), ("stages", "stages"), ("policy", "policy"),
           ("img/s", "throughput_ips"), ("serial", "serial_ips"), ("speedup", "speedup"),
           ("match", "outputs_match"), ("flags", "flags"))


def parse_query(query: str) -> tuple[RunFilter, list[str]]:
    """`stages=4 policy=balanced status=ok since=2026-11-23 words`: the filter, and words that must appear in
    the run id or split (ConfigError naming a bad part)."""
    given: dict[str, Any] = {}
    words = []
    for part in query.split():
        key, sep, value = part.partition("=")
        if not sep:
            words.append(part.lower())
        elif key == "stages" and value.isdigit():
            given["stages"] = int(value)
        elif key in ("policy", "status", "since"):
            given[key] = value
        else:
            raise E.ConfigError(f"filter: {part!r} (use stages=N policy=NAME status=ok since=DATE, or words)")
    return RunFilter(**given), words


def history_cells(r: dict[str, Any], mark: str = "") -> list[Text]:
    """A run's row in the history table: each figure as every view writes it (`catalog_rows.cell`), as Text
    (a record's strings are shown as written, never parsed as markup)."""
    return [Text(printable((mark if k == "run_id" else "") + cell(k, r[k]))) for _, k in COLUMNS]


class HistoryScreen(Screen):
    """A table of past runs; the highlighted one's summary (or the marked runs side by side) below it."""

    BINDINGS = [
        Binding("escape,h", "app.pop_screen", "back"),
        Binding("s", "sort", "sort"),
        Binding("/", "filter", "filter"),
        Binding("space", "mark", "mark"),
        Binding("c", "compare", "compare marked"),
        Binding("e", "export", "export CSV"),
    ]

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.runs: list[FoundRun] = []
        self.rows: list[dict[str, Any]] = []
        self.shown: list[int] = []
        self.marked: set[str] = set()
        self.sort_key = "started"
        self.query_text = ""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(placeholder="filter: stages=4 policy=balanced status=ok since=2026-11-23 words "
                                    "(Enter keeps it, Escape clears)", id="history-filter")
            yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="history-detail")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.runs = load_runs(self.runs_root, limit=500)
        self.rows = [row(s) for s in self.runs]
        self.query_one(Input).display = False
        table = self.query_one(DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        self._fill()
        if not self.runs:
            self.query_one("#history-detail", Static).update(f"no runs in {markup_safe(self.runs_root)} yet")
        table.focus()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        try:
            where, words = parse_query(self.query_text)
        except E.PictlError as exc:
            self.query_one("#history-detail", Static).update(f"[red]{markup_safe(exc)}[/]")
            return
        picked = [i for i, r in enumerate(self.rows) if where.matches(r)
                  and all(w in f"{RunRow.view(r).run_id} {RunRow.view(r).split or ''}".lower() for w in words)]
        key = self.sort_key
        with_value = sorted((i for i in picked if self.rows[i][key] is not None), key=lambda i: self.rows[i][key],
                            reverse=True)
        self.shown = with_value + [i for i in picked if self.rows[i][key] is None]
        for i in self.shown:
            r = self.rows[i]
            mark = "* " if RunRow.view(r).run_id in self.marked else ""
            # Text cells: a record's strings are shown as written, never parsed as markup.
            table.add_row(*history_cells(r, mark), key=str(i))
        table.border_title = (f"{len(self.shown)} of {len(self.rows)} runs in {self.runs_root}, by {key}"
                              + (f", filter: {self.query_text}" if self.query_text else ""))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.query_one("#history-detail", Static).update(run_details(self.runs[int(event.row_key.value)]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.on_data_table_row_highlighted(event)  # type: ignore[arg-type]

    def _current(self) -> dict[str, Any] | None:
        table = self.query_one(DataTable)
        if not self.shown or table.cursor_row is None or table.cursor_row >= len(self.shown):
            return None
        return self.rows[self.shown[table.cursor_row]]

    def action_sort(self) -> None:
        self.sort_key = SORT_KEYS[(SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)]
        self._fill()

    def action_filter(self) -> None:
        box = self.query_one(Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_text = event.value.strip()
        self._fill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = bool(event.value)
        self.query_one(DataTable).focus()

    def on_key(self, event: events.Key) -> None:
        box = self.query_one(Input)
        if event.key == "escape" and box.display:
            box.value, box.display = "", False
            self.query_one(DataTable).focus()
            event.stop()

    def action_mark(self) -> None:
        current = self._current()
        if current is None:
            return
        self.marked ^= {str(RunRow.view(current).run_id)}
        cursor = self.query_one(DataTable).cursor_row
        self._fill()
        self.query_one(DataTable).move_cursor(row=cursor)

    def action_compare(self) -> None:
        chosen = [r for r in self.rows if RunRow.view(r).run_id in self.marked]
        if len(chosen) < 2:
            self.notify("mark two runs or more with space, then press c", severity="warning")
            return
        table = Table(show_header=True, header_style="bold", box=None)
        table.add_column("")
        for r in chosen:
            table.add_column(Text(printable(RunRow.view(r).run_id)))
        for label, key in COLUMNS[1:] + (("split", "split"), ("efficiency", "efficiency"),
                                         ("baseline", "baseline"), ("chunk", "chunk"), ("images", "images")):
            table.add_row(label, *(Text(printable(cell(key, r[key]))) for r in chosen))  # as the table writes it
        self.query_one("#history-detail", Static).update(table)

    def action_export(self) -> None:
        path = self.runs_root.parent / f"runs-{time.strftime('%Y%m%d-%H%M%S')}.csv"
        try:
            path.write_text(to_csv([self.rows[i] for i in self.shown]))
        except OSError as exc:
            self.notify(f"{path}: {exc.strerror or exc}", title="export", severity="error")
            return
        self.notify(f"{len(self.shown)} runs: {path}", title="exported", timeout=10, markup=False)
