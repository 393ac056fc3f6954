"""Phase 5, plan and baseline: the spec is validated and planned on the first host, and the serial run
measured there (or a cached one reused, when it may stand for this run's).

A plan is cached when no file on the hosts is involved; a baseline when the model, checkpoint content,
data, protocol, threads, host, interpreter, packages and code all match, and is reused only while the
host's state compares and it is younger than `baseline_max_age`. When neither is known, one process
plans and then measures (one torch import, not two). The record opens once the plan exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.commands import module_argv, worker_env
from pictl.cluster.hoststate import HostFacts
from pictl.cluster.jobs import HostJob
from pictl.cluster.stream import ProcessStream
from pictl.events import SERIAL_FP32, BaselineReady, Phase, Rejected, SplitChosen, command_outcome
from pictl.inventory import Host
from pictl.planning.specs import plan_key
from pictl.records.cache import JsonCache
from pictl.records.runs import RunRecord
from pictl.run.baselines import Baseline
from pictl.run.context import Handed, RunContext
from pictl.run.latency import serial_latencies, summary_ms
from pictl.run.logbook import Logbook
from pictl.run.placement import Placement
from pictl.run.staging import Staged
from pictl.run.telemetry import RunTelemetry
from pictl.summary import age_text
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.records import Record, to_wire
from remote.floor.run_records import Error, Plan, StageReady
from remote.floor.spec import RunSpec


@dataclass(frozen=True)
class Serial:
    plan: dict[str, Any]
    plan_reused: bool
    baseline: Baseline
    refused: str | None
    """Why a cached baseline was not reused (None: reused, or none was cached)."""
    record: RunRecord
    """The run's record, opened once the plan existed."""
    fp32: Baseline | None = None
    """Under other numerics (`--numerics`): the same serial run in fp32, what their gain and loss are
    measured against (a cached one when it may stand, as for any baseline)."""
    fields: dict[str, Any] | None = None
    """The baseline's `baseline_fields` (what a run handed this one as its reference must match)."""
    handed: Handed | None = None
    """The comparison's reference, when the baseline is that (`RunContext.handed`)."""

    @property
    def host(self) -> str | None:
        """Where the baseline was measured, when not on this run's first host (a handed reference)."""
        return self.handed.host if self.handed else None


async def plan_and_baseline(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec, staged: Staged,
                            book: Logbook) -> Serial:
    """The plan and the serial baseline; the record opens as the plan arrives, and the baseline's window
    (`book.windows["baseline"]`), marks and rejected lines are in the logbook even if this fails."""
    own = await _plan_and_own_baseline(ctx, job, placement, spec, staged, book)
    base = own.baseline
    ctx.sink(BaselineReady(own.host or placement.first.host.name, base.ips, base.reused,
                           max(0.0, time.time() - base.measured_at) if base.reused else 0.0))
    if spec.stages > 1 and ctx.options.policy != "balanced":  # `balanced` announced its split as it chose it
        ctx.sink(SplitChosen(tuple(own.plan.get("split_points") or spec.split_points), ctx.options.policy))
    return replace(own, fp32=await _fp32(ctx, job, placement, spec, staged, book))


async def _plan_and_own_baseline(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec,
                                 staged: Staged, book: Logbook) -> Serial:
    host = placement.first.host
    fields = baseline_fields(ctx, host, spec, staged.facts[host.name], placement.serial_threads)
    plans = ctx.caches.plans
    key = plan_key(host, spec, code=ctx.code)
    reused = plans.get(key) if key else None
    if reused:
        ctx.sink(Phase("plan", f"plan for {spec.stages} stage(s) reused (same model, split and code)"))
    handed, unfit = _handed(ctx, fields)
    cached, refused = (handed.baseline, None) if handed else _reusable(ctx, fields, staged.facts[host.name])
    refused = refused or unfit
    if reused or cached:
        plan = reused or await _plan(ctx, job, host, spec, key, book)
        record = _open_record(ctx, book, placement, spec, plan)
        if handed:
            ctx.sink(Phase("baseline", f"serial baseline: the comparison's reference, {handed.baseline.ips:.2f} img/s "
                                       f"on {handed.host} (run {handed.run_id}), measured "
                                       f"{age_text(time.time() - handed.baseline.measured_at)} ago"))
            return Serial(plan, reused is not None, handed.baseline, None, record, fields=fields, handed=handed)
        if cached:
            ctx.sink(Phase("baseline", f"serial baseline reused: {cached.ips:.2f} img/s on {host.name}, measured "
                                       f"{age_text(time.time() - cached.measured_at)} ago"))
            return Serial(plan, reused is not None, cached, refused, record, fields=fields)
        measured = await _measure(ctx, job, placement, spec, staged, book, _window(book), fields, refused)
        return Serial(plan, reused is not None, measured, refused, record, fields=fields)

    found: dict[str, Any] = {}

    def plan_arrived(plan: dict[str, Any]) -> None:
        if key:
            plans.put(key, plan)
        found.update(plan)
        _open_record(ctx, book, placement, spec, plan)

    # Neither is known: one process plans, then measures (the record opens when the plan arrives).
    baseline = await _measure(ctx, job, placement, spec, staged, book, _window(book), fields, refused,
                              on_plan=plan_arrived)
    assert book.record.record is not None  # the plan arrived: it opened the record
    return Serial(found, False, baseline, refused, book.record.record, fields=fields)


