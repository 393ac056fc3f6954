"""Telemetry: one JSON object per line on stdout, one record class per event (`remote.floor.records`)."""

from __future__ import annotations

import dataclasses
import socket
import sys
import time
from typing import TextIO

from remote.floor.records import Record, encode


class Emitter:
    """Writes telemetry records for one process (a rank or the serial runner)."""

    def __init__(self, role: str, rank: int = 0, stream: TextIO | None = None) -> None:
        self.role = role
        self.rank = rank
        self.host = socket.gethostname()
        self._stream = stream or sys.stdout

    def emit(self, record: Record) -> None:
        """Send `record`, stamped with the time and this process's role, rank and host."""
        stamped = dataclasses.replace(record, t=round(time.time(), 6), role=self.role, rank=self.rank,
                                      host=self.host)
        # One write per line, flushed: ranks sharing a pipe never interleave
        # mid-line as long as lines stay under PIPE_BUF, which is why large
        # payloads (logits) go to files instead.
        self._stream.write(encode(stamped) + "\n")
        self._stream.flush()
