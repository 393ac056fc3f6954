"""Every host's and rank's output, merged, prefixed `host/source`, filterable, in a bounded buffer."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, RichLog

from pictl.text import printable

MAX_LINES = 5000


@dataclass(frozen=True)
class Entry:
    host: str
    source: str
    stream: str
    line: str

    @property
    def prefix(self) -> str:
        return self.host if self.source in (self.host, "") else f"{self.host}/{self.source}"


@dataclass(frozen=True)
class LogFilter:
    """`host:h1 rank:0 some text`: every given part must match (text case-insensitively)."""

    host: str | None = None
    rank: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, query: str) -> LogFilter:
        host = rank = None
        words = []
        for word in query.split():
            if word.startswith("host:"):
                host = word[5:]
            elif word.startswith("rank:"):
                rank = word[5:]
            else:
                words.append(word)
        return cls(host, rank, " ".join(words).lower())

    def accepts(self, e: Entry) -> bool:
        if self.host and e.host != self.host:
            return False
        if self.rank is not None and e.source != f"rank{self.rank}":
            return False
        return not self.text or self.text in f"{e.prefix} {e.line}".lower()


class LogView(Vertical):
    """Keeps the last MAX_LINES lines; `/` opens the filter, Escape clears it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entries: deque[Entry] = deque(maxlen=MAX_LINES)
        self.filter = LogFilter()

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: host:NAME rank:N text   (Enter keeps it, Escape clears)", id="log-filter")
        yield RichLog(max_lines=MAX_LINES, wrap=False, markup=False, id="log-lines")

    def on_mount(self) -> None:
        self.query_one(Input).display = False

    def add(self, host: str, source: str, stream: str, line: str) -> None:
        entry = Entry(host, source, stream, printable(line))  # a host's escapes never reach the terminal
        self.entries.append(entry)
        if self.filter.accepts(entry):
            self.query_one(RichLog).write(self._line(entry))

    @staticmethod
    def _line(e: Entry) -> Text:
        style = "red" if e.stream == "stderr" and ("error" in e.line.lower() or "Traceback" in e.line) else ""
        return Text.assemble((f"{e.prefix:>14} ", "cyan"), (e.line, style))

    def open_filter(self) -> None:
        box = self.query_one(Input)
        box.display = True
        box.focus()

    def apply_filter(self, query: str) -> None:
        self.filter = LogFilter.parse(query)
        log = self.query_one(RichLog)
        log.clear()
        for e in self.entries:
            if self.filter.accepts(e):
                log.write(self._line(e))
        self.border_title = f"logs (filter: {query})" if query.strip() else "logs"

    def on_input_changed(self, event: Input.Changed) -> None:
        self.apply_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = bool(event.value)
        self.screen.set_focus(None)

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape" and self.query_one(Input).display:
            box = self.query_one(Input)
            box.value = ""
            box.display = False
            self.apply_filter("")
            event.stop()
