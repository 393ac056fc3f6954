"""What torch writes on stderr while a job's processes shut down, and that tells the user nothing: pictl keeps
it in the job's log and off the terminal (the field notes, section 9).

- torchrun's exit-barrier traceback: a peer agent left the barrier first, after every worker had finished;
- c10's C++ stack dumps (`Exception raised from recvBytes at ...`, `frame #0: c10::Error::Error(...)`,
  `<omitting python frames>`), and the store or gloo warning above one (`[c10d] recvValueWithTimeout failed
  on SocketImpl(...)`, `Connection closed by peer`), seen after 6 of 16 good runs when one host's agent
  closed the rendezvous store while another still waited on it;
- a process that gloo aborts on its way out (`terminate called after throwing an instance of 'gloo::...'`).

A warning's own line (the headline) still joins the tail a failure shows: when a run does fail, it says which
connection went; the frames and the traceback never do.
"""

from __future__ import annotations

import re
from enum import Enum

EXIT_BARRIER = "Error waiting on exit barrier"
"""What torchrun's agent logs when a peer agent left its exit barrier first."""
GLOG_PREFIX = re.compile(r"^(\[rank\d+\]:)?\[?[IWEF]\d{4} [\d:.]+ (\d+ )?\S+:\d+\] ?")
"""The prefix torch's C++ (c10) and torchrun's agent put on a log line: `[W1126 20:19:50.401 TCPStore.cpp:138] `,
`E1126 20:19:50.480000 9066 .../api.py:1008] `, with a `[rank1]:` before it under torchrun."""
TRACEBACK_END = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*")
"""The last line of a Python traceback: the exception's (qualified) name, unindented (once the prefix is off)."""
STACK_START = re.compile(r"^Exception raised from \S+ at .*\(most recent call first\):\s*$")
STACK_FRAME = re.compile(r"^(frame #\d+: |<omitting python frames>\s*$)")
TEARDOWN_WARNINGS = ("recvValue", "TCPStore", "Connection closed by peer", "Connection reset by peer",
                     "Broken pipe", "ProcessGroupGloo", "gloo/transport")
"""What a c10 warning line says when it is about a store or gloo connection going away."""
GLOO_ABORT = ("terminate called after throwing an instance of 'gloo::", "  what():  ")


class Verdict(Enum):
    SHOWN = "shown"
    """An ordinary line: shown, and in the tail."""
    HEADLINE = "headline"
    """Teardown noise that names what happened: kept in the tail, not shown."""
    QUIET = "quiet"
    """Teardown noise: in the log only."""


class TorchNoise:
    """Reads one process's stderr lines in order and says which are teardown noise (a traceback or a stack dump
    spans many lines: the reader keeps its place)."""

    def __init__(self) -> None:
        self._inside: str | None = None  # "barrier" (a traceback) or "stack" (C++ frames)
        self._aborted = False

    def judge(self, line: str) -> Verdict:
        prefix = GLOG_PREFIX.match(line)
        text = line[prefix.end():] if prefix else line
        if self._inside == "barrier":
            if TRACEBACK_END.match(text):
                self._inside = None
            return Verdict.QUIET
        if self._inside == "stack":
            if STACK_FRAME.match(text):
                return Verdict.QUIET
            self._inside = None
            if not text.strip():  # the blank line that closes a dump
                return Verdict.QUIET
        if EXIT_BARRIER in text:
            self._inside = "barrier"
            return Verdict.QUIET
        if STACK_START.match(text):
            self._inside = "stack"
            return Verdict.QUIET
        if text.startswith(GLOO_ABORT[0]) or (self._aborted and text.startswith(GLOO_ABORT[1])):
            self._aborted = text.startswith(GLOO_ABORT[0])
            return Verdict.HEADLINE
        self._aborted = False
        if prefix and any(marker in text for marker in TEARDOWN_WARNINGS):
            return Verdict.HEADLINE
        return Verdict.SHOWN
