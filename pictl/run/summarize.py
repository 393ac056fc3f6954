"""Phase 8, the summary: the run's figures from what every earlier phase returned (a failed or interrupted
run gets one too, from the phases it reached), with its sanity flags."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from dataclasses import dataclass
from typing import Any

from pictl import errors as E
from pictl.cluster.artifacts import artifact_summary
from pictl.cluster.hoststate import host_records
from pictl.planning.options import RunOptions
from pictl.run.baselines import Baseline
from pictl.run.compare import Comparison, agreement
from pictl.run.context import RunContext
from pictl.run.energy import energy_summary
from pictl.run.flags import compute_flags
from pictl.run.latency import pipeline_latencies, summary_ms
from pictl.run.logbook import Logbook
from pictl.run.pipeline import PipelineDone
from pictl.run.placement import Placement
from pictl.run.recuts import recut_summary, settled
from pictl.run.serial import Serial, baseline_max_age
from pictl.run.split import SplitChoice, final_prediction, refine_summary
from pictl.run.staging import Staged
from pictl.run.trace_files import with_counters
from pictl.run.waterfall import waterfall
from pictl.summary import SUMMARY_SCHEMA, checked
from pictl.summary_figures import ClockReading, Open, Prediction, SerialTiming
from pictl.summary_models import RunSummary, SanityFlag, StageFigures
from pictl.verdict import verdict_of
from remote.floor.wire import parse_wire


@dataclass
class Reached:
    """The phase results a run got to (a failed or interrupted run stops anywhere), and what it wrote down
    on the way there."""

    book: Logbook
    placement: Placement | None = None
    choice: SplitChoice | None = None
    staged: Staged | None = None
    serial: Serial | None = None
    pipeline: PipelineDone | None = None
    comparison: Comparison | None = None


def summarize(ctx: RunContext, reached: Reached, status: str) -> dict[str, Any]:
    o, tel = ctx.options, reached.book.telemetry
    baseline = reached.serial.baseline if reached.serial else None
    plan = reached.serial.plan if reached.serial else {}
    serial_only = o.ranks == 1
    ips = baseline.ips if serial_only and baseline else tel.mean_ips
    prediction = final_prediction(reached.choice, tel.refined) if reached.choice else None
    if prediction is not None and reached.pipeline and reached.pipeline.corrections:
        prediction = {**prediction, "corrections_after": reached.pipeline.corrections}
    speedup = ips / baseline.ips if ips and baseline else None
    cmp = reached.comparison
    per_stage = _per_stage(ctx, reached, plan, prediction)
    hosts = _host_records(ctx, reached)
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA, "status": status, "run_id": ctx.run_id,
        "run_dir": _run_dir(reached.book),
        "model": o.model, "stages": o.stages, "replicas": o.replicas, "policy": o.policy,
        "artifact": artifact_summary(ctx.artifact) if ctx.artifact else None,
        "split_points": _split_points(reached, plan, o.split),
        "images": o.images, "chunk": o.chunk, "threads": o.threads, "warmup": o.warmup, "repeats": o.repeats,
        "data": o.data, "profile": ctx.profile, "code": ctx.code,
        "throughput_ips": round(ips, 4) if ips else None,
        "throughput_spread_ips": baseline.ips_spread if serial_only and baseline else tel.ips_spread,
        "serial_ips": round(baseline.ips, 4) if baseline else None,
        "serial_reused": baseline.reused if baseline else None,
        "serial_peak_rss_mb": baseline.peak_rss_mb if baseline else None,
        "serial_import_rss_mb": baseline.import_rss_mb if baseline else None,
        "speedup": round(speedup, 4) if speedup else None,
        "efficiency": round(speedup / o.ranks, 4) if speedup else None,
        "outputs_match": cmp.outputs_match if cmp else None,
        "max_abs_diff": cmp.max_abs_diff if cmp else None,
        "compared_images": o.images if o.lossy_wire else min(o.check_images, o.images),
        "wire": wire_summary(o, per_stage[:o.stages]) if o.stages > 1 else None,  # (replica 0's links)
        "numerics": numerics_summary(ctx, reached, ips),
        "recuts": recut_summary(tel),
        "pass_ips": list(tel.throughputs),
        "segments": reached.book.segments.summary(tel.throughputs, o.images, baseline.ips if baseline else None,
                                                  _planned_split(plan, o.split)),
        "host_lost": [loss.to_json() for loss in reached.book.losses],
        "replica_ips": replica_ips(o, tel.replica_seconds),
        "agreement": cmp.agreement if cmp else None, "mean_abs_diff": cmp.mean_abs_diff if cmp else None,
        "accuracy": baseline.top1 if serial_only and baseline else tel.top1,
        "serial_accuracy": baseline.top1 if baseline else None,
        "per_stage": per_stage,
        "plan_reused": reached.serial.plan_reused if reached.serial else False,
        "traces": [with_counters(grab, per_stage) for grab in reached.book.traces],
        "traced_passes": len(tel.traced_throughputs),
        "prediction": prediction,
        "refine": refine_summary(tel.refine_rounds, tel.refinement) if tel.refine_rounds else None,
        "startup": reached.book.timeline.summary(),
        "started_at": ctx.started, "duration_s": round(time.time() - ctx.started, 2),
        "serial_spread_ips": baseline.ips_spread if baseline else None,
        "baseline": _baseline_record(ctx, reached, baseline),
        "hosts": hosts,
        "telemetry_rejected": tel.rejected_summary(),
        "serial_timing": baseline.timing if baseline else None,
        "clocks": reached.pipeline.clocks if reached.pipeline else None,
        "latency": _latency(ctx, reached, baseline),
        "energy": energy_summary(
            hosts, reached.placement.first.host.name if reached.placement else None, None if serial_only else ips,
            baseline.ips if baseline else None, serial_reused=baseline.reused if baseline else None,
            pipeline_ran=not serial_only and reached.pipeline is not None),
    }
    # A re-cut run's waterfall is taken over the passes of its last split, a run that lost a host over its last
    # segment's; the passes before are their own term.
    losses = reached.book.losses
    summary |= {"waterfall": waterfall(summary, settled(
        tel, o.stages, o.repeats, baseline.ips if baseline else None,
        since=losses[-1].completed_passes if losses else 0, ranks_before=losses[0].stages_before if losses else None))
        if status == "ok" else None}
    flags = [SanityFlag.model_validate(f.to_json()) for f in compute_flags(RunSummary.model_validate(summary))]
    summary |= {"flags": [f.model_dump() for f in flags]}
    if status == "ok":  # a finished run's result: OK, or SUSPECT where a flag makes it untrue
        verdict, because = verdict_of(flags)
        summary |= {"verdict": verdict, "suspect_because": because}
    return checked(summary)


def numerics_summary(ctx: RunContext, reached: Reached, ips: float | None) -> dict[str, Any] | None:
    """Under other numerics: the run against the serial run in the same numerics (its `speedup`) and against
    the fp32 serial run, with the agreement of their top-1 classes over every image."""
    o = ctx.options
    if o.numerics == "fp32":
        return None
    serial = reached.serial
    same, fp32 = (serial.baseline, serial.fp32) if serial else (None, None)
    agreed = agreement(same.logits, fp32.logits, o.num_classes) if same and fp32 else None
    engines = sorted({st.engine for st in reached.book.telemetry.stages.values() if st.engine})
    return {"kind": o.numerics, "engines": engines,
            "serial_ips": round(same.ips, 4) if same else None,
            "fp32_serial_ips": round(fp32.ips, 4) if fp32 else None,
            "fp32_serial_reused": fp32.reused if fp32 else None,
            "fp32_serial_accuracy": fp32.top1 if fp32 else None,
            "numerics_gain": _ratio(same.ips if same else None, fp32.ips if fp32 else None),
            "speedup_vs_fp32": _ratio(ips, fp32.ips if fp32 else None),
            "agreement_vs_fp32": round(agreed[0], 6) if agreed else None,
            "mean_abs_diff_vs_fp32": agreed[1] if agreed else None,
            "compared_images": len(same.logits) // (4 * o.num_classes) if same and agreed else None}


def replica_ips(o: RunOptions, passes: list[list[float]]) -> list[float] | None:
    """Each replica's own img/s over the timed passes: its share of the images (microbatch j is replica
    j mod R's; the last one may be short) over its own pass times."""
    if o.replicas == 1 or not passes or any(len(p) != o.replicas for p in passes):
        return None
    share = [0] * o.replicas
    for j in range(-(-o.images // o.chunk)):
        share[j % o.replicas] += min(o.chunk, o.images - j * o.chunk)
    return [round(share[r] * len(passes) / sum(p[r] for p in passes), 4) for r in range(o.replicas)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


def wire_summary(o: RunOptions, per_stage: list[dict[str, Any]]) -> dict[str, Any]:
    """What travelled on each link (stage r to r+1): bytes on the wire and uncompressed, their ratio, what
    encoding (on r) and decoding (on r+1) cost, the average bandwidth (wire bytes over r's computation
    time, the related work's definition) and the peak (the fastest microbatch)."""
    links = []
    for sender, receiver in itertools.pairwise(map(StageFigures.view, per_stage)):
        cut = (receiver.modules or ["?"])[0]
        wire, raw, compute = sender.bytes_sent, sender.raw_bytes, sender.compute_s
        links.append({
            "link": f"{sender.rank}->{receiver.rank}", "cut": cut,
            "format": str(parse_wire(o.wire).at(cut)), "wire_bytes": wire, "raw_bytes": raw,
            "ratio": round(wire / raw, 4) if wire is not None and raw else None,
            "compress_s": sender.compress_s, "decompress_s": receiver.decompress_s,
            "avg_Bps": round(wire / compute, 1) if wire is not None and compute else None,
            "peak_Bps": sender.peak_Bps})
    return {"format": o.wire, "lossy": o.lossy_wire, "min_agreement": o.min_agreement if o.lossy_wire else None,
            "links": links}


STAGE_COUNTERS = ("compute_s", "wait_s", "send_s", "bytes_sent", "raw_bytes", "compress_s", "decompress_s",
                  "peak_Bps", "microbatches", "recv_post_s", "recv_wait_s", "first_wait_s", "send_post_s", "drain_s",
                  "run_delay_s", "pass_s")
"""A rank's `run_end` counters each stage's record holds, under the same names (`StageFigures`), in its order."""


class Plan(Open):
    """The plan the first host made (`remote.host.plan`): its split and each stage's modules and parameters."""

    split_points: list[str] | None = None
    stages: list[dict[str, Any]] = []


def _per_stage(ctx: RunContext, reached: Reached, plan: dict[str, Any],
               prediction: dict[str, Any] | None) -> list[dict[str, Any]]:
    o = ctx.options
    placement = reached.placement
    host_of = {r: n.host.name for n in placement.nodes for r in n.ranks} if placement else {}
    threads = placement.threads if placement else {}
    planned = {p.stage: p for p in map(StageFigures.view, Plan.view(plan).stages)}
    out = []
    for rank in range(o.ranks):
        # (with replicas, rank // stages is the replica)
        st, stage = reached.book.telemetry.stages.get(rank), rank % o.stages
        totals = st.totals if st else {}
        n = StageFigures.view(totals).microbatches

        def per_mb(key: str, n: int | None = n, totals: dict[str, Any] = totals) -> float | None:
            return round(totals[key] / n * 1000, 3) if n and totals.get(key) is not None else None

        predicted = Prediction.view(prediction).stage_ms[stage] if prediction else None
        measured = per_mb("compute_s")
        own = st is not None and bool(st.modules)
        at = planned.get(stage) or StageFigures.view({})
        out.append({
            # The stage's compute per microbatch, beside what `balanced` predicted for it; the time it
            # waited for input and was blocked on sends (back-pressure) are shown apart, never folded in.
            "measured_ms": measured, "predicted_ms": predicted,
            "prediction_error": round(measured / predicted - 1, 4) if measured and predicted else None,
            "wait_ms": per_mb("wait_s"), "send_ms": per_mb("send_s"),
            "host": host_of.get(rank), "rank": rank, "replica": rank // o.stages, "stage": stage,
            "threads": threads.get(host_of.get(rank, ""), o.threads),
            # A refined run moved its cuts: the ranks' own word on what they ran comes before the plan's.
            "modules": st.modules if st and own else at.modules,
            "params": st.params if st and own else at.params,
            # The rank's counters as it sent them; then where its pass time went beyond compute (the waterfall
            # reads these), and the CPU its threads waited for while runnable (other processes' load).
            **{k: totals.get(k) for k in STAGE_COUNTERS},
            "load_s": st.load_s if st else None, "import_rss_mb": st.import_rss_mb if st else None,
            "peak_rss_mb": st.peak_rss_mb if st else None,
        })
    return out


def _latency(ctx: RunContext, reached: Reached, baseline: Baseline | None) -> dict[str, Any] | None:
    """Latency per microbatch (each of its images'): the pipeline's, entering stage 0 to leaving the last, on
    our clock; the serial run's, its time per microbatch; `traced`: the --trace-steps pass, for checking
    against the merged trace."""
    serial = SerialTiming.view(baseline.timing).latency if baseline else None
    if ctx.options.ranks == 1:
        return {"pipeline": serial, "serial": serial, "clock_aligned": True} if serial else None
    tel, clocks = reached.book.telemetry, (reached.pipeline.clocks if reached.pipeline else {})
    placement = reached.placement
    if placement is None:
        return None
    first, last = placement.first.host.name, placement.node_of(ctx.options.stages - 1).host.name

    def offset(host: str) -> float:
        return (ClockReading.view(clocks.get(host)).offset_ns or 0) / 1e9

    aligned = all(ClockReading.view(clocks.get(h)).offset_ns is not None for h in (first, last))
    pipeline = summary_ms(pipeline_latencies(tel.pass_times("enter"), tel.pass_times("leave"), offset(first),
                                             offset(last)))
    traced = summary_ms(pipeline_latencies(tel.pass_times("enter", "trace"), tel.pass_times("leave", "trace"),
                                           offset(first), offset(last)))
    return {"pipeline": pipeline, "serial": serial, "clock_aligned": aligned, "traced": traced} \
        if pipeline or serial else None


def _baseline_record(ctx: RunContext, reached: Reached, baseline: Baseline | None) -> dict[str, Any] | None:
    if baseline is None or reached.placement is None or reached.serial is None:
        return None
    return {"host": reached.placement.first.host.name, "measured_at": baseline.measured_at,
            "reused": baseline.reused,
            "age_s": round(max(0.0, ctx.started - baseline.measured_at), 1) if baseline.reused else 0.0,
            "max_age_s": baseline_max_age(ctx), "state": baseline.host_state,
            "not_reused_because": None if baseline.reused else reached.serial.refused}


def _host_records(ctx: RunContext, reached: Reached) -> dict[str, Any]:
    if reached.placement is None or reached.staged is None:
        return {}
    ready = reached.book.timeline.marks.get("stages_ready")  # the pipeline's samples count from its last stage ready
    p = reached.placement
    return host_records([(n.host.name, list(n.ranks), p.threads.get(n.host.name)) for n in p.nodes],
                        reached.staged.facts, reached.book.samples, reached.book.windows,
                        pipeline_ready_at=time.time() - (time.monotonic() - ready) if ready else None)


def _split_points(reached: Reached, plan: dict[str, Any], given: list[str]) -> Any:
    """The split the run's (last) timed passes ran: refinement's or a re-cut's, else the last segment's after a
    host was lost, else the plan's."""
    tel, segments = reached.book.telemetry, reached.book.segments.items
    if tel.refined:
        return tel.refined.split_points
    if reached.book.losses and segments and segments[-1].split_points:
        return list(segments[-1].split_points)
    return _planned_split(plan, given)


def _planned_split(plan: dict[str, Any], given: list[str] | tuple[str, ...]) -> Any:
    """The plan's split as the host wrote it (a plan without one: the split the options gave)."""
    return Plan.view(plan).split_points if "split_points" in plan else list(given)


def _run_dir(book: Logbook) -> str | None:
    return str(book.record.path) if book.record.path else None


def bare_summary(ctx: RunContext, book: Logbook) -> dict[str, Any]:
    """What the record says when even the summary could not be made: how it ended, never `{}`."""
    exc = sys.exc_info()[1]
    status = "interrupted" if isinstance(exc, asyncio.CancelledError | E.Interrupted) else "failed"
    return checked({"schema": SUMMARY_SCHEMA, "status": status, "run_id": ctx.run_id, "stages": ctx.options.stages,
                    "replicas": ctx.options.replicas,
                    "run_dir": _run_dir(book), "per_stage": [],
                    "error": {"type": type(exc).__name__, "message": str(exc)} if exc else None,
                    "started_at": ctx.started, "duration_s": round(time.time() - ctx.started, 2)})
