"""A run's speedup waterfall and latency as every reader shows them: `runs show`, `runs`, `compare` and the
CSV, `report`, sweeps and the dashboard.

They read the checked `RunSummary`'s `waterfall` and `latency` (`pictl.run.waterfall`, `pictl.run.latency`)
into small views with stricter bounds, or None when absent or not of the view's shape (a record edited by
hand: no terms, a figure out of bounds; never an exception); a string the record holds is made printable on
the way in. `waterfall_line` is the run layer's line of the same name, on the view: the records layer may not
import `pictl.run`, and a test keeps the two equal.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from rich.table import Table
from rich.text import Text

from pictl.figure_text import points_text, share_text, speedup_text
from pictl.summary_figures import WaterfallRecord
from pictl.summary_models import RunSummary
from pictl.text import shown

__all__ = ["COMPARE_KEYS", "ENERGY_KEYS", "GAP_EPSILON", "KNOWN_TERMS", "LATENCY_KEYS", "TERM_COLORS", "TERM_KEYS",
           "Latency", "Percentiles", "Term", "Waterfall", "add_gap_rows", "add_latency_rows", "compare_figures",
           "gap_bar", "latency_of", "line_parts", "line_text", "percentiles_text", "share_note", "share_text",
           "shown_share", "terms_table", "unreadable", "waterfall_line", "waterfall_view"]

LIMIT = 1e6
"""No speedup, point or millisecond figure a run records is this large; one that is reads as no figure."""

RecordText = Annotated[str, AfterValidator(lambda s: shown(" ".join(s.splitlines()), 200))]
"""A record's string: one line, printable, at most 200 characters."""
Figure = Annotated[float, Field(ge=-LIMIT, le=LIMIT)]

TERM_COLORS = {"fill_drain": "#4c72b0", "imbalance": "#dd8452", "split_overhead": "#8172b3",
               "interference": "#c44e52", "communication": "#ccb974", "runtime": "#64b5cd", "baseline": "#da8bc3",
               "residual": "#8c8c8c", "recut": "#937860", "host_lost": "#55a868"}
"""A colour per term (the dashboard's bar and its legend), in the waterfall's order; a term this pictl does not
know is white. Colours by value, not ANSI names: a terminal's theme maps `blue` and `magenta` as it likes."""


class _View(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)


class Term(_View):
    """One step of the waterfall: speedup points it changed (negative: lost) and its share of the gap."""

    term: RecordText
    points: Figure
    share: Figure | None = None

    @property
    def name(self) -> str:
        """How people read the term: `fill/drain`, `split overhead`."""
        return self.term.replace("_", "/", 1) if self.term == "fill_drain" else self.term.replace("_", " ")


class Waterfall(_View):
    """Why not N times: N, the measured speedup, and the terms between them (they add up to the gap)."""

    stages: int = Field(ge=1, le=100_000)
    speedup: Figure
    gap: Figure
    terms: list[Term] = Field(min_length=1, max_length=64)
    dominant: RecordText | None = None
    advice: RecordText | None = None
    bottleneck_rank: int | None = None
    microbatches: int | None = None


class Percentiles(_View):
    """A latency distribution per image, in ms."""

    p50_ms: Figure | None = None
    p95_ms: Figure | None = None
    p99_ms: Figure | None = None
    mean_ms: Figure | None = None
    microbatches: int | None = None


class Latency(_View):
    """Latency per image: the pipeline's (on the controller's clock), the serial run's, and the traced pass's."""

    pipeline: Percentiles | None = None
    serial: Percentiles | None = None
    clock_aligned: bool | None = None
    traced: Percentiles | None = None


def waterfall_view(raw: WaterfallRecord | dict[str, Any] | None) -> Waterfall | None:
    """A waterfall as readers show it, or None (absent, or recorded in a shape this pictl does not show: no
    terms, a figure out of bounds)."""
    if raw is None:
        return None
    try:
        return Waterfall.model_validate(raw.model_dump() if isinstance(raw, WaterfallRecord) else raw)
    except (ValidationError, ValueError, TypeError, RecursionError):
        return None


def waterfall_of(summary: RunSummary) -> Waterfall | None:
    """The summary's waterfall, or None (an older summary, a run that failed, one not of the view's shape)."""
    return waterfall_view(summary.waterfall)


