"""`pictl train` on the terminal: progress lines as the job runs, then its result, its loss check and
where each rank's step time went (one table), or the summary as JSON."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from pictl.console import result_console
from pictl.jobs.training.waterfall import train_waterfall_line
from remote import protocol as P
from remote.job_records import TrainEval, TrainStart, TrainStep
from remote.records import Record

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


def breakdown_table(summary: dict[str, Any]) -> Table:
    """Per rank: ms per step in each category, with its share of the step."""
    table = Table(title="time per step, by rank (ms, share)", title_justify="left")
    for col in ("rank", "host", *CATEGORIES):
        table.add_column(col, justify="left" if col == "host" else "right")
    for r in summary.get("breakdown") or []:
        ms, share = r["per_step_ms"], r["share"]
        table.add_row(str(r["rank"]), r["host"], *(f"{ms[c]:.1f} ({_pct(share[c])})" if ms[c] is not None else "-"
                                                   for c in CATEGORIES))
    return table


def agreement_line(summary: dict[str, Any]) -> str | None:
    check = summary.get("agreement")
    if not check:
        return None
    verdict = "agree" if check["passed"] else "DIFFER"
    reused = ", reference reused" if check.get("reference_reused") else ""
    fp32 = check.get("vs_fp32")
    apart = f"; bf16 against single in fp32: largest relative difference {fp32['max_rel_diff']}" if fp32 else ""
    return (f"losses {verdict} with {check['against']} over {check['steps']} step(s): largest relative difference "
            f"{check['max_rel_diff']} (tolerance {check['tolerance']}{reused}){apart}")


def train_lines(summary: dict[str, Any]) -> list[str]:
    s = summary
    losses = s.get("losses") or []
    lines = [f"{s['status'].upper()}  {s['mode']}" + (f" ({s['schedule']})" if s.get("schedule") else "")
             + f", {s.get('stages') or '-'} rank(s): {_num(s.get('samples_per_s'))} samples/s, "
             f"{s.get('steps_done')} step(s)" + (", bf16 autocast" if s.get("amp") else "")
             + (f", {s['workers']} loader worker(s)" if s.get("workers") else "")
             + (", activations recomputed" if s.get("checkpoint_activations") else "")
             + (f", wire {s['wire']}" if s.get("wire") not in (None, "fp32") else "")
             + (", no error feedback" if s.get("error_feedback") is False else "")]
    if losses:
        lines.append(f"loss {losses[0]['loss']:.4f} (step 1) -> {losses[-1]['loss']:.4f} (step {losses[-1]['step']})")
    if s.get("evals"):
        lines.append("top-1 by epoch: " + ", ".join(f"{e['epoch']}: {e['top1']:.2%}" for e in s["evals"]))
    check = agreement_line(s)
    if check:
        lines.append(check)
    if s.get("error"):
        lines.append(f"error: {s['error'].get('message')}")
    if s.get("run_with"):
        kept = {"kept": ", compressor pair kept", "removed": ", compressor pair left out"}.get(
            (s.get("checkpoint") or {}).get("compressor") or "", "")
        lines.append(f"trained model: {s['checkpoint']['path']}{kept}  ({s['run_with']})")
    if s.get("job_dir"):
        lines.append(f"job directory: {s['job_dir']}")
    return lines


def print_train_summary(summary: dict[str, Any], *, as_json: bool) -> None:
    out = result_console(stderr=as_json, highlight=False, soft_wrap=True)
    if summary.get("breakdown"):
        out.print(breakdown_table(summary))
    for line in train_lines(summary):
        out.print(line, markup=False)
    if summary.get("waterfall"):
        out.print("why not every rank busy: " + train_waterfall_line(summary["waterfall"]), markup=False)
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
        sys.stdout.flush()
