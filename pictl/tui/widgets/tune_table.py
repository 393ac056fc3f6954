"""The tune's candidates on the run panel: measured first, best first, then the best predicted, as
`pictl tune`'s table ranks them (`pictl.jobs.tune_report`), in the columns a narrow panel can hold."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pictl.figure_text import interval_text
from pictl.jobs.tune_verdicts import ranked
from pictl.text import figure
from pictl.tui.tune_state import TuneView

SHOWN_PREDICTED = 4
"""Unmeasured candidates shown under the measured ones (the best predicted: what the tune may try next)."""


def tune_table(view: TuneView) -> RenderableType:
    measured = ranked([m for m in view.rows if m.status])
    waiting = ranked([m for m in view.rows if not m.status and not m.why and m.predicted_ips])[:SHOWN_PREDICTED]
    head = Text.assemble(("tune", "bold"), f"  {view.measured} measured",
                         *((f"  now: {view.trying}",) if view.trying and view.winner is None else ()),
                         "  ", (view.directory, "dim"))
    table = Table(box=None, padding=(0, 1), header_style="bold")
    # Short headings: the run panel may be half of an 80-column terminal (x: the speedup over fp32 serial, the
    # median over rounds once measured in rounds, with its interval; `-` for a row screened by one run only).
    for col in ("config", "pred", "img/s", "x", "interval", "agree", ""):
        table.add_column(col, justify="left" if col in ("config", "") else "right", no_wrap=True)
    for m in [*measured, *waiting]:
        if m is view.winner:
            verdict = Text("WINNER", style="bold green")
        elif m.reference:  # the serial run: what a winner has to beat
            verdict = Text("serial", style="dim")
        elif m.status:
            verdict = Text("kept" if m.kept else f"no: {m.why}"[:40], style="green" if m.kept else "yellow")
        else:
            verdict = Text("-", style="dim")
        interval = interval_text(*m.interval) if m.interval and len(m.interval) == 2 else "-"
        table.add_row(m.candidate.short(view.base), figure(m.predicted_ips, ".1f"), figure(m.throughput_ips, ".1f"),
                      figure(m.speedup_vs_fp32, unit="x"), interval, figure(m.agreement_vs_fp32, ".3f"), verdict)
    saved = [Text(f"saved as {view.preset}: r, profile tuned, runs it again", style="green")] if view.preset else []
    return Group(head, table, *saved)
