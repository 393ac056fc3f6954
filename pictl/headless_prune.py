"""A pruning job's result on a terminal: the course's Part 3 comparison as far as pruning decides it, or its
checked summary as one JSON object (`--json`)."""

from __future__ import annotations

import json
import sys

from rich.table import Table

from pictl.console import result_console
from pictl.job_summaries import PruneSummary


def macs_text(macs: float | None) -> str:
    if macs is None:
        return "-"
    return f"{macs / 1e9:.2f} GMACs" if macs >= 1e8 else f"{macs / 1e6:.1f} MMACs"


def prune_table(s: PruneSummary) -> Table:
    """The course's Part 3 comparison, as far as pruning decides it (throughput: `pictl report`)."""
    table = Table(title=f"{s.status.upper()}  {s.base_model} pruned by {s.importance} at ratio {s.ratio}",
                  title_justify="left")
    for col in ("model", "parameters", "MACs", "top-1 before", "top-1 after pruning", "top-1 fine-tuned"):
        table.add_column(col, justify="left" if col == "model" else "right")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2%}"

    def count(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    share = f"{s.params / s.params_base:.0%}" if s.params and s.params_base else "-"
    table.add_row("base", count(s.params_base), macs_text(s.macs_base), pct(s.top1_before), "-", "-")
    table.add_row(f"pruned ({share} of the parameters)", count(s.params), macs_text(s.macs), "-",
                  pct(s.top1_pruned), f"{pct(s.top1)} (epoch {s.best_epoch})")
    return table


def print_prune_summary(summary: PruneSummary, *, as_json: bool) -> None:
    if summary.status == "ok":
        result_console(stderr=as_json).print(prune_table(summary))
    if as_json:
        sys.stdout.write(json.dumps(summary.written()) + "\n")
        sys.stdout.flush()
    elif summary.artifact:
        print(f"artifact: {summary.artifact}  (pictl run --model {summary.artifact})")
