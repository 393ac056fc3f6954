"""The layering holds: the controller never imports torch, the core never imports Textual."""

from __future__ import annotations

import subprocess
import sys

CORE = ["pictl.cli", "pictl.session", "pictl.headless", "pictl.launch", "pictl.inventory", "pictl.profiles",
        "pictl.telemetry", "pictl.runs", "pictl.baseline", "pictl.transport.local", "pictl.traces",
        "pictl.monitor", "pictl.tui.state", "remote.protocol", "remote.spec"]


def test_controller_imports_neither_torch_nor_textual() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in CORE) +
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm', 'textual'))\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"controller pulled in: {out.stdout.strip()}"


def test_event_names_are_shared_constants() -> None:
    from pictl import telemetry
    from remote import protocol

    assert telemetry.P is protocol  # one definition, imported by both sides
    assert len(set(protocol.EVENTS)) == len(protocol.EVENTS)


def test_the_dashboard_is_the_only_textual_code_and_holds_no_torch() -> None:
    """The app may import Textual; it must still not pull in torch (it runs on the controller)."""
    code = ("import sys\nimport pictl.tui.app\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'timm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "pictl"
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "import textual" in p.read_text() or "from textual" in p.read_text())
    assert users and all(u.startswith("tui/") for u in users), users
