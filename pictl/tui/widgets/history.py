"""Past runs from the run directory with their key figures; Enter shows one's summary and traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from pictl.records.catalog import fmt, load_runs, run_details


class HistoryScreen(Screen):
    """A table of past runs; the highlighted one's summary and traces below it."""

    BINDINGS = [("escape,h", "app.pop_screen", "back")]

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.runs: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="history-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.runs = load_runs(self.runs_root, limit=200)
        table = self.query_one(DataTable)
        table.border_title = f"runs in {self.runs_root}"
        for col in ("run", "status", "stages", "img/s", "serial", "speedup", "match", "traces", "flags"):
            table.add_column(col, key=col)
        for i, s in enumerate(self.runs):
            table.add_row(s.get("run_id", "?"), s.get("status", "?"), str(s.get("stages", "-")),
                          fmt(s.get("throughput_ips")), fmt(s.get("serial_ips")), fmt(s.get("speedup")),
                          str(s.get("outputs_match", "-")), str(len(s.get("traces") or [])),
                          str(len(s.get("flags") or [])) if "flags" in s else "-", key=str(i))
        if not self.runs:
            self.query_one("#history-detail", Static).update(f"no runs in {self.runs_root} yet")
        table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.query_one("#history-detail", Static).update(run_details(self.runs[int(event.row_key.value)]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.on_data_table_row_highlighted(event)  # type: ignore[arg-type]
