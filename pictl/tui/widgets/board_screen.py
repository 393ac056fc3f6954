"""`g`: the class board on the dashboard. A one-field form asks for the folder of bundles; the screen shows the rows
`pictl board` shows for it (`pictl.jobs.grading.board`: its rows, order, cells and marks, none written again here),
fastest first, and the highlighted row's full why below the table."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from pictl import errors as E
from pictl.jobs.grading.board import HEADINGS, Row, Thresholds, board_rows, row_cells
from pictl.text import printable
from pictl.tui.widgets.form_screen import FormScreen


class BoardForm(FormScreen[tuple[Path, list[Row]] | None]):
    """Dismisses with the folder and its rows once the folder holds bundles; a folder that does not is one line."""

    def __init__(self, folder: str = "") -> None:
        super().__init__()
        self.folder = folder

    def compose(self) -> ComposeResult:
        with Vertical(id="board-form"):
            yield Label("The class board: a folder of bundles (*.bundle.tgz)", classes="form-title")
            yield Label("folder")
            yield Input(self.folder, placeholder="e.g. ~/grading/lab3", id="folder")
            yield Label("", id="form-error")
            with Horizontal(classes="buttons"):
                yield Button("Show", variant="primary", id="start")
                yield Button("Cancel", id="cancel")

    def _submit(self) -> None:
        given = self.query_one("#folder", Input).value.strip()
        if not given:
            self.show_error("folder: empty (give a folder of bundles, as `pictl board DIR` takes)")
            return
        folder = Path(given).expanduser()
        try:
            rows = board_rows(folder)  # checks each bundle as `pictl board` does (nothing runs)
        except E.PictlError as exc:
            self.show_error(exc)
            return
        self.dismiss((folder, rows))


class BoardScreen(Screen[None]):
    """The board's rows in a table; the highlighted row's why (and the thresholds) below it."""

    BINDINGS = [Binding("escape,g", "app.pop_screen", "back")]

    def __init__(self, folder: Path, rows: list[Row], marks: Thresholds | None = None) -> None:
        super().__init__()
        self.folder = folder
        self.rows = rows
        self.marks = marks or Thresholds()

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("", id="board-title")
            yield DataTable(id="board-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="board-detail")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for heading in HEADINGS:
            table.add_column(heading, key=heading)
        for i, row in enumerate(self.rows):
            # `pictl board`'s cells; the verified cell without its why, which is shown in full below.
            cells = (*row_cells(row, self.marks)[:-1], row.verified)
            table.add_row(*(Text(printable(c)) for c in cells), key=str(i))  # Text: a bundle's words, never markup
        said = f"class board: {len(self.rows)} bundles in {self.folder}, fastest first (Escape closes)"
        self.query_one("#board-title", Static).update(Text(printable(said), style="bold"))
        table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is None:
            return
        row = self.rows[int(event.row_key.value)]
        said = Text(printable(f"{row.team} ({row.file}): verified {row.verified}"), style="bold")
        said.append(Text("\n" + printable(row.why), style="red" if row.verified == "no" else ""))
        said.append(Text("\n" + self.marks.text() + "; < marks an accuracy below the floor", style="dim"))
        self.query_one("#board-detail", Static).update(said)
