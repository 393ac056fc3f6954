"""`pictl board`: a class's bundles side by side, fastest first, with the lab's thresholds marked.

Each bundle in the folder (`*.bundle.tgz`) is checked as `pictl verify` checks it before a re-run (signature,
hashes, code, rules: `verify.check_bundle`; nothing runs). Where `pictl verify` re-ran it, its record beside the
bundle (`<bundle>.verify.json`, kept against the bundle's sha256: a record of another file is not read as this
one's) says whether the re-run reproduced it and why not. A row: the team, the configuration, exact or lossy, the
speedup with its 95 % interval (`verify.speedup_spread`), the accuracy, the mark the thresholds give, and
verified (yes, no, or checked: not re-run) with why. Rendered for a terminal (`table`: fits 80 columns), as
Markdown (`markdown`) and as HTML (`html`).
"""

from __future__ import annotations

import html as html_text
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from pictl import errors as E
from pictl.jobs.grading.bundle import BUNDLE_SUFFIX, read_bundle
from pictl.jobs.grading.manifest import BundleManifest
from pictl.jobs.grading.verify import VerifyRecord, check_bundle, record_path, speedup_spread
from pictl.planning.options import RunOptions
from pictl.records.compare_stats import Spread
from pictl.records.run_config import RunConfigRecord
from pictl.records.runs import CONFIG_FILE
from pictl.summary import terminal_text
from pictl.summary_models import RunSummary

__all__ = ["Row", "Thresholds", "board_rows", "html", "markdown", "row_cells", "table"]

RECORD_LIMIT = 1 << 20
KINDS = {E.EXIT_SIGNATURE: "signature", E.EXIT_TAMPERED: "tampered", E.EXIT_CODE_MISMATCH: "code",
         E.EXIT_RULES: "rules", E.EXIT_OUTPUT_MISMATCH: "outputs", E.EXIT_NOT_REPRODUCED: "speedup",
         E.EXIT_BAD_INPUT: "unreadable"}
"""What each failed check's exit code is called on the board."""


@dataclass(frozen=True)
class Thresholds:
    """The lab's marks: a speedup above `passing` passes, above `full` gets full marks; accuracy at least `accuracy`."""

    passing: float = 3.2
    full: float = 4.0
    accuracy: float = 0.88

    def mark(self, speedup: Spread | None) -> str:
        if speedup is None:
            return "-"
        return "full" if speedup.median > self.full else "pass" if speedup.median > self.passing else "below"

    def text(self) -> str:
        return (f"pass: speedup above {self.passing:g}x; full marks above {self.full:g}x; "
                f"accuracy floor {self.accuracy:.0%}; a SUSPECT result (pictl's own verdict) earns no mark")


@dataclass(frozen=True)
class Row:
    file: str
    team: str
    configuration: str
    lossy: bool | None
    speedup: Spread | None
    accuracy: float | None
    verified: str
    """yes (re-run and reproduced), no (a check or the re-run failed), checked (every check holds; not re-run)."""
    why: str
    suspect: bool = False
    """The run's own result was SUSPECT (`pictl.verdict`): its speedup earns no mark."""

    def speedup_text(self) -> str:
        return self.speedup.text(".2f") if self.speedup else "n/a"

    def accuracy_text(self, floor: float) -> str:
        if self.accuracy is None:
            return "n/a"
        return f"{self.accuracy:.1%}" + (" <" if self.accuracy < floor else "")

    def exactness(self) -> str:
        return "?" if self.lossy is None else "lossy" if self.lossy else "exact"


def _configuration(summary: RunSummary | None, options: RunOptions | None) -> str:
    if summary is None:
        return "?"
    shape = f"{summary.stages}x{summary.replicas}" if summary.replicas > 1 else f"{summary.stages} st"
    parts = [shape, summary.policy or "?", f"chunk {summary.chunk}"]
    wire, numerics = (options.wire, options.numerics) if options is not None else (None, None)
    if wire and wire != "fp32":
        parts.append(str(wire))
    if numerics and numerics != "fp32":
        parts.append(str(numerics))
    return " ".join(parts)


def _record(bundle_path: Path, digest: str) -> VerifyRecord | None:
    """`pictl verify`'s record of this very file (its sha256), or None."""
    path = record_path(bundle_path)
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > RECORD_LIMIT:
            return None
        found = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    record = VerifyRecord.view(found) if isinstance(found, dict) else None
    return record if record is not None and record.bundle_sha256 == digest else None


