"""The real `pictl` in a real terminal (tmux): keys in, screen out through capture-pane."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, skip_loudly, write_cluster

SESSION = f"pictl-test-{os.getpid()}"


def _tmux(*args: str) -> str:
    # A server of our own (-L): another tmux on the machine cannot change our window size or keys.
    return subprocess.run(["tmux", "-L", SESSION, *args], check=True, capture_output=True, text=True).stdout


def _screen() -> str:
    return _tmux("capture-pane", "-p", "-t", SESSION)


def _press(*keys: str) -> None:
    for key in keys:
        _tmux("send-keys", "-t", SESSION, key)
        # A lone Escape followed at once by a key reads as Alt+key: give the terminal a beat.
        time.sleep(0.4 if key == "Escape" else 0.05)


def _wait_for(text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _screen()
        if text in screen:
            return screen
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared; the screen:\n{screen}")
        time.sleep(0.2)


@pytest.fixture
def tmux_pictl(tmp_path: Path):
    if shutil.which("tmux") is None:
        skip_loudly("NEEDS TMUX: apt install tmux (make system-deps does it as root)")
    hosts = write_cluster(tmp_path / "cluster", 2)
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "pictl", "--hosts", str(hosts),
                                                 "--runs-dir", str(tmp_path / "runs")])
    _tmux("-f", "/dev/null", "new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", "-e", "TERM=xterm-256color",
          "-c", str(ROOT), f"{command}; echo PICTL-EXITED $?; sleep 30")
    try:
        yield tmp_path
    finally:
        subprocess.run(["tmux", "-L", SESSION, "kill-server"], capture_output=True)


def test_real_terminal_keys_and_screen(tmux_pictl: Path) -> None:
    screen = _wait_for("? help")
    assert "hosts" in screen and "h0" in screen and "h1" in screen and "no run yet: press r" in screen
    _wait_for(" up ")  # the host monitor sampled both hosts
    _press("?")
    screen = _wait_for("filter logs", timeout=10)
    assert "traces" in screen and "history" in screen
    _press("?")
    _press("r")
    _wait_for("Start a run", timeout=10)
    _press("Escape")
    _press("t")
    _wait_for("no pipeline is running", timeout=10)
    _press("h")
    _wait_for("no runs in", timeout=10)
    _press("Escape")
    _press("/")
    _tmux("send-keys", "-t", SESSION, "-l", "host:h1")
    _wait_for("logs (filter: host:h1)", timeout=10)
    _press("Escape", "q")
    screen = _wait_for("PICTL-EXITED", timeout=15)
    assert "PICTL-EXITED 0" in screen
