"""Text from outside pictl (a host's output, a record's fields, a directory's name) made safe to show.

A host or a record is not trusted to talk to the terminal: control characters (escape sequences that
retitle the window, clear the screen or write the clipboard with OSC 52) are replaced before anything
reaches a terminal, and text bound for Rich markup is escaped so that `[/]` or `deit[pruned-0.3]`
prints as written instead of crashing the renderer or vanishing.
"""

from __future__ import annotations

import re

from rich.markup import escape

__all__ = ["ascii_count", "markup_safe", "printable", "shown"]

# C0 controls except tab, DEL, the C1 controls (0x80-0x9f: a lone CSI is 0x9b) and the bidirectional
# overrides that can make a line read differently from what it holds.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` as a string with every control character shown as U+FFFD (never interpreted), and a lone
    surrogate (a JSON `\\udcff`, a file name that is not UTF-8) written out instead of failing the write."""
    return _CONTROL.sub("\ufffd", str(text)).encode("utf-8", "backslashreplace").decode("utf-8")


def markup_safe(text: object) -> str:
    """`text` made printable and escaped for Rich markup."""
    return escape(printable(text))


def shown(text: object, limit: int = 300) -> str:
    """Printable, and at most `limit` characters (a hostile value may be megabytes long)."""
    s = printable(text)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s) - limit} more characters)"


def ascii_count(text: str, *, most: int = 1 << 31) -> int | None:
    """`text` (stripped) as a whole number 0..`most` written in ASCII digits, else None. `str.isdigit` and `int`
    also take other scripts' digits and superscripts ('٣', '１２', '²'): never from a host or a flag."""
    s = text.strip()
    if not s or len(s) > 12 or not (s.isascii() and s.isdigit()):
        return None
    value = int(s)
    return value if value <= most else None


def figure(value: float | None, spec: str = ".2f", unit: str = "") -> str:
    """A figure for a table cell, or "-" when there is none (never "None", never 0 for missing)."""
    return "-" if value is None else format(value, spec) + unit
