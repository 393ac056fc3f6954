"""The one way tests run `pictl`: a real subprocess (`python -m pictl`), its output captured as text."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_pictl(args: list[str], env: dict[str, str] | None, timeout: float = 300, *, cwd: Path = ROOT,
              input: str | None = None, errors: str | None = None) -> subprocess.CompletedProcess[str]:
    """`pictl ARGS` in `cwd` with `env`; `input` is its stdin; `errors="surrogateescape"` keeps bytes that
    are not UTF-8 (to check what reached the terminal)."""
    return subprocess.run([sys.executable, "-m", "pictl", *args], env=env, cwd=cwd, text=True, input=input,
                          capture_output=True, timeout=timeout, errors=errors)


def dedent(text: str) -> str:
    return textwrap.dedent(text).lstrip()
