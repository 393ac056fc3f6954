"""One pipeline stage: its modules, live throughput, a compute / wait / send bar, microbatches, bytes/s."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline, Static

from pictl.text import printable
from pictl.tui.rows import StageView

BAR_WIDTH = 24


def breakdown_bar(compute: float, wait: float, send: float, width: int = BAR_WIDTH, *,
                  shares_below: bool = False) -> Text:
    """A bar split into compute (green), waiting (yellow) and sending (blue), with the shares beside it
    (or below it, in a narrow panel)."""
    total = compute + wait + send
    bar = Text()
    if total <= 0:
        return bar.append("." * width, style="dim")
    cells = [round(width * v / total) for v in (compute, wait, send)]
    cells[0] = width - cells[1] - cells[2]
    for n, style in zip(cells, ("green", "yellow", "blue"), strict=True):
        bar.append("█" * max(0, n), style=style)
    bar.append(("\n" if shares_below else " ") + f"compute {100 * compute / total:.0f}%  "
               f"wait {100 * wait / total:.0f}%  send {100 * send / total:.0f}%")
    return bar


def _span(modules: list[str]) -> str:
    return "-" if not modules else (modules[0] if len(modules) == 1 else f"{modules[0]} .. {modules[-1]}")


class StagePanel(Vertical):
    """Rendered from a StageView; `show` is cheap enough to call on every progress tick."""

    def __init__(self, rank: int) -> None:
        super().__init__(id=f"stage-{rank}", classes="stage")
        self.rank = rank

    def compose(self) -> ComposeResult:
        yield Label(f"stage {self.rank}", classes="stage-title")
        yield Sparkline([], summary_function=max, classes="stage-spark")
        yield Static("", classes="stage-figures")

    _shown: tuple = ()
    _title: str = ""
    _lines: int = -1

    def show_state(self, st: StageView) -> None:
        if not self.query(".stage-title"):  # mounting, or being removed for a tune's next candidate: a later
            return  # frame draws it (a render then raised NoMatches and ended the dashboard)
        key = (len(st.ips), st.ips[-1] if st.ips else None, st.modules and st.modules[-1], st.microbatches,
               st.phase, st.repeat, st.error, st.pass_ips)
        if key == self._shown:  # nothing new since the last frame
            return
        self._shown = key
        # A changed title or a changed number of lines is a new layout; the figures of every frame are not (a
        # layout pass per progress frame was most of the dashboard's cost while 4 hosts stream).
        where = f" on {st.host}  " if st.host else " (not placed yet)  "
        title = Text.assemble((st.label or f"stage {st.rank}", "bold"), where, (printable(_span(st.modules)), "dim"))
        if title.plain != self._title:
            self._title = title.plain
            self.query_one(".stage-title", Label).update(title)
        spark = self.query_one(Sparkline)
        spark.display = bool(st.ips)  # no points yet: nothing drawn (a flat [0] draws as a full bar)
        spark.data = list(st.ips)
        figures = Text()
        if st.error:
            figures.append(f"FAILED: {printable(st.error)}\n", style="bold red")
        narrow = 0 < self.size.width < 64
        figures.append_text(breakdown_bar(st.compute_s, st.wait_s, st.send_s, shares_below=narrow))
        rate = st.pass_ips
        label = {"warmup": "warm-up", "timed": "timed"}.get(st.phase, st.phase)
        passes = "" if st.phase == "waiting" else f"{label} pass {st.repeat + 1}: "
        figures.append(f"\n{passes}{st.microbatches}/{st.microbatches_total}{' mb' if narrow else ' microbatches'}  "
                       f"{'-' if rate is None else f'{rate:.2f}'} img/s  {st.bytes_per_s / 1e6:.2f} MB/s sent"
                       + (f" (x{st.wire_ratio:.2f})" if st.wire_ratio is not None and st.wire_ratio < 1 else ""))
        lines = figures.plain.count("\n")
        self.query_one(".stage-figures", Static).update(figures, layout=lines != self._lines)
        self._lines = lines
