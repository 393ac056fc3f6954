"""Telemetry: one JSON object per line on stdout, schema in `remote.protocol`."""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any, TextIO

from remote import protocol as P


class Emitter:
    """Writes telemetry events for one process (a rank or the serial runner)."""

    def __init__(self, role: str, rank: int = 0, stream: TextIO | None = None) -> None:
        self.role = role
        self.rank = rank
        self.host = socket.gethostname()
        self._stream = stream or sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        record = {
            P.KEY_SCHEMA: P.SCHEMA_VERSION,
            P.KEY_EVENT: event,
            P.KEY_TIME: round(time.time(), 6),
            P.KEY_ROLE: self.role,
            P.KEY_RANK: self.rank,
            P.KEY_HOST: self.host,
            **fields,
        }
        # One write per line, flushed: ranks sharing a pipe never interleave
        # mid-line as long as lines stay under PIPE_BUF, which is why large
        # payloads (logits) go to files instead.
        self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._stream.flush()
