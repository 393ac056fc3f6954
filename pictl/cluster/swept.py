"""What `remote.host.cleanup` says it did on a host (`pictl.cluster.commands.cleanup_host`'s answer), declared
for its readers: each value as the host wrote it."""

from __future__ import annotations

from typing import Any

from pictl.summary_figures import Open

__all__ = ["ANOTHER_CONTROLLERS", "Sweep", "SweptGroup"]

ANOTHER_CONTROLLERS = "another controller's run"
"""The reason the sweep gives for a group it kept because another controller drives it (`--owner`)."""


class SweptGroup(Open):
    """A run's process group the sweep stopped or kept (its run and pgid let through)."""

    owner: Any = None
    """The controller whose run it was (None: its record names none)."""
    reason: Any = None
    """Why it was kept: "not ours", "live run", `ANOTHER_CONTROLLERS`, an unreadable record..."""


class Sweep(Open):
    """The sweep of one host's runs directory: the groups it stopped and those it kept (its stale count and the
    records it removed let through)."""

    stopped: list[SweptGroup]
    kept: list[SweptGroup]