def _handed(ctx: RunContext, fields: dict[str, Any]) -> tuple[Handed | None, str | None]:
    """The comparison's reference if it stands for this run's serial run (every baseline field but the host
    equal), else None and, when one was handed, why it does not (this run then reuses or measures its own)."""
    ref = ctx.handed
    if ref is None:
        return None, None
    differ = [k for k in fields if k != "host" and fields[k] != ref.fields.get(k)]
    if not differ:
        return Handed(replace(ref.baseline, reused=True), ref.host, ref.fields, ref.run_id), None
    return None, f"the comparison's reference (run {ref.run_id}) differs in {', '.join(differ)}"


def _window(book: Logbook) -> list[float]:
    """The baseline's window on the controller's clock, in the logbook from its start (the waterfall and the
    host records read it, of a failed run too)."""
    window = book.windows["baseline"] = [time.time(), time.time()]
    return window


async def _fp32(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec, staged: Staged,
                book: Logbook) -> Baseline | None:
    """The fp32 serial run a run under other numerics is set beside: cached (any fp32 run's baseline of
    the same key) or measured now, after the run's own baseline (whose window the waterfall reads)."""
    if spec.numerics == "fp32":
        return None
    host = placement.first.host
    plain = replace(spec, numerics="fp32")
    fields = baseline_fields(ctx, host, plain, staged.facts[host.name], placement.serial_threads)
    cached, refused = _reusable(ctx, fields, staged.facts[host.name])
    if cached is not None:
        ctx.sink(Phase("baseline", f"fp32 serial reference reused: {cached.ips:.2f} img/s on {host.name}"))
        return cached
    # A window of its own: the run's baseline window stays the one the waterfall reads.
    return await _measure(ctx, job, placement, plain, staged, book, [time.time(), time.time()], fields, refused,
                          fp32_reference=True)


def baseline_fields(ctx: RunContext, host: Host, spec: RunSpec, facts: HostFacts, threads: int) -> dict[str, Any]:
    """Everything that changes the serial figure or its logits: the baseline cache's key."""
    ckpt = facts.checkpoint or {}
    return {"model": spec.model, "num_classes": spec.num_classes, "tokens": spec.tokens, "seed": spec.seed,
            # the content, wherever the file lives (a file that is not there keys with its path and error)
            "checkpoint": (ckpt.get("sha256") or [ckpt.get("path"), ckpt.get("error")]) if ckpt else None,
            "packages": facts.packages, "python": facts.python,
            "artifact": ctx.artifact.digest if ctx.artifact else None,
            "data": [spec.data.kind, spec.data.path, spec.data.split], "images": spec.images,
            "chunk": spec.chunk, "threads": threads, "warmup": spec.warmup, "repeats": spec.repeats,
            "numerics": spec.numerics,
            "check_images": spec.check_images, "host": [host.name, host.address, host.python_path()],
            "code": ctx.code}


def baseline_max_age(ctx: RunContext) -> float | None:
    return ctx.options.baseline_max_age or ctx.cluster.baseline_max_age


def _reusable(ctx: RunContext, fields: dict[str, Any], facts: HostFacts) -> tuple[Baseline | None, str | None]:
    """The run's cached baseline for `fields` if it may stand now (`BaselineCache.reusable`), else why not."""
    return ctx.caches.baselines.reusable(fields, facts.state, now=time.time(), max_age_s=baseline_max_age(ctx),
                                         fresh=not ctx.reuse_baseline)


async def _plan(ctx: RunContext, job: HostJob, host: Host, spec: RunSpec, key: str | None,
                book: Logbook) -> dict[str, Any]:
    ctx.sink(Phase("plan", f"validating the spec and planning {spec.stages} stage(s) on {host.name}"))
    book.timeline.launched("plan", {host: 1})
    result = await job.transport(host).run(module_argv(host, entries.PLAN.module, P.SPEC_FILE),
                                           cwd=host.run_dir(spec.run_id), env=worker_env(host, 1), timeout_s=300)
    found, message = command_outcome(result, Plan)
    if found is not None:
        plan = to_wire(found)
        if key:
            ctx.caches.plans.put(key, plan)
        return plan
    if result.returncode == P.EXIT_BAD_INPUT:
        raise E.ConfigError(message)
    raise E.RunFailed(f"host '{host.name}': planning failed: {message}")


def serial_timing(telemetry: RunTelemetry, images: int, threads: int) -> dict[str, Any] | None:
    """Where the serial run's time went, per image over its timed passes, and its latency per microbatch."""
    st = telemetry.stages.get(0)
    if st is None or not images:
        return None
    totals = st.totals
    return {"compute_per_image_s": round((totals.get("compute_s") or 0.0) / images, 9),
            "run_delay_per_image_s": round((totals.get("run_delay_s") or 0.0) / images, 9),
            "threads": threads, "latency": summary_ms(serial_latencies(telemetry.pass_times("serial")))}


