"""Where results are printed: a terminal gets Rich at its own width; a file or a pipe gets plain text that is
never wrapped and never padded (each line as long as it needs, trailing spaces dropped), so `make demo > log`
keeps every figure and path on one greppable line."""

from __future__ import annotations

import io
import sys
from typing import IO, Any

from rich.console import Console

PLAIN_WIDTH = 4096
"""Wide enough that no table or line of pictl's is wrapped in plain output."""


class PlainConsole(Console):
    """A Console for a file or a pipe: each print is drawn wide, then written with its lines' trailing spaces
    dropped."""

    def __init__(self, target: IO[str], **kwargs: Any) -> None:
        super().__init__(file=io.StringIO(), width=PLAIN_WIDTH, color_system=None, force_terminal=False,
                         soft_wrap=True, **kwargs)
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
