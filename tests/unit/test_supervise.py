"""The host's supervisor stops its command's group as soon as the command ends, and SIGKILLs one that will not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _supervised(tmp_path: Path, grace_s: float, child: str) -> subprocess.Popen[str]:
    """`remote.host.supervise` over `python -c child`, its grace set for the test; the child prints once it is
    ready for signals."""
    runner = ("import sys, remote.host.supervise as s\n"
              f"s.GRACE_S = {grace_s}\n"
              "sys.exit(s.main(sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", runner, "--pgid-file", "pgid-t", "--", sys.executable, "-c", child],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None and not pipe.closed:
            pipe.close()


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def test_a_stop_lasts_as_long_as_the_command_takes_to_end_not_the_grace(tmp_path: Path) -> None:
    """The controller's pipe closes (and, apart, a SIGTERM comes): the command ends at once on SIGTERM, so must the
    supervisor. It used to wait out the whole grace however fast the command went: its handler polled a child
    whose waitpid lock the main thread held."""
    child = "import time\nprint('ready', flush=True)\ntime.sleep(600)"
    for how in ("stdin", "sigterm"):
        proc = _supervised(tmp_path, 60.0, child)
        try:
            _ready(proc)
            started = time.monotonic()
            if how == "stdin":
                assert proc.stdin is not None
                proc.stdin.close()
            else:
                proc.send_signal(signal.SIGTERM)
            rc = proc.wait(50)
            took = time.monotonic() - started
        finally:
            _end(proc)
        assert rc == 128 + signal.SIGTERM, how  # the command's own end, passed on
        assert took < 30, f"{how}: {took:.1f} s, the grace is 60 s"
        assert not (tmp_path / "pgid-t").exists()


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    child = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
             "time.sleep(600)")
    proc = _supervised(tmp_path, 0.5, child)
    try:
        _ready(proc)
        assert proc.stdin is not None
        proc.stdin.close()
        rc = proc.wait(60)
    finally:
        _end(proc)
    assert rc == 128 + signal.SIGKILL
