"""One run on a terminal: `pictl runs show` and the dashboard's history pane, as label/value lines.

The record's strings reach the terminal only through `pictl.text` (no control characters, no Rich markup,
at most `CELL_LIMIT` characters a value).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from pictl.figure_text import energy_text, figures
from pictl.records import waterfall_view as wv
from pictl.records.catalog import CELL_LIMIT, FoundRun, PendingRun
from pictl.summary import baseline_text, terminal_text
from pictl.summary_models import RankShare, RunSummary
from pictl.verdict import shown_status

__all__ = ["LEFT_OUT", "energy_line", "fmt", "metered", "run_details", "trace_rank_text"]

LEFT_OUT = ("efficiency", "agreement", "accuracy")
"""The run's declared figures `runs show` does not list by label: the efficiency is `runs compare`'s, a lossy
wire's agreement is on the outputs' line, and the accuracy is shown as recorded, after the outputs."""


def fmt(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return terminal_text(value, 60)


def trace_rank_text(rank: object, share: RankShare) -> str:
    """One rank's traced window as every view says it (`runs show`, the dashboard, `pictl traces`): its shares,
    and, once the run's counters are beside it, its microbatch in the stage table's units and whether the two
    agree (or why not)."""
    text = (f"rank {rank}: compute {fmt(share.compute_pct, '.0f')}%  send {fmt(share.send_pct, '.0f')}%  "
            f"recv-wait {fmt(share.recv_wait_pct, '.0f')}%  idle {fmt(share.idle_pct, '.0f')}%")
    if share.agrees is None or not share.counters_ms or len(share.counters_ms) != 3:
        return text
    counted = " / ".join(fmt(v, ".1f") for v in share.counters_ms)
    verdict = ("agree" if share.agrees else f"differ by {fmt(share.differs_points, '.0f')} points: "
               f"{share.why or '-'}")
    return (f"{text}; per microbatch compute / wait / send {fmt(share.compute_ms, '.1f')} / "
            f"{fmt(share.recv_wait_ms, '.1f')} / {fmt(share.send_ms, '.1f')} ms, the counters {counted}: {verdict}")


def _cell(value: Any, style: str = "") -> Text:
    """A record's value as a cell: never read as Rich markup, no control characters, not megabytes long."""
    return Text("-" if value is None else terminal_text(value, CELL_LIMIT), style=style)


def _one_line(text: Any) -> str:
    """A message that may span lines (an error's text) on one line."""
    return " / ".join(str(text).splitlines())


def _outputs(s: RunSummary) -> str:
    if not (s.wire and s.wire.lossy):
        return str(s.outputs_match)
    return f"{s.outputs_match} (lossy wire {s.wire.format}: top-1 agreement {fmt(s.agreement, '.2%')})"


def metered(s: RunSummary) -> bool:
    """Whether any host of the run had a power meter pictl reads (its samples read one during the run)."""
    return s.energy is not None and (bool(s.energy.source) or any(h.power_meter for h in s.hosts.values()))


def energy_line(s: RunSummary) -> str | None:
    """Energy per image, the power the meters read and, where a figure is n/a, why; None for a record from
    before pictl measured energy. The result line's detail, `runs show`, the history and the run panel."""
    e = s.energy
    if e is None:
        return None
    parts = []
    for what, watts, why in (("pipeline", e.pipeline_power_w, e.pipeline_unmeasured),
                             ("serial", e.serial_power_w, e.serial_unmeasured)):
        parts.append(f"{what} {fmt(watts)} W" if watts is not None else f"{what} n/a ({why})")
    meters = f" ({e.source}{f', {e.machines} machine(s)' if e.machines else ''})" if e.source else ""
    return f"{energy_text(e.pipeline_j_per_image, e.serial_j_per_image)}; power {', '.join(parts)}{meters}"


def run_details(found: FoundRun) -> Table:
    """One run as label/value lines (`read_run`'s record): `pictl runs show` and the dashboard's history."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if isinstance(found, PendingRun):
        for key, text in found.record().items():
            grid.add_row({"run_id": "run", "run_dir": "directory"}.get(key, key), _cell(text))
        return grid
    s = found
    after = {"serial_ips": baseline_text(s)}
    # The run's declared figures (`RunSummary`'s `Figure`s), each as it declares itself (but `LEFT_OUT`).
    declared = tuple((fig.label, fig.shown(value) + after.get(name, "")) for name, fig, value in figures(s)
                     if name not in LEFT_OUT)
    lines: tuple[tuple[str, object], ...] = (
        ("run", s.run_id), ("status", shown_status(s)), ("directory", s.run_dir), ("model", s.model),
        ("stages", s.stages), ("split", ", ".join(s.split_points) or "-"), ("policy", s.policy),
        *declared, ("outputs match", _outputs(s)), ("accuracy", s.accuracy))
    for label, value in lines:
        grid.add_row(label, _cell(value))
        if label == "status" and value == "suspect":
            grid.add_row(Text("suspect", style="bold red"), _cell(s.suspect_because, style="red"))
    wv.add_latency_rows(grid, s)
    if (energy := energy_line(s)) is not None:
        grid.add_row("energy", _cell(energy))
    if s.error:
        grid.add_row(Text("error", style="red"), _cell(_one_line(s.error.message), style="red"))
    for i, flag in enumerate(s.flags):
        grid.add_row(Text("flags" if i == 0 else "", style="bold yellow"),
                     _cell(f"{flag.code}: {_one_line(flag.message)}", style="yellow"))
    for st in s.per_stage:
        grid.add_row(_cell(f"stage {st.rank}"), _cell(f"{st.host}  compute {fmt(st.compute_s)}s  "
                                                      f"wait {fmt(st.wait_s)}s  send {fmt(st.send_s)}s"))
    for grab in s.traces:
        grid.add_row("traces", _cell(grab.timeline or grab.directory))
        for rank, share in sorted(grab.per_rank.items()):
            grid.add_row("", _cell(trace_rank_text(rank, share)))
    wv.add_gap_rows(grid, s)  # last: the longest part, and the history pane shows the rows above it first
    return grid
