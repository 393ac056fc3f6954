"""config.json's `placement` (`pictl.records.run_config.RunConfigRecord.placement`): each node's host and the ranks
it ran, as `pictl.run.serial` writes it when the run starts, declared for its readers (`pictl traces` finds a live
run's ranks by it)."""

from __future__ import annotations

from pydantic import TypeAdapter

from pictl.summary_figures import Open

__all__ = ["PLACEMENT", "PlacedNode"]


class PlacedNode(Open):
    """One node of the run: its host's inventory name and the ranks it ran."""

    host: str
    ranks: list[int]


PLACEMENT = TypeAdapter(list[PlacedNode])
"""config.json's placement, checked whole (a ValidationError names what is wrong)."""
