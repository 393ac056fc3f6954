"""`pictl ... --help` at 80 columns, the width people first meet it at: every command's every option name whole,
nothing cut short with an ellipsis, no line past the edge."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import typer

from pictl.cli import app

# One process drives the real entry point once per command (a process per command is 30 s of imports).
HELP_OF_EVERY_COMMAND = """
import sys
from pictl.cli import entrypoint
for path in sys.argv[1:]:
    print("=== " + path, flush=True)
    sys.argv = ["pictl", *path.split(), "--help"]
    try:
        entrypoint()
    except SystemExit:
        pass
"""


def _option_names() -> dict[str, list[str]]:
    """Every command by its path (`runs show`; "" for `pictl` itself) and the long names of its options."""
    found: dict[str, list[str]] = {}

    def walk(cmd: object, path: str) -> None:
        found[path] = [name for p in cmd.params if not getattr(p, "hidden", False)  # type: ignore[attr-defined]
                       for name in (*p.opts, *getattr(p, "secondary_opts", ())) if name.startswith("--")]
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


def _helps(paths: list[str], columns: int) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-c", HELP_OF_EVERY_COMMAND, *paths], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": str(columns), "TERMINAL_WIDTH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    sections = re.split(r"^=== (.*)\n", proc.stdout, flags=re.M)[1:]
    return dict(zip(sections[::2], sections[1::2], strict=True))


def test_every_option_name_is_whole_in_help_at_80_columns() -> None:
    names = _option_names()
    assert len(names) > 20 and "--checkpoint-activations" in names["train"]
    helps = _helps(list(names), 80)
    assert set(helps) == set(names)
    for path, options in names.items():
        text = helps[path]
        assert "Usage: pictl" in text, (path, text)
        for name in options:
            assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"pictl {path} --help: {name}\n{text}"
        assert "…" not in text, f"pictl {path} --help cuts something short:\n{text}"
        assert max(map(len, text.splitlines())) <= 80, f"pictl {path} --help is wider than 80 columns:\n{text}"


def test_twins_go_under_their_flags_only_when_the_help_needs_the_room() -> None:
    """At 80 columns a long flag's `--no-` twin is on the line under it; at 200 the panel keeps them side by side
    and a list of choices on one line."""
    narrow, wide = (_helps(["train"], width)["train"] for width in (80, 200))
    lines = narrow.splitlines()
    at = next(i for i, line in enumerate(lines) if "--checkpoint-activations" in line)
    assert "--keep-activations" in lines[at + 1] and "--keep-activations" not in lines[at]
    assert re.search(r"--checkpoint-activations\s+--keep-activations", wide)
    choices = "<synthetic|cifar10|cifar100|imagefolder>"
    assert choices in wide and choices not in narrow and "<synthetic|" in narrow
