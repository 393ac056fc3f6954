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
import uuid
from pathlib import Path

import pytest
from support.cli import ROOT
from support.clusters import skip_loudly, write_cluster


class Terminal:
    """One tmux server of our own (-L) with one session: another tmux on the machine cannot change our window
    size or keys. Each test gets a fresh name: a server still shutting down from the test before cannot refuse
    the next one's session."""

    def __init__(self) -> None:
        self.name = f"pictl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args[:3])} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def start(self, command: list[str], cache: Path, width: int, height: int) -> None:
        line = " ".join(shlex.quote(a) for a in command)
        self.tmux("-f", "/dev/null", "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height),
                  "-e", "TERM=xterm-256color", "-e", f"PICTL_CACHE_DIR={cache}", "-c", str(ROOT),
                  f"{line}; echo PICTL-EXITED $?; sleep 30")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.name, "kill-server"], capture_output=True)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", self.name, "-l", text)

    def press(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", self.name, key)
            # A lone Escape followed at once by a key reads as Alt+key: give the terminal a beat.
            time.sleep(0.4 if key == "Escape" else 0.05)

    def wait_for(self, text: str | re.Pattern[str], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if (text.search(screen) if isinstance(text, re.Pattern) else text in screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared; the screen:\n{screen}")
            time.sleep(0.2)


@pytest.fixture
def terminal():
    if shutil.which("tmux") is None:
        skip_loudly("NEEDS TMUX: apt install tmux (make system-deps does it as root)")
    term = Terminal()
    try:
        yield term
    finally:
        term.close()


@pytest.mark.slow
def test_real_terminal_at_80x24_runs_and_shows_the_result(terminal: Terminal, tmp_path: Path) -> None:
    hosts = write_cluster(tmp_path / "cluster", 2)
    # 80x24: the smallest terminal people use; speedup, outputs and every key must still be on screen.
    terminal.start([sys.executable, "-m", "pictl", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs")],
                   tmp_path / "cache", 80, 24)
    screen = terminal.wait_for("q quit")
    assert "hosts" in screen and "h0" in screen and "h1" in screen and "? help" in screen
    terminal.wait_for(" up ")  # the host monitor sampled both hosts
    terminal.press("?")
    terminal.wait_for("start a run", timeout=10)
    # tmux may capture a frame half painted: wait for the later line too (it must fit in 80x24).
    terminal.wait_for("stop the run", timeout=5)
    terminal.press("Escape")
    terminal.press("t")
    terminal.wait_for("no pipeline is running", timeout=10)
    terminal.press("h")
    terminal.wait_for("no runs in", timeout=10)
    terminal.press("Escape")
    terminal.press("/")
    terminal.type("host:h1")
    terminal.wait_for("logs (filter: host:h1)", timeout=10)
    terminal.press("Escape")
    # A real run from the form, by keys alone: stages 2, policy equal, 2 images (short), ctrl+s starts it. The
    # form opens on its first text field (stages) and says its keys, in its title and pinned at the bottom; Enter
    # in a field goes on to the next (the policy list), it never starts the run.
    terminal.press("r")
    terminal.wait_for("Start a run", timeout=10)
    terminal.wait_for("ctrl+s: start", timeout=10)
    terminal.wait_for("^s start", timeout=10)
    terminal.type("2")
    terminal.press("Enter")  # on to the policy list, then split, chunk and images
    terminal.press("Tab", "Tab", "Tab")
    terminal.type("2")
    # The 2 is in the images field before the run starts. The images are typed before the policy is chosen:
    # a Select gives focus back to itself once its list has closed, a moment later, and under load that came
    # after the Tabs that left it, so the 2 went to the list (CI once ran the default 48 images).
    terminal.wait_for(re.compile(r"images per pass.*\n.*\n.*▊\s+2\s"), timeout=10)
    terminal.press("BTab", "BTab", "BTab", "Enter")  # back to the policy: its list opens
    terminal.wait_for("equal", timeout=10)  # (wait for it: keys sent meanwhile would go to the form)
    terminal.press("Down", "Enter")
    terminal.wait_for(re.compile(r"equal\s+▼"), timeout=10)  # chosen, the list closed
    terminal.press("C-s")
    screen = terminal.wait_for(re.compile(r"outputs\s+match"), timeout=300)  # the label column's width varies
    found = re.search(r"speedup\s+(\d+\.\d+)x\s+of 2x ideal", screen)
    assert found and float(found.group(1)) > 0, screen
    assert "progress" in screen and "100%" in screen and "q quit" in screen
    runs = list((tmp_path / "runs").glob("*/summary.json"))
    assert len(runs) == 1
    summary = json.loads(runs[0].read_text())
    assert summary["status"] == "ok" and summary["policy"] == "equal" and summary["images"] == 2
    assert f"{summary['speedup']:.2f}x" == f"{found.group(1)}x"  # the screen shows the recorded figure
    terminal.press("q")
    screen = terminal.wait_for("PICTL-EXITED", timeout=15)
    assert "PICTL-EXITED 0" in screen


@pytest.mark.slow
def test_pictl_run_on_a_terminal_follows_the_run_in_the_console_and_exits_with_its_code(
        terminal: Terminal, tmp_path: Path) -> None:
    """Without --headless, on a terminal, `pictl run` is the console following that run; closing it returns
    the run's exit code."""
    hosts = write_cluster(tmp_path / "cluster", 2)
    terminal.start([sys.executable, "-m", "pictl", "run", "--hosts", str(hosts), "--runs-dir", str(tmp_path / "runs"),
                    "--stages", "2", "--split", "blocks.6", "--images", "6", "--warmup", "0", "--repeats", "1"],
                   tmp_path / "cache", 100, 30)
    screen = terminal.wait_for("q quit", timeout=60)
    assert "stages" in screen and "h0" in screen  # the console, not progress lines
    terminal.wait_for(re.compile(r"speedup \d"), timeout=240)
    terminal.wait_for("match", timeout=30)
    terminal.press("q")
    code = int(re.findall(r"PICTL-EXITED (\d+)", terminal.wait_for(re.compile(r"PICTL-EXITED \d+"), timeout=30))[-1])
    (record,) = (tmp_path / "runs").iterdir()
    summary = json.loads((record / "summary.json").read_text())
    assert summary["status"] == "ok"
    # The run's own code: 0, or 10 when its result is SUSPECT (other work slowed a measurement), said with why.
    assert code == 0 or (code == 10 and summary["verdict"] == "suspect" and summary["suspect_because"]), \
        (code, summary["flags"])
