"""A generation job's figures and its summary (`summary.json` of a `pictl generate` job), built as the model.

From the first stage's token file (each sequence's ids and their arrival times) and each stage's `gen_end`:
tokens per second in aggregate and per sequence, time to the first token, the inter-token latency's p50 and p99,
each stage's compute, wait and send per token, bytes per token on each link, peak memory; the serial run's same
figures under the same protocol; whether the token ids are identical, or where they first differ; and the
decoding waterfall, which explains the gap between the stages' count and the measured speedup:

    N                                          every stage busy, cutting costs nothing
    + split overhead       N*Ts/sum(c) - N         the stages' compute per token, summed, above the serial run's
    + imbalance            Ts/max(c) - N*Ts/sum(c) the slowest stage's compute above the mean
    + communication        Ts/max(c+s) - Ts/max(c) posting the sends on that stage
    + fill, drain, waits   measured - Ts/max(c+s)  the rest: a pipeline with fewer sequences in flight than
                                                   stages is never full; the first and last tokens
    = measured speedup

(each term in signed points, a loss negative, as a run's waterfall shows them)

with Ts the serial run's seconds per token and c, s each stage's compute and send seconds per token.
"""

from __future__ import annotations

import statistics
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from pictl.figure_text import Figure, ms_text, percent_text, speedup_text, tokens_text
from pictl.job_summaries import Status
from pictl.summary_figures import Open, WaterfallTerm
from pictl.summary_models import RunError
from remote.floor.job_records import GenEnd, GenStart


class TokenFile(BaseModel):
    """What the first stage writes (`GenerateSpec.tokens_file`)."""

    tokens: list[list[int]]
    arrivals_s: list[list[float]]


class Pace(Open):
    """One run's pace: the serial run's or the pipeline's. Its figures are declared once, here: every view writes
    them through their `Figure`."""

    tokens: int
    seconds: float
    """From the timed pass's start to the last token's arrival."""
    tokens_per_s: Annotated[float | None, Figure(
        "tokens/s", "tok/s", tokens_text, "higher", "New tokens of every sequence over the timed pass's "
        "seconds.")] = None
    per_sequence_tokens_per_s: Annotated[float | None, Figure(
        "per sequence", "tok/s", tokens_text, "higher", "One sequence's pace after its first token, mean over "
        "sequences.")] = None
    ttft_ms: Annotated[float | None, Figure(
        "first token", "ms", ms_text, "lower", "Time to a sequence's first new token, mean over sequences (they "
        "queue behind each other's prompts).")] = None
    ttft_max_ms: float | None = None
    itl_p50_ms: Annotated[float | None, Figure(
        "between tokens p50", "ms", ms_text, "lower", "The median time between a sequence's consecutive "
        "tokens.")] = None
    itl_p99_ms: Annotated[float | None, Figure(
        "p99", "ms", ms_text, "lower", "The time between consecutive tokens 99% of gaps stay under.")] = None


class StageFigures(Open):
    stage: int
    host: str
    first_layer: int
    end_layer: int
    params: int
    load_s: float | None = None
    compute_ms_per_token: float
    wait_ms_per_token: float
    send_ms_per_token: float
    bytes_per_token: float
    peak_rss_mb: float | None = None


class Difference(Open):
    """The first position where the pipeline's ids differ from the serial run's."""

    sequence: int
    position: int
    serial: int | None
    pipeline: int | None


class Agreement(Open):
    """An int8 run's ids against the fp32 serial run's: a bounded loss, reported, never a failure. Greedy decoding
    follows its own tokens, so once a sequence parts from fp32's the rest of it rarely meets it again."""

    positions: int
    agree: int
    share: Annotated[float | None, Figure(
        "agreement with fp32", "%", percent_text, "higher", "The share of generated positions whose id is the fp32 "
        "serial run's.")] = None
    sequences_identical: int
    first_difference: Difference | None = None


