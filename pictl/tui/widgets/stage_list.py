"""The stage panels of the current run, created when a run starts."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Static

from pictl.tui.state import DashboardState
from pictl.tui.widgets.stage_panel import StagePanel


class StageList(VerticalScroll):
    """Holds one StagePanel per stage; `reset` rebuilds them for a new run, `show` updates them."""

    def on_mount(self) -> None:
        self.mount(Static("no run yet: press r", classes="placeholder"))

    async def reset(self, state: DashboardState) -> None:
        await self.remove_children()
        await self.mount_all([StagePanel(rank) for rank in sorted(state.stages)])
        self.show_state(state)

    def show_state(self, state: DashboardState) -> None:
        for panel in self.query(StagePanel):
            if panel.rank in state.stages:
                panel.show_state(state.stages[panel.rank])
