"""Training jobs in `pictl report`: one table of every job (mode by mode) and, per job, where each rank's
step time went (a stacked chart and its table) beside the loss curve. And what every section of the report
writes with (`report.py` imports it from here): file names made from record ids (`safe_file_name`), files
written whole or not at all (`ReportFiles`), and a record's text made one printable line (`md_text`,
`chart_label`).

A job's summary is read as written (its shape is checked by the code that lays it out: a KeyError or a
TypeError names the job in `write_report`)."""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from pictl import errors as E
from pictl.job_summaries import TrainSummary
from pictl.summary import terminal_text
from remote.floor import protocol as P

CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)
COLORS = ("#8c8c8c", "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#dddddd")


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def safe_file_name(name: object, fallback: str = "run") -> str:
    """`name` (a run or job id from a record) as a file name that stays where it is put: only letters,
    digits, `.`, `_` and `-`, no leading dot or dash, at most 100 characters (`../../x` becomes `x`)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(name)).lstrip(".-")[:100]
    return cleaned or fallback


class ReportFiles:
    """The report's files in `out`: names from records made safe and distinct, and each file written whole
    or not at all (a temporary file in `out`, renamed into place; removed if anything fails)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._stems: dict[str, str] = {}

    def stem(self, owner: str) -> str:
        """The file-name stem for the run or job `owner`: the same owner always gets the same one, two
        owners whose ids clean to one name get distinct ones."""
        if owner not in self._stems:
            base = stem = safe_file_name(owner)
            n = 1
            while stem in self._stems.values():
                n += 1
                stem = f"{base}-{n}"
            self._stems[owner] = stem
        return self._stems[owner]

    def path(self, name: str) -> Path:
        """`out / name`, refused unless it is a plain name inside `out` (a last line of defence)."""
        path = self.out / name
        if not _SAFE_NAME.fullmatch(name) or path.parent.resolve() != self.out.resolve():
            raise E.ConfigError(f"--out: refusing to write {terminal_text(name, 120)!r} outside "
                                f"{terminal_text(self.out)}")
        return path

    def chart(self, owner: str, kind: str, draw: Callable[[IO[bytes]], None]) -> str:
        """Draw a chart of `owner` (a run or job id) into `<stem>-<kind>.png`; its file name."""
        name = f"{self.stem(owner)}-{safe_file_name(kind, fallback='chart')[:40]}.png"
        self.write(self.path(name), draw)
        return name

    def write(self, path: Path, fill: Callable[[IO[bytes]], None]) -> None:
        """`fill` writes the file's bytes; RecordWriteFailed (exit 9) if the disk refuses them."""
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=self.out)
        except OSError as exc:
            raise self._failed(path, exc) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise self._failed(path, exc) from None
            raise

    def _failed(self, path: Path, exc: OSError) -> E.RecordWriteFailed:
        return E.RecordWriteFailed(f"--out: cannot write {terminal_text(path)}: {exc.strerror or exc} "
                                   "(no partial file left)")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def md_text(value: object) -> str:
    """A record's string in the Markdown: one line, no control characters, no lone surrogates."""
    return terminal_text(" ".join(str(value).splitlines()))


def chart_label(value: object) -> str:
    """A record's string as a chart label: short, printable, and no `$` (matplotlib would read mathtext)."""
    return terminal_text(value, 40).replace("$", r"\$")