def latency_of(summary: RunSummary) -> Latency | None:
    """The summary's latency, or None; a run with neither a pipeline's nor a serial figure has none."""
    if summary.latency is None:
        return None
    try:
        latency = Latency.model_validate(summary.latency.model_dump())
    except (ValidationError, ValueError, TypeError, RecursionError):
        return None
    return latency if latency.pipeline or latency.serial else None


def unreadable(summary: RunSummary, key: Literal["waterfall", "latency"]) -> bool:
    """`key` is in the summary, but not in a shape this pictl shows (a note, not figures)."""
    if getattr(summary, key) is None:
        return False
    return (waterfall_of if key == "waterfall" else latency_of)(summary) is None


def line_parts(w: Waterfall) -> list[tuple[str, str | None]]:
    """`waterfall_line` in pieces, each with the term it names (None for the text between): the dashboard
    colours each term's name as its segment of the bar."""
    parts: list[tuple[str, str | None]] = [(f"{speedup_text(w.speedup)} of {w.stages}", None)]
    shown_terms = [t for t in sorted(w.terms, key=lambda t: t.points) if abs(t.points) >= 0.005]
    if not shown_terms:
        parts.append((": no measurable gap", None))
    for i, t in enumerate(shown_terms):
        parts += [(": " if i == 0 else ", ", None), (t.name, t.term), (f" {points_text(t.points)}", None)]
    if w.dominant:
        parts.append((f" (dominant: {w.dominant.replace('_', ' ')}; to reduce it: {w.advice})", None))
    return parts


def waterfall_line(w: Waterfall) -> str:
    """One line: the measured speedup of N, then every term that cost (or gave) a hundredth or more, in signed
    points (a loss negative, as in every view), largest loss first, and the dominant term with what would reduce
    it."""
    return "".join(text for text, _ in line_parts(w))


GAP_EPSILON = 0.005
"""A gap (or a term) smaller than this reads as none: it rounds to 0.00 points."""


def shown_share(w: Waterfall, t: Term) -> str:
    """A term's share of the gap as the views show it: none where there is no gap to share (the speedup at or
    above N: `share_note` says so)."""
    return share_text(t.share) if w.gap > GAP_EPSILON else "-"


def share_note(w: Waterfall) -> str | None:
    """Why the shares of the gap do not read as parts of a whole, or None when they do (every term a loss).

    A share is the term's points over the gap N - speedup, so the shares always add up to 100 %; but a term
    that gave points back (a serial baseline slowed by other work makes the speedup read high) lets the
    losses add up to more than the gap: 150 % and -64 % are the same arithmetic, said here in words."""
    if w.gap <= GAP_EPSILON:
        return (f"the speedup {speedup_text(w.speedup)} is not below {w.stages}: there is no gap to share "
                "(a result above N is suspect)")
    gains = [t for t in w.terms if t.points >= GAP_EPSILON]
    if not gains:
        return None
    lost = -sum(t.points for t in w.terms if t.points < 0)
    return (f"shares are of the {w.gap:.2f}-point gap; the losses ({points_text(-lost)}) are {lost / w.gap:.0%} "
            "of it because " + ", ".join(f"{t.name} gave {points_text(t.points)} back" for t in gains)
            + " (a negative share)")


KNOWN_TERMS = tuple(TERM_COLORS)
"""The terms in the order the waterfall steps through them (`pictl.run.waterfall.ALL_TERMS`)."""
LATENCY_KEYS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "serial_latency_p50_ms",
                "serial_latency_p95_ms", "serial_latency_p99_ms")
TERM_KEYS = tuple(f"{term}_points" for term in KNOWN_TERMS)
ENERGY_KEYS = ("energy_j_per_image", "serial_energy_j_per_image")
COMPARE_KEYS = (*LATENCY_KEYS[2:], *TERM_KEYS, *ENERGY_KEYS)
"""`runs compare`'s lines beyond a row's columns (a row already holds the pipeline's p50 and p95)."""


