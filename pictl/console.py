"""Where results are printed: a terminal gets Rich at its own width; a file or a pipe gets plain text that is
never wrapped and never padded (each line as long as it needs, trailing spaces dropped), so `make demo > log`
keeps every figure and path on one greppable line. On a narrow terminal a table leaves out its least important
columns (`Fitted`) and a line of fields breaks between fields (`Fields`), never inside a word."""

from __future__ import annotations

import copy
import io
import sys
from collections.abc import Sequence
from typing import IO, Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

PLAIN_WIDTH = 4096
"""Wide enough that no table or line of pictl's is wrapped in plain output."""


class _Drawn(io.StringIO):
    """What a PlainConsole draws into. It says its target's encoding (a StringIO says none, which Rich takes
    for UTF-8), so that tables bound for a stream that cannot take box-drawing characters are drawn in ASCII."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._target_encoding = encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._target_encoding


class PlainConsole(Console):
    """A Console for a file or a pipe: each print is drawn wide, then written with its lines' trailing spaces
    dropped."""

    def __init__(self, target: IO[str], **kwargs: Any) -> None:
        super().__init__(file=_Drawn(getattr(target, "encoding", None) or "utf-8"), width=PLAIN_WIDTH,
                         color_system=None, force_terminal=False, soft_wrap=True, **kwargs)
        self._target = target

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: D102 - Console.print, made plain
        super().print(*objects, **kwargs)
        buffer = self.file
        assert isinstance(buffer, io.StringIO)
        text, _ = buffer.getvalue(), buffer.seek(0)
        buffer.truncate()
        self._target.write("\n".join(line.rstrip() for line in text.split("\n")))
        self._target.flush()


def result_console(*, stderr: bool = False, **kwargs: Any) -> Console:
    """The console results go to: stdout (or stderr), Rich on a terminal, plain text otherwise."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, **kwargs)
    return PlainConsole(stream, **{k: v for k, v in kwargs.items() if k not in ("width", "soft_wrap")})


class Fitted:
    """A table drawn at the width it gets: while its columns, each cell on one line, are wider than that, the
    next of `drop` (the least important first) is left out, and a caption says which went. Rich would instead
    squeeze every column alike, to `h…` in each cell at 80 columns. `whole` ends the caption: where every column
    is to be had (`; pictl check --json has every field`)."""

    def __init__(self, table: Table, drop: Sequence[str], *, whole: str = "") -> None:
        self.table, self.drop, self.whole = table, tuple(drop), whole

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        def fits(table: Table) -> bool:
            return console.measure(table, options=options.update_width(PLAIN_WIDTH)).maximum <= options.max_width

        shown, left_out = self.table, []
        for heading in self.drop:
            if fits(shown):
                break
            left_out.append(heading)
            shown = self._without(left_out)
        for heading in reversed(left_out[:-1]):  # a narrower column left out before a wide one may fit again
            if fits(candidate := self._without([h for h in left_out if h != heading])):
                left_out.remove(heading)
                shown = candidate
        if left_out:
            shown.caption = Text(f"left out at {options.max_width} columns: {', '.join(left_out)}{self.whole}",
                                 style="dim")
            shown.caption_justify = "left"
        yield shown

    def _without(self, headings: list[str]) -> Table:
        table = copy.copy(self.table)
        table.columns = []
        for column in self.table.columns:
            heading = column.header.plain if isinstance(column.header, Text) else str(column.header)
            if heading not in headings:
                kept = copy.copy(column)
                kept._index = len(table.columns)
                table.columns.append(kept)
        return table


class Fields:
    """Fields on one line, two spaces apart, that break onto further lines (indented) between fields where the
    width ends, never inside one: a terminal wrapped the result line mid-word. A file gets one line."""

    def __init__(self, fields: Sequence[str], *, style: str = "") -> None:
        self.fields, self.style = [f for f in fields if f], style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines: list[str] = []
        for field in self.fields:
            if lines and cell_len(lines[-1]) + 2 + cell_len(field) <= options.max_width:
                lines[-1] += "  " + field
            else:
                lines.append(("  " if lines else "") + field)
        # A field wider than the line on its own wraps at its spaces (Rich's), still never mid-word.
        yield Text("\n".join(lines), style=self.style)