@contextmanager
def quiet_charts() -> Iterator[None]:
    """Matplotlib's warnings off: a glyph the font lacks (a host named in another script) is no error."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _num(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def jobs_table(jobs: list[TrainSummary]) -> list[str]:
    """Every job, grouped by mode: throughput, losses, top-1 and the loss check against single."""
    lines = ["## Training jobs", "", "| mode | ranks | chunks | microbatch | samples/s | loss first -> last | "
             "top-1 | loss check vs single | job |", "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(jobs, key=lambda s: (("single", "pipeline", "ddp").index(s.mode), s.stages or 0, s.chunks)):
        check = s.agreement
        verdict = "-" if not check else f"{'agree' if check.passed else 'DIFFER'} ({check.max_rel_diff})"
        mode = s.mode + (f" ({s.schedule})" if s.schedule else "") + (" bf16" if s.amp else "")
        lines.append(f"| {md_text(mode)} | {md_text(s.stages or '-')} | {md_text(s.chunks)} | "
                     f"{md_text(s.microbatch)} | {_num(s.samples_per_s)} | "
                     f"{_num(s.losses[0].loss, '.4f') if s.losses else '-'} -> "
                     f"{_num(s.losses[-1].loss, '.4f') if s.losses else '-'} | "
                     f"{_num(s.top1, '.1%')} | {md_text(verdict)} | {md_text(s.job_id)} |")
    return [*lines, ""]


def breakdown_chart(summary: TrainSummary, fh: IO[bytes]) -> None:
    """Per rank, a stacked bar of its step's time by category; beside it the loss curve (PNG into `fh`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = summary.breakdown[:64]
    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    try:
        labels = [f"{chart_label(r.rank)}\n{chart_label(r.host)}" for r in ranks]
        bottom = [0.0] * len(ranks)
        for category, color in zip(CATEGORIES, COLORS, strict=True):
            values = [float(r.per_step_ms.get(category) or 0.0) for r in ranks]
            ax.bar(range(len(ranks)), values, bottom=bottom, label=category, color=color)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        ax.set_xticks(range(len(ranks)), labels)
        ax.set_ylabel("ms per step")
        ax.set_title(f"{chart_label(summary.mode)}: where each rank's step went")
        loss_ax.plot([r.step for r in summary.losses], [r.loss for r in summary.losses], "-", label="loss")
        ref = [(r.step, r.reference) for r in summary.agreement.per_step] if summary.agreement else []
        if ref:
            loss_ax.plot([s for s, _ in ref], [v for _, v in ref], "x", label="single (reference)")
        loss_ax.set_xlabel("step")
        loss_ax.set_title("loss")
        loss_ax.grid(alpha=0.3)
        with quiet_charts():
            ax.legend(fontsize=7)
            loss_ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(fh, format="png", dpi=120)
    finally:
        plt.close(fig)


def job_section(s: TrainSummary, files: ReportFiles) -> list[str]:
    how = md_text(s.mode + (f" ({s.schedule})" if s.schedule else ""))
    lines = [f"## Training job {md_text(s.job_id)}", "",
             f"- {md_text(s.status)}: {how} on {md_text(s.stages or '-')} rank(s), model "
             f"{md_text(s.model)}, batch {md_text(s.batch_size)} as {md_text(s.chunks)} microbatch(es) "
             f"of {md_text(s.microbatch)}, {md_text(s.steps_done)} "
             f"step(s){', bf16 autocast' if s.amp else ''}",
             f"- samples/s (timed steps): {_num(s.samples_per_s)}; top-1 by epoch: "
             + (", ".join(f"{e.epoch}: {e.top1:.1%}" for e in s.evals) or "-")]
    if (c := s.agreement) is not None:
        lines.append(f"- loss check against {md_text(c.against)}: {'passed' if c.passed else 'FAILED'} over "
                     f"{c.steps} step(s), largest relative difference {c.max_rel_diff} "
                     f"(tolerance {c.tolerance})")
    if s.error:
        lines.append(f"- error: {md_text(s.error.message)}")
    lines += ["", "| rank | host | " + " | ".join(f"{c} ms" for c in CATEGORIES) + " |",
              "|---|---|" + "---|" * len(CATEGORIES)]
    for r in s.breakdown:
        lines.append(f"| {md_text(r.rank)} | {md_text(r.host)} | " + " | ".join(
            f"{_num(r.per_step_ms.get(c), '.1f')} ({_num(r.share.get(c), '.0%')})" for c in CATEGORIES) + " |")
    if s.breakdown:
        chart = files.chart(s.job_id, "breakdown", lambda fh: breakdown_chart(s, fh))
        lines += ["", f"![time per step and loss]({chart})"]
    return [*lines, ""]