def compare_figures(summary: RunSummary) -> dict[str, Any]:
    """A run's latency percentiles (pipeline and serial), each waterfall term's points and its joules per image;
    None where the run has no such figure (an older summary, a failed run, a host without a power meter)."""
    latency, w = latency_of(summary), waterfall_of(summary)
    out: dict[str, Any] = dict.fromkeys(LATENCY_KEYS + COMPARE_KEYS)
    for prefix, p in (("", latency.pipeline if latency else None), ("serial_", latency.serial if latency else None)):
        if p is not None:
            out |= {f"{prefix}latency_p50_ms": p.p50_ms, f"{prefix}latency_p95_ms": p.p95_ms,
                    f"{prefix}latency_p99_ms": p.p99_ms}
    for t in w.terms if w else []:
        if t.term in KNOWN_TERMS:
            out[f"{t.term}_points"] = t.points
    if (e := summary.energy) is not None:
        out |= {"energy_j_per_image": e.pipeline_j_per_image, "serial_energy_j_per_image": e.serial_j_per_image}
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def percentiles_text(p: Percentiles | None) -> str:
    """`p50 247.8  p95 345.1  p99 360.8 ms`, or `-`."""
    if p is None:
        return "-"
    return f"p50 {_ms(p.p50_ms)}  p95 {_ms(p.p95_ms)}  p99 {_ms(p.p99_ms)} ms"


def line_text(w: Waterfall) -> Text:
    """`waterfall_line` as Rich text, each term's name in its colour (the bar's legend); never markup."""
    return Text.assemble(*((text, f"bold {TERM_COLORS.get(term, 'white')}" if term else "")
                           for text, term in line_parts(w)))


def gap_bar(w: Waterfall, width: int = 24) -> Text:
    """One line of `width` cells: a segment per term as wide as its share of the gap (its points), in the term's
    colour; a loss is solid, a gain shaded. Empty when no term moved the speedup."""
    sizes = [abs(t.points) for t in w.terms]
    total = sum(sizes)
    if total <= 0 or width <= 0:
        return Text("")
    exact = [s / total * width for s in sizes]
    cells = [int(x) for x in exact]
    # Largest remainders first: the cells add up to `width` exactly.
    for i in sorted(range(len(exact)), key=lambda i: cells[i] - exact[i])[:width - sum(cells)]:
        cells[i] += 1
    return Text.assemble(*((("█" if t.points < 0 else "░") * n, TERM_COLORS.get(t.term, "white"))
                           for t, n in zip(w.terms, cells, strict=True) if n))


def terms_table(w: Waterfall) -> Table:
    """The terms as a small table: points (negative: lost) and share of the gap, largest loss first."""
    table = Table(box=None, padding=(0, 1), show_header=True, header_style="bold")
    for heading in ("term", "points", "share of gap"):
        table.add_column(heading, justify="left" if heading == "term" else "right", no_wrap=True)
    for t in sorted(w.terms, key=lambda t: t.points):
        table.add_row(Text(t.name), Text(points_text(t.points), style="red" if t.points < 0 else "green"),
                      Text(shown_share(w, t)))
    return table


def add_latency_rows(grid: Table, s: RunSummary) -> None:
    """`runs show` (and the dashboard's history): latency per image beside throughput, the pipeline's and the
    serial run's; nothing for an older summary."""
    latency = latency_of(s)
    if latency:  # one row: the history pane shows the rows below it (flags, stages, traces) in what is left
        grid.add_row("latency", Text(f"pipeline {percentiles_text(latency.pipeline)}"
                                     + ("" if latency.clock_aligned is not False else " (host clocks not aligned)")
                                     + f";  serial {percentiles_text(latency.serial)}"))
    if unreadable(s, "latency"):
        grid.add_row("latency", Text("not readable in this record (another shape)", style="yellow"))


def add_gap_rows(grid: Table, s: RunSummary) -> None:
    """`runs show` (and the dashboard's history): why the speedup is not N, the waterfall's line, its terms and
    what would reduce the dominant one; nothing for an older summary."""
    w = waterfall_of(s)
    if w:
        grid.add_row(f"why not {w.stages}", Text(waterfall_line(w)))
        grid.add_row("", terms_table(w))
        if note := share_note(w):
            grid.add_row("", Text(note))
        if w.advice:
            grid.add_row("", Text(f"to reduce {w.dominant or 'it'}: {w.advice}"))
    if unreadable(s, "waterfall"):
        grid.add_row("waterfall", Text("not readable in this record (another shape)", style="yellow"))
