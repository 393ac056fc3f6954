"""The real `pictl` in a real terminal (tmux): keys in, screen out through capture-pane."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli import ROOT
from support.clusters import skip_loudly, write_cluster

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


def _wait_for(text: str | re.Pattern[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _screen()
        if (text.search(screen) if isinstance(text, re.Pattern) else text in screen):
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
    # 80x24: the smallest terminal people use; speedup, outputs and every key must still be on screen.
    _tmux("-f", "/dev/null", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", "-e", "TERM=xterm-256color",
          "-e", f"PICTL_CACHE_DIR={tmp_path / 'cache'}", "-c", str(ROOT), f"{command}; echo PICTL-EXITED $?; sleep 30")
    try:
        yield tmp_path
    finally:
        subprocess.run(["tmux", "-L", SESSION, "kill-server"], capture_output=True)


@pytest.mark.slow
def test_real_terminal_at_80x24_runs_and_shows_the_result(tmux_pictl: Path) -> None:
    screen = _wait_for("q quit")
    assert "hosts" in screen and "h0" in screen and "h1" in screen and "? help" in screen
    _wait_for(" up ")  # the host monitor sampled both hosts
    _press("?")
    _wait_for("start a run", timeout=10)
    # tmux may capture a frame half painted: wait for the later line too (it must fit in 80x24).
    _wait_for("stop the run", timeout=5)
    _press("Escape")
    _press("t")
    _wait_for("no pipeline is running", timeout=10)
    _press("h")
    _wait_for("no runs in", timeout=10)
    _press("Escape")
    _press("/")
    _tmux("send-keys", "-t", SESSION, "-l", "host:h1")
    _wait_for("logs (filter: host:h1)", timeout=10)
    _press("Escape")
    # A real run from the form, by keys alone: stages 2, policy equal, 2 images (short), Enter starts it. The
    # form opens on its first text field (stages) and says its keys.
    _press("r")
    _wait_for("Start a run", timeout=10)
    _wait_for("Enter or ctrl+s: start", timeout=10)
    _tmux("send-keys", "-t", SESSION, "-l", "2")
    _press("Tab", "Enter")  # the policy list opens (wait for it: keys sent meanwhile would go to the form)
    _wait_for("equal", timeout=10)
    _press("Down", "Enter")
    _wait_for(re.compile(r"equal\s+▼"), timeout=10)  # chosen, the list closed
    _press("Tab", "Tab", "Tab")
    _tmux("send-keys", "-t", SESSION, "-l", "2")
    _press("Enter")
    screen = _wait_for(re.compile(r"outputs\s+match"), timeout=300)  # the label column's width varies
    found = re.search(r"speedup\s+(\d+\.\d+)x\s+of 2x ideal", screen)
    assert found and float(found.group(1)) > 0, screen
    assert "progress" in screen and "100%" in screen and "q quit" in screen
    runs = list((tmux_pictl / "runs").glob("*/summary.json"))
    assert len(runs) == 1
    summary = json.loads(runs[0].read_text())
    assert summary["status"] == "ok" and summary["policy"] == "equal" and summary["images"] == 2
    assert f"{summary['speedup']:.2f}x" == f"{found.group(1)}x"  # the screen shows the recorded figure
    _press("q")
    screen = _wait_for("PICTL-EXITED", timeout=15)
    assert "PICTL-EXITED 0" in screen


@pytest.mark.slow
def test_pictl_run_on_a_terminal_follows_the_run_in_the_console_and_exits_with_its_code(tmp_path: Path) -> None:
    """Without --headless, on a terminal, `pictl run` is the console following that run; closing it returns
    the run's exit code."""
    if shutil.which("tmux") is None:
        skip_loudly("NEEDS TMUX: apt install tmux (make system-deps does it as root)")
    hosts = write_cluster(tmp_path / "cluster", 2)
    run = [sys.executable, "-m", "pictl", "run", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"),
           "--stages", "2", "--split", "blocks.6", "--images", "6", "--warmup", "0", "--repeats", "1"]
    command = " ".join(shlex.quote(a) for a in run)
    _tmux("-f", "/dev/null", "new-session", "-d", "-s", SESSION, "-x", "100", "-y", "30", "-e", "TERM=xterm-256color",
          "-e", f"PICTL_CACHE_DIR={tmp_path / 'cache'}", "-c", str(ROOT), f"{command}; echo PICTL-EXITED $?; sleep 30")
    try:
        screen = _wait_for("q quit", timeout=60)
        assert "stages" in screen and "h0" in screen  # the console, not progress lines
        _wait_for(re.compile(r"speedup \d"), timeout=240)
        _wait_for("match", timeout=30)
        _press("q")
        _wait_for("PICTL-EXITED 0", timeout=30)
        (record,) = (tmp_path / "runs").iterdir()
        assert json.loads((record / "summary.json").read_text())["status"] == "ok"
    finally:
        subprocess.run(["tmux", "-L", SESSION, "kill-server"], capture_output=True)
