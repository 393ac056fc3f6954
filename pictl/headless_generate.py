"""A generation job's result on a terminal: its pace against the serial run's, whether the token ids are the
serial run's, each stage's time per token and the decoding waterfall; or its summary as one JSON object."""

from __future__ import annotations

import json
import sys

from rich.table import Table

from pictl.console import result_console
from pictl.figure_text import figure_of, figures, points_text, speedup_text
from pictl.jobs.generation.figures import Agreement, GenerateSummary, Pace


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def stage_table(s: GenerateSummary) -> Table:
    table = Table(title="each stage, per token (ms)", title_justify="left")
    for col in ("stage", "host", "layers", "compute", "wait", "send", "bytes/token", "peak MB"):
        table.add_column(col, justify="left" if col in ("host", "layers") else "right")
    for st in s.stage_figures:
        table.add_row(str(st.stage), st.host, f"{st.first_layer}-{st.end_layer - 1}",
                      _f(st.compute_ms_per_token, ".2f"), _f(st.wait_ms_per_token, ".2f"),
                      _f(st.send_ms_per_token, ".2f"), _f(st.bytes_per_token, ",.0f"), _f(st.peak_rss_mb, ".0f"))
    return table


def pace_line(name: str, p: Pace) -> str:
    """`name: ` and the pace's declared figures, as their declarations write them."""
    return f"{name}: " + ", ".join(fig.field(value) for _name, fig, value in figures(p)) \
        + f" ({p.tokens} tokens in {p.seconds:.2f} s)"


def generate_lines(s: GenerateSummary) -> list[str]:
    head = f"{s.status.upper()}  {s.model}: {s.stages} stage(s), {s.sequences} sequence(s) x {s.new_tokens} new tokens"
    if s.speedup is not None:
        head += f", {speedup_text(s.speedup)} the serial run's tokens/s"
    lines = [head]
    if s.split:
        lines.append("stages begin at layer " + ", ".join(map(str, [0, *s.split])) + f" of {s.layers}")
    if s.pipeline:
        lines.append(pace_line("pipeline", s.pipeline))
    if s.serial:
        lines.append(pace_line(f"serial on {s.serial_host}", s.serial))
    if s.serial_fp32:
        lines.append(pace_line(f"serial on {s.serial_host}, fp32", s.serial_fp32)
                     + (f"; the pipeline {figure_of(GenerateSummary, 'speedup_fp32').shown(s.speedup_fp32)} it"
                        if s.speedup_fp32 is not None else ""))
    if s.agreement_fp32:
        a = s.agreement_fp32
        lines.append(f"{figure_of(Agreement, 'share').field(a.share)} ({a.agree} of {a.positions} positions; "
                     f"{a.sequences_identical} of {len(s.prompt_tokens)} sequences whole): a bounded loss, reported")
    if s.serial_note:
        lines.append(s.serial_note)
    if s.engines_differ:
        lines.append(f"int8 engines differ ({', '.join(s.engines_differ)}): the ids are compared, not held to the "
                     "serial run's")
    if s.tokens_identical is True:
        lines.append("token ids identical to the serial run's" + ("" if s.numerics == "fp32" else f" ({s.numerics})"))
    elif s.first_difference is not None:
        d = s.first_difference
        lines.append(f"token ids DIFFER from the serial run's: sequence {d.sequence}, position {d.position} "
                     f"(serial {d.serial}, pipeline {d.pipeline})")
    if s.waterfall:
        lines.append(f"why not {s.stages}x: " + ", ".join(f"{t.term} {points_text(t.points)}" for t in s.waterfall)
                     + f" = {speedup_text(s.speedup)}")
    if s.error:
        lines.append(f"error: {s.error.message}")
    if s.job_dir:
        lines.append(f"job directory: {s.job_dir}")
    return lines


def print_generate_summary(summary: GenerateSummary, *, as_json: bool) -> None:
    out = result_console(stderr=as_json, highlight=False, soft_wrap=True)
    if summary.stage_figures:
        out.print(stage_table(summary))
    for line in generate_lines(summary):
        out.print(line, markup=False)
    if as_json:
        sys.stdout.write(json.dumps(summary.written()) + "\n")
        sys.stdout.flush()
