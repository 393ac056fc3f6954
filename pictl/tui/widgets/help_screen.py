"""`?`: what pictl's keys do, what each panel shows, and how the log and history filters read."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("r", "start a run (a form: profile, stages, policy or split points, chunk, images)"),
    ("w", "start a sweep (every combination of stages, chunks and policies)"),
    ("u", "tune: find the fastest configuration (replicas x stages x threads x chunk; int8 with a loss allowed)"),
    ("p", "prune, fine-tune and evaluate a model"),
    ("n", "train across the hosts (single, pipeline or ddp): loss, samples/s and each rank's time per step"),
    ("s", "stop the run: every rank on every host, after asking"),
    ("t", "grab torch.profiler traces from every rank of the running pipeline, merged in one timeline"),
    ("/", "filter the log (see below); Escape clears it"),
    ("h", "past runs: sort, filter, mark and compare, export CSV"),
    ("g", "the class board: a folder of bundles as `pictl board` shows it, fastest first; a row's why below"),
    ("Enter", "on a host row: that host's details (and why it is down)"),
    ("ctrl+p", "the command palette: every action by name"),
    ("?", "this help; Escape or ? closes it"),
    ("q, ctrl+q", "quit (asks first while a run is in progress)"),
)
PANELS = (
    ("hosts", "one row per host: up or DOWN, what pictl does there, its ranks, CPU, memory, temperature, "
              "throttling (Pi firmware flags), how long since its last event"),
    ("stages", "one panel per pipeline stage: its modules, live img/s (sparkline), the share of time spent "
               "computing, waiting for the previous stage and sending, the pass it is in, bytes/s sent"),
    ("run", "what the run is doing (with seconds so far while it waits on something slow), speedup against "
            "the serial baseline and the ideal, whether the outputs match the serial run bit for bit, progress "
            "and ETA, both throughputs (and whether the baseline was reused), accuracy on labelled data, the "
            "split, balanced's refinement, where the record is, and any sanity flags"),
    ("logs", "every host's and rank's output, prefixed host/source"),
)
FILTERS = (
    ("log filter (/)", "host:NAME rank:N words; every part must match, words case-insensitively. "
                       "Example: host:pi2 rank:1 error"),
    ("history filter (/)", "stages=N policy=NAME status=ok since=2026-11-23 words; words match the run id or "
                           "split. Example: stages=4 policy=balanced"),
)


def _table(title: str, rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None, show_header=False,
                  padding=(0, 1), expand=True)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(ratio=1)
    for key, text in rows:
        table.add_row(key, text)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape,question_mark,q", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(Text("pictl: pipeline-parallel runs on a small cluster", style="bold"))
            yield Static(_table("keys", KEYS))
            yield Static(_table("panels", PANELS))
            yield Static(_table("filters", FILTERS))

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "help (Escape closes)"
