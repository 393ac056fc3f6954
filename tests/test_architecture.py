"""The layering holds: the controller never imports torch, the core never imports Textual."""

from __future__ import annotations

import subprocess
import sys

CORE = ["pictl.cli", "pictl.session", "pictl.headless", "pictl.launch", "pictl.inventory", "pictl.profiles",
        "pictl.telemetry", "pictl.runs", "pictl.baseline", "pictl.transport.local", "remote.protocol",
        "remote.spec"]


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
