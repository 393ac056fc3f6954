"""How `pictl ... --help` lays out its option tables: every option's name whole, at any width.

Typer draws each help panel as a Rich table whose columns are the flag, its short form, the `--no-` twin, its
short form, the value's type and the help; Rich fits a table that is too wide by narrowing its widest columns
first, whichever they are, so at 80 columns `--checkpoint-activations / --keep-activations` came out as
`--checkpoint-act…  --keep-activati…`. Here the name columns never wrap or shrink: where the names would leave
the help too little room, each twin goes under its flag instead of beside it; a long list of choices breaks
after a `|`; a word wider than the help column folds rather than being cut.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

OPTION_COLUMNS = 6
"""An option table's columns (a seventh in front marks required options): long, short, twin long, twin short,
type, help."""
HELP_ROOM = 0.5
"""The share of the width the names (then the names and types) may take before twins go under their flags
(before lists of choices break)."""
TYPE_WIDTH = 14
"""How wide a list of choices (`<synthetic|cifar10|...>`) may be on one line when it breaks."""
PADDING = 2
"""A column's padding, one space either side."""


class OptionTable(Table):
    """Typer's table of a help panel's options, with each option's names kept whole."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.show_header and len(self.columns) >= OPTION_COLUMNS:  # (a commands table has two)
            *names, types, text = self.columns
            for column in names:
                column.no_wrap = True
            text.overflow = "fold"
            if _width(console, options, names) > options.max_width * HELP_ROOM:
                _stack_twins(names[-OPTION_COLUMNS + 2], names[-OPTION_COLUMNS + 4])
            if _width(console, options, [*names, types]) > options.max_width * HELP_ROOM:
                types._cells = [_choices_broken(cell) for cell in types.cells]
        return super().__rich_console__(console, options)


def _width(console: Console, options: ConsoleOptions, columns: list[Column]) -> int:
    """The columns' width with every cell on one line."""
    return sum(max((console.measure(cell, options=options).maximum for cell in c.cells), default=0) + PADDING
               for c in columns)


def _stack_twins(flags: Column, twins: Column) -> None:
    """Each `--no-` twin on a line of its own under its flag; the twins' column left empty."""
    pairs = list(zip(flags.cells, twins.cells, strict=True))
    flags._cells = [Text("\n").join([flag, twin]) if isinstance(flag, Text) and isinstance(twin, Text)
                    and twin.plain else flag for flag, twin in pairs]
    twins._cells = [Text("") for _ in pairs]


def _choices_broken(cell: Any) -> Any:
    """`<a|b|c|...>` on lines of at most TYPE_WIDTH characters, each broken after a `|`."""
    if not isinstance(cell, Text) or "\n" in cell.plain or len(cell.plain) <= TYPE_WIDTH:
        return cell
    bars = [i + 1 for i, ch in enumerate(cell.plain) if ch == "|"]
    lines: list[Text] = []
    for piece in cell.divide(bars):
        if lines and len(lines[-1].plain) + len(piece.plain) <= TYPE_WIDTH:
            lines[-1].append_text(piece)
        else:
            lines.append(piece)
    return Text("\n").join(lines)


def draw_option_tables_whole(rich_utils: Any) -> None:
    """Make typer's help (its `rich_utils` module) draw its tables as `OptionTable`."""
    rich_utils.Table = OptionTable
