"""A run's config.json as its readers take it: what the run was asked to do, written once when it starts
(`pictl.run.serial`), before anything is measured.

Read as written (`RunConfigRecord.view`): a record another pictl wrote, or one inside a bundle not yet checked,
may hold anything, so each reader checks the value it uses (the options are checked anew by `RunOptions`).
"""

from __future__ import annotations

from typing import Any

from pictl.summary_figures import Open

__all__ = ["RunConfigRecord"]


class RunConfigRecord(Open):
    """config.json: the run's resolved options, its profile, inventory, spec, placement and plan."""

    options: Any = None
    """The run's options as `RunOptions.model_dump()` gave them (None: a record that holds none)."""
    profile: Any = None
    """The profile the options came from (None: none named)."""
    cluster: Any = None
    """The inventory's absolute path ("": an inventory built in memory)."""
    spec: Any = None
    """The hosts' run spec (`RunSpec.to_json`): one JSON string."""
    placement: Any = None
    """Each node's host and ranks: `[{"host", "ranks"}]`."""
    plan: Any = None