def _row(path: Path, *, allowed: Path | None, profile: str | None, min_accuracy: float | None) -> Row:
    summary: RunSummary | None = None
    options: RunOptions | None = None
    team = "?"
    try:
        bundle = read_bundle(path)
        team = _named_team(bundle.manifest)
        try:
            summary = RunSummary.model_validate(bundle.json("summary.json"))
            found = RunConfigRecord.view(bundle.json(CONFIG_FILE)).options
            # (as written: the bundle failed a check, so its options are read, not checked)
            options = RunOptions.model_construct(**found) if isinstance(found, dict) and found else None
        except (E.PictlError, ValueError):
            summary = None
        checked = check_bundle(bundle, allowed=allowed, profile=profile, min_accuracy=min_accuracy)
    except E.PictlError as exc:
        lossy = None if options is None else options.wire != "fp32" or options.numerics != "fp32"
        return Row(path.name, team, _configuration(summary, options), lossy,
                   speedup_spread(summary) if summary else None, summary.accuracy if summary else None, "no",
                   f"{KINDS.get(exc.exit_code, 'failed')}: {_short(str(exc), path)}")
    record = _record(path, bundle.digest)
    verified, why = "checked", "signature, hashes, code and rules hold; not re-run (pictl verify)"
    if record is not None:
        verified = "yes" if record.verified is True else "no"
        why = str(record.why or ("re-run reproduced it" if verified == "yes" else "re-run failed"))
        code = record.exit_code
        if verified == "no" and isinstance(code, int):
            why = f"{KINDS.get(code, 'failed')}: {why}"
    return Row(path.name, checked.team, _configuration(checked.summary, checked.options), checked.lossy,
               speedup_spread(checked.summary), checked.summary.accuracy, verified, _short(why, path),
               suspect=checked.summary.verdict == "suspect")


def _named_team(manifest: BundleManifest) -> str:
    """The team a bundle names (`--team`), else its signing key's comment (what a failed check still shows)."""
    named, signer = manifest.team, manifest.signer_record()
    if isinstance(named, str) and named:
        return named
    key = signer.key if signer is not None else None
    fields = key.split(maxsplit=2) if isinstance(key, str) else []
    return fields[2] if len(fields) == 3 else "?"


def _short(text: str, path: Path) -> str:
    """A check's message without the bundle's own path (the row names it): where this board found it, or where a
    verification recorded beside it ran (a bundle copied to the board after `pictl verify`)."""
    text = re.sub(rf"(?:\S*/)?{re.escape(path.name)}: ", "", text.replace(f"{path}: ", ""))
    return terminal_text(text, 200)


def board_rows(folder: Path, *, allowed: Path | None = None, profile: str | None = None,
               min_accuracy: float | None = None) -> list[Row]:
    """A row per bundle in `folder` (no link followed), the fastest first (no speedup: last)."""
    try:
        paths = sorted(p for p in folder.iterdir() if p.name.endswith(BUNDLE_SUFFIX) and p.is_file()
                       and not p.is_symlink())
    except OSError as exc:
        raise E.ConfigError(f"{folder}: not a folder of bundles ({exc.strerror or exc})") from None
    if not paths:
        raise E.ConfigError(f"{folder}: no bundles in it (files named *{BUNDLE_SUFFIX}: `pictl bundle RUN`)")
    rows = [_row(p, allowed=allowed, profile=profile, min_accuracy=min_accuracy) for p in paths]
    return sorted(rows, key=lambda r: (-(r.speedup.median if r.speedup else -1.0), r.team))


HEADINGS = ("team", "configuration", "wire", "speedup (95 % interval)", "accuracy", "mark", "verified")


def row_cells(row: Row, marks: Thresholds) -> tuple[str, ...]:
    return (row.team, row.configuration, row.exactness(), row.speedup_text(), row.accuracy_text(marks.accuracy),
            "suspect" if row.suspect else marks.mark(row.speedup),
            f"{row.verified}: {row.why}" if row.verified != "yes" else "yes")


def table(rows: list[Row], marks: Thresholds) -> Group:
    """The board for a terminal, fitting 80 columns: the why of each row not verified is a numbered note below
    the table (a cell that narrow would hold one word a line)."""
    board = Table(title="class board", box=box.SIMPLE_HEAD, pad_edge=False)
    for heading in HEADINGS:
        board.add_column(heading, overflow="fold", no_wrap=heading in ("wire", "mark"))
    notes: list[str] = []
    for row in rows:
        cells = list(row_cells(row, marks))
        if row.verified != "yes":
            notes.append(row.why)
            cells[-1] = f"{row.verified} [{len(notes)}]"
        board.add_row(*(terminal_text(c) for c in cells))
    said = [Text(f"[{i}] {terminal_text(why)}") for i, why in enumerate(notes, start=1)]
    return Group(board, *said, Text(marks.text() + "; < marks an accuracy below the floor", style="dim"))


def markdown(rows: list[Row], marks: Thresholds) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["# Class board", "", f"{marks.text()}; `<` marks an accuracy below the floor.", "",
             "| " + " | ".join(HEADINGS) + " |", "|" + "---|" * len(HEADINGS)]
    lines += ["| " + " | ".join(cell(c) for c in row_cells(row, marks)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def html(rows: list[Row], marks: Thresholds) -> str:
    def row_html(row: Row) -> str:
        cls = f"{marks.mark(row.speedup)} verified-{row.verified}"
        cells = "".join(f"<td>{html_text.escape(c)}</td>" for c in row_cells(row, marks))
        return f'<tr class="{cls}">{cells}</tr>'

    head = "".join(f"<th>{html_text.escape(h)}</th>" for h in HEADINGS)
    body = "\n".join(row_html(r) for r in rows)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Class board</title><style>"
            "table{border-collapse:collapse}td,th{border:1px solid #999;padding:2px 6px}"
            ".full{background:#cfc}.pass{background:#efe}.below{background:#fdd}.verified-no td:last-child{color:#a00}"
            f"</style></head><body><h1>Class board</h1><p>{html_text.escape(marks.text())}</p>"
            f"<table><tr>{head}</tr>\n{body}\n</table></body></html>\n")
