"""Past runs from the run directory with their key figures; Enter shows one's summary and traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from pictl.records.runs import SUMMARY_FILE
from pictl.summary import baseline_text


def load_runs(root: Path, limit: int = 200) -> list[dict[str, Any]]:
    """Summaries of finished runs, newest first; a run without a readable summary is listed as such."""
    runs = []
    for path in sorted(root.glob("*/"), reverse=True)[:limit]:
        try:
            summary = json.loads((path / SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            summary = {"status": "no summary (running or lost)", "run_id": path.name}
        summary.setdefault("run_dir", str(path))
        # Grabs made by another process (`pictl traces`) are on disk but not in the summary.
        known = {g.get("directory") for g in summary.get("traces") or []}
        for grab_file in sorted(path.glob("traces*/summary.json")):
            try:
                grab = json.loads(grab_file.read_text())
            except (OSError, ValueError):
                continue
            if grab.get("directory") not in known:
                summary["traces"] = [*(summary.get("traces") or []), grab]
        runs.append(summary)
    return runs


def _f(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def run_details(s: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in (("run", s.get("run_id")), ("status", s.get("status")), ("directory", s.get("run_dir")),
                         ("model", s.get("model")), ("stages", s.get("stages")),
                         ("split", ", ".join(s.get("split_points") or []) or "-"), ("policy", s.get("policy")),
                         ("pipeline", f"{_f(s.get('throughput_ips'))} img/s"),
                         ("serial", f"{_f(s.get('serial_ips'))} img/s{baseline_text(s)}"),
                         ("speedup", f"{_f(s.get('speedup'))}x"),
                         ("outputs match", s.get("outputs_match")), ("accuracy", s.get("accuracy"))):
        grid.add_row(label, str(value))
    if s.get("error"):
        grid.add_row(Text("error", style="red"), Text(str(s["error"].get("message")), style="red"))
    for i, flag in enumerate(s.get("flags") or []):
        grid.add_row(Text("flags" if i == 0 else "", style="bold yellow"),
                     Text(f"{flag['code']}: {flag['message']}", style="yellow"))
    for st in s.get("per_stage", []):
        grid.add_row(f"stage {st['rank']}", f"{st.get('host')}  compute {_f(st.get('compute_s'))}s  "
                     f"wait {_f(st.get('wait_s'))}s  send {_f(st.get('send_s'))}s")
    for grab in s.get("traces", []):
        grid.add_row("traces", str(grab.get("timeline") or grab.get("directory")))
        for rank, share in sorted(grab.get("per_rank", {}).items()):
            grid.add_row("", f"rank {rank}: compute {share['compute_pct']:.0f}%  send {share['send_pct']:.0f}%  "
                             f"recv-wait {share['recv_wait_pct']:.0f}%  idle {share['idle_pct']:.0f}%")
    return grid


class HistoryScreen(Screen):
    """A table of past runs; the highlighted one's summary and traces below it."""

    BINDINGS = [("escape,h", "app.pop_screen", "back")]

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = runs_root
        self.runs: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="history-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.runs = load_runs(self.runs_root)
        table = self.query_one(DataTable)
        table.border_title = f"runs in {self.runs_root}"
        for col in ("run", "status", "stages", "img/s", "serial", "speedup", "match", "traces", "flags"):
            table.add_column(col, key=col)
        for i, s in enumerate(self.runs):
            table.add_row(s.get("run_id", "?"), s.get("status", "?"), str(s.get("stages", "-")),
                          _f(s.get("throughput_ips")), _f(s.get("serial_ips")), _f(s.get("speedup")),
                          str(s.get("outputs_match", "-")), str(len(s.get("traces") or [])),
                          str(len(s.get("flags") or [])) if "flags" in s else "-", key=str(i))
        if not self.runs:
            self.query_one("#history-detail", Static).update(f"no runs in {self.runs_root} yet")
        table.focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.query_one("#history-detail", Static).update(run_details(self.runs[int(event.row_key.value)]))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.on_data_table_row_highlighted(event)  # type: ignore[arg-type]