def _open_record(ctx: RunContext, book: Logbook, placement: Placement, spec: RunSpec,
                 plan: dict[str, Any]) -> RunRecord:
    # The inventory as an absolute path: `pictl traces` may run from another directory.
    source = ctx.cluster.source
    record = book.record.open({"options": ctx.options.model_dump(), "profile": ctx.profile,
                               "cluster": str(Path(source).resolve()) if source else "", "spec": spec.to_json(),
                               "placement": [{"host": n.host.name, "ranks": list(n.ranks)} for n in placement.nodes],
                               "plan": plan})
    book.timeline.mark("planned")
    return record


async def _measure(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec, staged: Staged,
                   book: Logbook, window: list[float], fields: dict[str, Any], refused: str | None,
                   on_plan: Callable[[dict[str, Any]], None] | None = None, fp32_reference: bool = False) -> Baseline:
    """The serial run on the first host. With `on_plan`, the same process plans first and `on_plan` gets
    the plan; bad input found by planning is a ConfigError, as from `_plan`. `fp32_reference`: the run's
    spec in fp32 (its own logits file), for a run under other numerics. `window`: its [start, end] on the
    controller's clock, filled here."""
    host = placement.first.host
    what = "the fp32 serial reference" if fp32_reference else "the serial baseline"
    ctx.sink(Phase("baseline", (f"measuring {what} on {host.name}" if on_plan is None else
                                f"validating the spec, planning {spec.stages} stage(s) and measuring the serial "
                                f"baseline on {host.name}") + (f": {refused}" if refused else "")))
    telemetry = RunTelemetry()
    waiting = [on_plan] if on_plan is not None else []  # the plan's callback, until the plan has come

    def on_record(record: Record) -> bool:
        if record.rank != 0:  # the serial run is one process: rank 0
            on_rejected(Rejected(record.EVENT, f"rank {record.rank} in the serial run"))
            return False
        if isinstance(record, Plan) and waiting:
            waiting.pop()(to_wire(record))
        if isinstance(record, StageReady) and not fp32_reference:  # loaded: from here on it infers (its power)
            book.windows["baseline_compute"] = [time.time()]  # (it ends with the baseline's window)
        telemetry.apply(host.name, record)
        # An error before the plan is bad input: the run's one error line says it.
        return not (isinstance(record, Error) and waiting)

    def on_rejected(why: Rejected) -> None:  # named in the failure, and counted in the run's summary
        telemetry.reject(host.name, why)
        book.telemetry.reject(host.name, why)

    stream = ProcessStream(SERIAL_FP32 if fp32_reference else "serial", host.name, book.record, ctx.sink, on_record,
                           on_rejected=on_rejected)
    args = ["--spec", P.SPEC_FILE, *(["--plan"] if on_plan else []), *(["--fp32-reference"] if fp32_reference else [])]
    book.timeline.launched("baseline", {host: 1})
    if on_plan is not None:
        book.timeline.launched("plan", {host: 0})  # (the same process)
    rc = await job.run_module(host, entries.SERIAL.module, args, stream, threads=placement.serial_threads or 1,
                              pgid_file="pgid-serial")
    window[1] = time.time()
    st = telemetry.stages.get(0)
    if waiting:  # still waiting: the process ended before its plan
        message = st.error.message if st and st.error else (list(stream.tail) or ["no output"])[-1]
        if rc == P.EXIT_BAD_INPUT:
            raise E.ConfigError(message)
        raise E.RunFailed(f"host '{host.name}': planning failed: {message}")
    missing = telemetry.missing_figures(1, spec.repeats)
    ips = telemetry.mean_ips
    if rc != 0 or not st or not st.ended or missing or ips is None:
        rejected = telemetry.rejected_summary()
        message = (st.error.message if st and st.error else f"exit status {rc}" if rc != 0
                   else f"{missing}" + (f"; {rejected['count']} telemetry record(s) rejected: "
                                        f"{rejected['first'][0]['reason']}" if rejected else ""))
        raise E.RunFailed.on(host.name, 0, "fp32 serial reference" if fp32_reference else "serial baseline", message,
                         stream.tail)
    logits_file = P.LOGITS_FILE_SERIAL_FP32 if fp32_reference else P.LOGITS_FILE_SERIAL
    logits = await job.transport(host).get_bytes(f"{host.run_dir(spec.run_id)}/{logits_file}")
    baseline = Baseline(ips, telemetry.ips_spread or [], telemetry.top1, logits, time.time(),
                        st.peak_rss_mb, st.import_rss_mb, host_state=staged.facts[host.name].state,
                        timing=serial_timing(telemetry, spec.images * spec.repeats, placement.serial_threads or 1))
    ctx.caches.baselines.put(JsonCache.key(fields), baseline, fields)
    return baseline
