"""The torch releases the host code runs on, and how each takes a schedule's batch (no torch here: the
controller reads this too).

pictl drives `torch.distributed.pipelining`, whose calling conventions change between releases: torch 2.14's
`schedule.step` and `eval` take a rank's microbatches pre-split (`arg_mbs=[(x0,), ...]`, `target_mbs=`), while
2.13's take only the whole batch and split it themselves (given `arg_mbs=`, 2.13 hands it to the model as a
keyword argument, splits that, and fails with "Expecting 96 arg_mbs but got 1"). The ranks pass their batch the
way their torch takes it (`remote.toolkit.schedule_inputs`); a host whose torch lies outside the range is
not ready: `pictl check` says so, and a run refuses it before its serial baseline (exit 6).

Both ends of the range have run pictl's pipeline, serial and training paths: the pin (`pyproject.toml`, every
test run) and 2.13.0 (by hand: docs/install.md). A newer torch is refused until a run on it has been checked.
"""

from __future__ import annotations

import re

OLDEST = (2, 13)
"""The oldest torch release (major, minor) the host code has run on."""
NEWEST = (2, 14)
"""The newest: the pinned one."""
PRE_SPLIT_SINCE = (2, 14)
"""From this release on, `step` and `eval` take pre-split microbatches (`arg_mbs`, `target_mbs`)."""
RANGE = f"torch >= {OLDEST[0]}.{OLDEST[1]}, < {NEWEST[0]}.{NEWEST[1] + 1}"
"""The range as people read it, in every message that names it."""


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version as torch and pip write it ('2.14.1+cu130', '2.15.0.dev20260101'); None when
    it does not start with two numbers."""
    found = re.match(r"(\d+)\.(\d+)(?!\d)", version.strip())
    return (int(found[1]), int(found[2])) if found else None


def supported(version: str) -> bool:
    found = release(version)
    return found is not None and OLDEST <= found <= NEWEST


def takes_pre_split(version: str) -> bool:
    """Whether this torch's `step`/`eval` take pre-split microbatches (else the whole batch only)."""
    found = release(version)
    return found is not None and found >= PRE_SPLIT_SINCE


def unsupported(version: str | None) -> str | None:
    """Why a venv with this torch (None: none) cannot run the host code, in words; None when it can."""
    if version is None:
        return f"has no torch ({RANGE})"
    if not supported(version):
        return f"has torch {version}, outside the range pictl runs on ({RANGE})"
    return None