class GenerateSummary(Open):
    """A generation job's summary.json."""

    kind: Literal["generate"] = "generate"
    schema_: int = Field(default=1, alias="schema")
    status: Status
    job_id: str
    job_dir: str | None = None
    model: str
    arch: str | None = None
    layers: int | None = None
    stages: int
    split: list[int] = []
    placement: list[dict[str, Any]] = []
    sequences: int
    new_tokens: int
    prompt_tokens: list[int] = []
    threads: int
    serial: Pace | None = None
    serial_host: str | None = None
    serial_note: str | None = None
    """Why there is no serial run (the model fits no single host)."""
    pipeline: Pace | None = None
    speedup: Annotated[float | None, Figure(
        "speedup", "x", speedup_text, "higher", "The pipeline's tokens/s over the serial run's, same prompts and "
        "protocol.")] = None
    numerics: str = "fp32"
    serial_fp32: Pace | None = None
    """Under int8-dynamic: the fp32 serial run (the serial run above is int8, as the pipeline)."""
    speedup_fp32: Annotated[float | None, Figure(
        "speedup over fp32", "x", speedup_text, "higher", "The pipeline's tokens/s over the fp32 serial run's "
        "(int8-dynamic).")] = None
    agreement_fp32: Agreement | None = None
    engines_differ: list[str] | None = None
    """Under int8: the quantised engines when the serial run's and the stages' are not one (`engine on host`);
    their ids are then compared and reported, not held to be identical."""
    tokens_identical: bool | None = None
    first_difference: Difference | None = None
    stage_figures: list[StageFigures] = []
    waterfall: list[WaterfallTerm] = []
    """The decoding waterfall's terms in signed points of speedup (a loss negative), as a run's waterfall holds them."""
    tokens_file: str | None = None
    error: RunError | None = None
    started_at: float
    duration_s: float | None = None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def pace(produced: TokenFile) -> Pace:
    arrivals = produced.arrivals_s
    tokens = sum(len(a) for a in arrivals)
    seconds = max((a[-1] for a in arrivals if a), default=0.0)
    gaps = [b - a for seq in arrivals for a, b in zip(seq, seq[1:], strict=False)]
    rates = [(len(seq) - 1) / (seq[-1] - seq[0]) for seq in arrivals if len(seq) > 1 and seq[-1] > seq[0]]
    firsts = [seq[0] for seq in arrivals if seq]
    return Pace(tokens=tokens, seconds=round(seconds, 6), tokens_per_s=round(tokens / seconds, 3) if seconds else None,
                per_sequence_tokens_per_s=round(statistics.fmean(rates), 3) if rates else None,
                ttft_ms=round(1e3 * statistics.fmean(firsts), 3) if firsts else None,
                ttft_max_ms=round(1e3 * max(firsts, default=0.0), 3),
                itl_p50_ms=_ms(_percentile(gaps, 0.5)), itl_p99_ms=_ms(_percentile(gaps, 0.99)))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 3)


def first_difference(serial: list[list[int]], pipeline: list[list[int]]) -> Difference | None:
    for seq, (a, b) in enumerate(zip(serial, pipeline, strict=False)):
        for pos in range(max(len(a), len(b))):
            x, y = (a[pos] if pos < len(a) else None), (b[pos] if pos < len(b) else None)
            if x != y:
                return Difference(sequence=seq, position=pos, serial=x, pipeline=y)
    if len(serial) != len(pipeline):
        return Difference(sequence=min(len(serial), len(pipeline)), position=0, serial=None, pipeline=None)
    return None


def stage_figures(starts: dict[int, GenStart], ends: dict[int, GenEnd], hosts: dict[int, str]) -> list[StageFigures]:
    out = []
    for stage in sorted(ends):
        end, start = ends[stage], starts.get(stage)
        per = max(end.tokens, 1)
        out.append(StageFigures(
            stage=stage, host=hosts.get(stage, "?"), first_layer=start.first_layer if start else 0,
            end_layer=start.end_layer if start else 0, params=start.params if start else 0,
            load_s=start.load_s if start else None,
            compute_ms_per_token=round(1e3 * end.compute_s / per, 4),
            wait_ms_per_token=round(1e3 * end.wait_s / per, 4),
            send_ms_per_token=round(1e3 * end.send_s / per, 4), bytes_per_token=round(end.bytes_sent / per, 1),
            peak_rss_mb=end.peak_rss_mb))
    return out


def waterfall(serial: Pace, pipeline: Pace, stages: list[StageFigures]) -> list[WaterfallTerm]:
    """The decoding waterfall (the module's docstring): terms in points of speedup, from N to the measured one."""
    if not stages or not serial.tokens or not pipeline.seconds:
        return []
    n = len(stages)
    ts = serial.seconds / serial.tokens
    compute = [s.compute_ms_per_token / 1e3 for s in stages]
    busy = [(s.compute_ms_per_token + s.send_ms_per_token) / 1e3 for s in stages]
    measured = ts / (pipeline.seconds / pipeline.tokens)
    balanced = n * ts / sum(compute) if sum(compute) else n
    slowest = ts / max(compute) if max(compute) else balanced
    with_sends = ts / max(busy) if max(busy) else slowest
    # Signed points, a loss negative, as in every view of a run's waterfall.
    return [WaterfallTerm(term="split overhead", points=round(balanced - n, 3)),
            WaterfallTerm(term="imbalance", points=round(slowest - balanced, 3)),
            WaterfallTerm(term="communication", points=round(with_sends - slowest, 3)),
            WaterfallTerm(term="fill, drain and waits", points=round(measured - with_sends, 3))]


def agreement(fp32: list[list[int]], other: list[list[int]]) -> Agreement:
    positions = sum(len(a) for a in fp32)
    agree = sum(x == y for a, b in zip(fp32, other, strict=False) for x, y in zip(a, b, strict=False))
    return Agreement(positions=positions, agree=agree, share=round(agree / positions, 4) if positions else None,
                     sequences_identical=sum(a == b for a, b in zip(fp32, other, strict=False)),
                     first_difference=first_difference(fp32, other))
