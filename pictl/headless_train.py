"""`pictl train` on the terminal: progress lines as the job runs, then its result, its loss check and
where each rank's step time went (one table), or the summary as JSON."""

from __future__ import annotations

import json
import sys
import time

from rich.console import Console
from rich.table import Table

from pictl.console import result_console
from pictl.job_summaries import TrainSummary
from pictl.jobs.training.waterfall import train_waterfall_line
from remote.floor import protocol as P
from remote.floor.job_records import TrainEval, TrainStart, TrainStep
from remote.floor.records import Record

TRAIN_RECORDS = (TrainStart, TrainStep, TrainEval)
CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)


class TrainProgress:
    """Folds training events into one line every few seconds (and at every epoch's evaluation)."""

    def __init__(self, err: Console) -> None:
        self.err = err
        self.steps: int | None = None
        self._last = 0.0
        self._slowest: dict[int, float] = {}
        """Step -> seconds of its slowest rank so far (a pipeline's step ends with its first stage's backward,
        after the rank that reports the loss)."""

    def __call__(self, source: str, rec: Record) -> None:
        if source == "reference":
            return  # the reference's steps are not the job's; its losses show in the result
        match rec:
            case TrainStart(rank=0):
                self.steps = rec.steps
                self.err.print(f"pictl train: {rec.mode} on {rec.world_size} rank(s), {rec.steps} step(s) of "
                               f"{rec.batch_size} images as {rec.chunks} microbatch(es)"
                               + (", bf16 autocast" if rec.amp else ""), markup=False)
            case TrainStep():
                self._slowest[rec.step] = max(self._slowest.get(rec.step, 0.0), rec.seconds or 0.0)
                if rec.loss is None:
                    return
                loss = rec.loss
                now = time.monotonic()
                if now - self._last >= 5.0 or rec.step in (1, self.steps):
                    self._last = now
                    # The step before is whole (every rank has reported it); this one may not be yet.
                    seconds = self._slowest.get(rec.step - 1) or self._slowest[rec.step]
                    rate = rec.samples / seconds if seconds else 0.0
                    self.err.print(f"pictl train: step {rec.step}/{self.steps} (epoch {rec.epoch}) loss "
                                   f"{loss:.4f}, {rate:.1f} samples/s", markup=False)
            case TrainEval():
                self.err.print(f"pictl train: epoch {rec.epoch}: top-1 {rec.top1:.2%} ({rec.correct}/{rec.total})",
                               markup=False)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def breakdown_table(summary: TrainSummary) -> Table:
    """Per rank: ms per step in each category, with its share of the step."""
    table = Table(title="time per step, by rank (ms, share)", title_justify="left")
    for col in ("rank", "host", *CATEGORIES):
        table.add_column(col, justify="left" if col == "host" else "right")
    for r in summary.breakdown:
        ms, share = r.per_step_ms, r.share
        table.add_row(str(r.rank), r.host, *(f"{ms[c]:.1f} ({_pct(share.get(c))})" if ms.get(c) is not None else "-"
                                             for c in CATEGORIES))
    return table


def agreement_line(summary: TrainSummary) -> str | None:
    check = summary.agreement
    if not check:
        return None
    verdict = "agree" if check.passed else "DIFFER"
    reused = ", reference reused" if check.reference_reused else ""
    fp32 = check.vs_fp32
    apart = f"; bf16 against single in fp32: largest relative difference {fp32.max_rel_diff}" if fp32 else ""
    return (f"losses {verdict} with {check.against} over {check.steps} step(s): largest relative difference "
            f"{check.max_rel_diff} (tolerance {check.tolerance}{reused}){apart}")


def _loss(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def train_lines(s: TrainSummary) -> list[str]:
    lines = [f"{s.status.upper()}  {s.mode}" + (f" ({s.schedule})" if s.schedule else "")
             + f", {s.stages or '-'} rank(s): {_num(s.samples_per_s)} samples/s, "
             f"{s.steps_done} step(s)" + (", bf16 autocast" if s.amp else "")
             + (f", {s.workers} loader worker(s)" if s.workers else "")
             + (", activations recomputed" if s.checkpoint_activations else "")
             + (f", LoRA rank {s.lora}" if s.lora else "")
             + (f", wire {s.wire}" if s.wire not in (None, "fp32") else "")
             + (", no error feedback" if s.error_feedback is False else "")]
    if s.losses:
        first, last = s.losses[0], s.losses[-1]
        lines.append(f"loss {_loss(first.loss)} (step 1) -> {_loss(last.loss)} (step {last.step})")
    if s.evals:
        lines.append("top-1 by epoch: " + ", ".join(f"{e.epoch}: {e.top1:.2%}" for e in s.evals))
    check = agreement_line(s)
    if check:
        lines.append(check)
    if s.error:
        lines.append(f"error: {s.error.message}")
    if s.run_with:
        kept = {"kept": ", compressor pair kept", "removed": ", compressor pair left out"}.get(
            (s.checkpoint.compressor if s.checkpoint else None) or "", "")
        lines.append(f"trained model: {s.checkpoint.path if s.checkpoint else '-'}{kept}  ({s.run_with})")
    if s.job_dir:
        lines.append(f"job directory: {s.job_dir}")
    return lines


def print_train_summary(summary: TrainSummary, *, as_json: bool) -> None:
    out = result_console(stderr=as_json, highlight=False, soft_wrap=True)
    if summary.breakdown:
        out.print(breakdown_table(summary))
    for line in train_lines(summary):
        out.print(line, markup=False)
    if summary.waterfall:
        out.print("why not every rank busy: " + train_waterfall_line(summary.waterfall), markup=False)
    if as_json:
        sys.stdout.write(json.dumps(summary.written()) + "\n")
        sys.stdout.flush()
