"""The one way tests run `pictl`: a real process of its own, its output captured as text (or its stdout on a
terminal of a given width: `run_pictl_on_terminal`).

`run_pictl` forks each command from one process per pytest worker that imported pictl once (`support.forked`):
a fresh `python -m pictl` spends about 0.6 s of this machine's CPU importing before it does anything, and the suite
runs a few hundred. A command whose environment differs from that process's in what an interpreter reads as it
starts (the locale, `PYTHON*`, a PATH of its own) runs as a fresh `python -m pictl`, as does any with
`fresh=True`."""

from __future__ import annotations

import atexit
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pictl.errors import EXIT_SUSPECT

if TYPE_CHECKING:
    from support.forked import PictlServer

ROOT = Path(__file__).resolve().parents[2]


def run_pictl(args: list[str], env: dict[str, str] | None, timeout: float = 300, *, cwd: Path = ROOT,
              input: str | None = None, errors: str | None = None,
              fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`pictl ARGS` in `cwd` with `env`; `input` is its stdin; `errors="surrogateescape"` keeps bytes that
    are not UTF-8 (to check what reached the terminal). `fresh`: in an interpreter of its own, never forked."""
    if env is not None and not fresh:
        try:
            return _forks().run(args, env, timeout, cwd=cwd, input=input, errors=errors)
        except ValueError:  # its environment is not the one the server's interpreter started with
            pass
    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=cwd, text=True, input=input,
                          capture_output=True, timeout=timeout, errors=errors)


_server: PictlServer | None = None


def _forks() -> PictlServer:
    """This worker's fork server, started again whenever the worker's own environment moved on from the one it
    started with (importing torch here sets TORCHINDUCTOR_CACHE_DIR, for one): the tests build their commands'
    environments from the worker's."""
    global _server
    from support.forked import PictlServer, same_interpreter

    now = {**os.environ, "COLUMNS": "200"}  # (as `pictl_env` sets it: the tests read whole lines)
    if _server is not None and not same_interpreter(_server.env, now):
        _server.close()
        _server = None
    if _server is None:
        _server = PictlServer(Path(tempfile.mkdtemp(prefix="pictl-forks-")), now, preload=("pictl.run.session",))
        atexit.register(_server.close)
    return _server


def finished(returncode: int | None, stderr: str) -> bool:
    """`pictl run` ran to its end: exit 0, or exit 10 with its result stated SUSPECT. This machine is shared
    with other work, and a serial run or a stage can be slowed (or sped up by smaller stages fitting the caches)
    in ways a test does not control; a test whose subject is not the verdict takes either, and the tests whose
    subject is the verdict (test_waterfall, test_verdict_views, test_flags) assert it directly. Any other code,
    or exit 10 without the SUSPECT line, is not."""
    if returncode == 0:
        return True
    last = (stderr.strip().splitlines() or [""])[-1]
    return returncode == EXIT_SUSPECT and last.startswith("pictl: error: SUSPECT: ")


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()


ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)")


def run_pictl_on_terminal(args: list[str], env: dict[str, str], timeout: float = 300, *, columns: int = 80,
                          cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`pictl ARGS` with stdout on a terminal `columns` wide (a pseudo-terminal) and stderr a pipe: what a person
    at such a terminal reads of the result. Its stdout comes back as text, escape codes taken out."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "pictl", *args], env={**env, "COLUMNS": str(columns)},
                                cwd=cwd, stdin=subprocess.DEVNULL, stdout=side, stderr=err, text=True)
        os.close(side)
        out = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not select.select([main], [], [], 1.0)[0]:
                    continue
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: the terminal's other side closed (the process is gone)
                    break
                if not chunk:
                    break
                out += chunk
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            os.close(main)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err.seek(0)
        text = ESCAPES.sub("", out.decode("utf-8", "replace")).replace("\r\n", "\n")
        return subprocess.CompletedProcess(proc.args, rc, text, err.read())
