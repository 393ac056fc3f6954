"""One row per host: up or down, what pictl does there, its ranks, CPU and its load (busy cores, run queue: other
work shows here), memory, temperature, power (where it has a meter), last event."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import DataTable

from pictl.tui.rows import HostRow
from pictl.tui.state import DashboardState

COLUMNS = ("host", "link", "activity", "ranks", "CPU%", "busy cores", "run queue", "mem MB", "temp C", "throttled",
           "power W", "last event")


def load_cells(row: HostRow) -> list[str]:
    """`1.6/2` busy cores of the CPUs, and the run queue with the share of time a thread waited for a CPU: what
    `pictl check` shows, so the dashboard's `interference` advice can be followed here."""
    busy = "-" if row.busy_cores is None else f"{row.busy_cores:.1f}/{row.cpus or '?'}"
    queue = "-" if row.runnable is None else (f"{row.runnable}" + ("" if row.cpu_wait is None
                                                                   else f", {row.cpu_wait:.0%} wait"))
    return [busy, queue]


def _link(row: HostRow) -> Text:
    if row.up is None:
        return Text("...", style="dim")
    return Text("up", style="green") if row.up else Text("DOWN", style="bold red")


def _age(row: HostRow, now: float) -> str:
    return "-" if row.last_event is None else f"{max(0.0, now - row.last_event):.0f}s ago"


class HostsTable(DataTable):
    """Rows keyed by host name; `show` updates cells in place (no flicker, no re-sorting)."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for col in COLUMNS:
            self.add_column(col, key=col)

    def show_state(self, state: DashboardState, now: float | None = None) -> None:
        now = now or time.time()
        for row in state.hosts.values():
            down = row.up is False
            activity = Text(f"{row.error or 'not answering'}" if down else row.activity,
                            style="bold red" if row.activity in ("failed", "lost") or down else "")
            cells = [row.name, _link(row), activity, ",".join(map(str, row.ranks)) or "-",
                     "-" if row.cpu_pct is None else f"{row.cpu_pct:.0f}", *load_cells(row),
                     "-" if row.mem_used_mb is None else f"{row.mem_used_mb}/{row.mem_total_mb}",
                     "-" if row.temp_c is None else f"{row.temp_c:.1f}", row.throttled or "-",
                     "n/a" if row.power_w is None else f"{row.power_w:.2f}", _age(row, now)]
            if row.name not in self.rows:
                self.add_row(*cells, key=row.name)
                continue
            for col, value in zip(COLUMNS, cells, strict=True):
                if self.get_cell(row.name, col) != value:  # an unchanged cell costs no repaint
                    self.update_cell(row.name, col, value, update_width=True)  # 610/3796 may become 2871/24100

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a host: what the inventory says about it and what the last sample found."""
        state: DashboardState = self.app.state  # type: ignore[attr-defined]
        name = str(event.row_key.value)
        row, host = state.hosts[name], state.cluster.host(name)
        where = f"{host.user + '@' if host.user else ''}{host.address}{f':{host.port}' if host.port else ''}"
        status = ("not sampled yet" if row.up is None else "up" if row.up else f"DOWN: {row.error or 'no answer'}")
        lines = [f"{host.transport} {where}, workdir {host.workdir}, venv {host.venv or '-'}, {host.slots} slot(s)",
                 status, f"ranks {','.join(map(str, row.ranks)) or '-'}, {row.activity}"]
        if row.up:
            temp = "-" if row.temp_c is None else f"{row.temp_c:.1f} C"
            busy, queue = load_cells(row)
            lines.append(f"CPU {row.cpu_pct:.0f}%, busy cores {busy}, run queue {queue}, memory "
                         f"{row.mem_used_mb}/{row.mem_total_mb} MB, temp {temp}, throttled {row.throttled or '-'}, "
                         + ("no power meter" if row.power_w is None else f"power {row.power_w:.2f} W"))
        self.app.notify("\n".join(lines), title=f"host {name}", timeout=12, markup=False,
                        severity="error" if row.up is False else "information")
