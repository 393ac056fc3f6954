"""Sanity flags: what makes a run's numbers suspect, each with one line that says why.

`compute_flags(summary)` is a pure function of a run's checked summary, which carries every
host's state at the start of the run (`hosts.<name>.state`) and its samples while
the serial baseline and the pipeline ran (`during_baseline`, `during_pipeline`),
so each flag can be tested without a cluster and without torch. Codes are stable
(scripts and `--strict` use them); messages are for people.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from pictl.cluster.hoststate import (
    HOT_C,
    LOAD_TOLERANCE_CORES,
    capacity,
    machine_cpus,
    machines,
    other_work_cores,
    state_change,
    throttling,
)
from pictl.figure_text import speedup_text
from pictl.run.flags_measured import SERIAL_WAIT_LIMIT, Flag, own_wait, rejected, residual
from pictl.summary import age_text
from pictl.summary_models import HostState, RunSummary, SampleWindow

SPREAD_LIMIT = 0.10
"""Largest (max - min) / mean of the timed passes' throughput that is not flagged."""
FILL_DRAIN_MIN = 0.95
"""Smallest GPipe fill/drain bound M / (M + S - 1) that is not flagged."""
ABOVE_BOUND_TOLERANCE = 0.01
"""How far above the fill/drain bound a speedup may read before it is impossible: the timing's own noise."""

CODES = ("speedup_above_stages", "speedup_above_fill_drain", "speedup_below_1", "throughput_spread",
         "host_overloaded", "host_throttled", "host_hot", "baseline_stale", "stages_share_cores", "fill_drain_bound",
         "wire_no_saving", "telemetry_rejected", "waterfall_residual", "host_lost")
HALF_PRECISION = ("fp16", "bf16")
"""Formats that send half of fp32's bytes by construction: a lossy format that sends more saves less."""


def compute_flags(summary: RunSummary) -> list[Flag]:
    """Every flag the summary's figures raise, in the order of CODES."""
    found = [*_speedup(summary), *_spread(summary), *_host_health(summary), *_stale_baseline(summary),
             *_sharing(summary), *_fill_drain(summary), *_wire(summary), *rejected(summary),
             *residual(summary), *_host_lost(summary)]
    return sorted(found, key=lambda f: CODES.index(f.code))


def _state(s: RunSummary, host: str | None) -> dict[str, Any]:
    """A host's state at the start of the run, as its probe read it (what `hoststate`'s rules read)."""
    return _host_state(s, host).model_dump(exclude_none=True)


def _host_state(s: RunSummary, host: str | None) -> HostState:
    """A host's state at the start of the run, typed (every field None where the run has no record of it)."""
    record = s.hosts.get(host or "")
    return record.state if record and record.state else HostState()


# -- speedup -------------------------------------------------------------------------------------

def _speedup(s: RunSummary) -> list[Flag]:
    """A speedup no exact pipeline reaches (above its ranks, or above what filling and draining leave of them:
    the result is SUSPECT, with the evidence of why), or one below 1."""
    # (a run that lost a host: its passes before the loss ran on the ranks it began with)
    speedup, stages = s.speedup, max([s.stages * s.replicas, *(loss.stages_before or 0 for loss in s.host_lost)])
    if speedup is None or stages < 2:
        return []
    if speedup > stages:
        return [Flag("speedup_above_stages", f"speedup {speedup_text(speedup)} is above the {stages} ranks: "
                                             f"{_above_why(s)}", invalidates=True)]
    bound = _fill_drain_bound(s) if not s.host_lost else None  # (segments of two shapes: no one bound)
    if bound is not None and speedup > stages * bound[1] * (1 + ABOVE_BOUND_TOLERANCE):
        microbatches, cap = bound
        return [Flag("speedup_above_fill_drain", f"speedup {speedup_text(speedup)} is above the "
                                                 f"{speedup_text(stages * cap)} that filling and draining allow "
                                                 f"({microbatches} microbatches through {s.stages} stages: "
                                                 f"efficiency at most {cap:.2f}, measured {speedup / stages:.2f}): "
                                                 f"{_above_why(s)}", invalidates=True)]
    if speedup < 1:
        return [Flag("speedup_below_1", f"the {stages}-rank pipeline ({_ips(s.throughput_ips)} img/s) is slower "
                                        f"than the serial run ({_ips(s.serial_ips)} img/s)")]
    return []


def _host_lost(s: RunSummary) -> list[Flag]:
    """The run lost a host and went on without it: its figures are those of two splits on different hosts (each
    pass measured whole on one), and the time the loss cost is outside every pass."""
    out = []
    for loss in s.host_lost:
        cost = f"{loss.lost_s:.1f} s" if loss.lost_s is not None else "unknown time"
        out.append(Flag("host_lost", f"{loss.host} was lost after {loss.completed_passes} of {s.repeats or '-'} "
                                     f"timed pass(es) ({loss.message or 'no word from it'}); the run went on with "
                                     f"{loss.stages_after} stage(s) on {', '.join(loss.hosts_after)}: {cost} from the "
                                     f"failure to the next segment's first output (in no timed pass), "
                                     f"{loss.recomputed_images} image(s) computed again; each pass counts once, on "
                                     "the split that ran it (`segments`)" + _baseline_on(s, loss.host)))
    return out


def _baseline_on(s: RunSummary, lost: str) -> str:
    """What the speedup divides by when the serial baseline's own host was the one lost: its measurement from
    before the loss (the same protocol and threads, the run's one reference), said so rather than assumed."""
    host = s.baseline.host if s.baseline else None
    if host != lost:
        return ""
    return (f"; the serial baseline was measured on {lost} before it was lost, and the speedup divides by that "
            f"measurement")


def _ips(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _stage_ms_per_image(s: RunSummary) -> float | None:
    """Compute time of all stages together per image (timed passes), ms."""
    total = 0.0
    for st in s.per_stage:
        if not st.compute_s or not st.microbatches:
            return None
        total += st.compute_s / (st.microbatches * (s.chunk or 1))
    total /= s.replicas  # each replica's stages compute every image of its own share
    return total * 1000 if total else None


def _above_why(s: RunSummary) -> str:
    """Which is it: a suspect serial baseline (and the evidence), or a model that got cheaper when split."""
    base = s.baseline
    host = base.host if base else None
    if s.serial_reused:
        return (f"the serial baseline is suspect: it was reused, measured {age_text(base.age_s if base else 0)} "
                "earlier (--fresh-baseline measures it again)")
    measured = base.state if base and base.state else HostState()
    if (other := other_work_cores(measured.model_dump(exclude_none=True)) or 0.0) > LOAD_TOLERANCE_CORES:
        return (f"the serial baseline is suspect: other work kept {other:.1f} cores busy on {host} "
                "when it was measured")
    timing = s.serial_timing
    delay, compute = (timing.run_delay_per_image_s, timing.compute_per_image_s) if timing else (None, None)
    if delay is not None and compute and delay / compute > SERIAL_WAIT_LIMIT:
        return (f"the serial baseline is suspect: on {host}, its threads waited {delay * 1000:.1f} ms per image "
                f"for a CPU other work held ({delay / compute:.0%} of its time)")
    record = s.hosts.get(host or "")
    during = record.during_baseline if record and record.during_baseline else SampleWindow()
    if (overload := _overload(during, measured.cpus)) is not None:
        return f"the serial baseline is suspect: on {host}, while it was measured, {overload}"
    if any(throttling(v) for v in during.throttled) or (during.temp_max_c or 0.0) >= HOT_C:
        return f"the serial baseline is suspect: {host} was throttled or hot while it was measured"
    stage_ms, serial_ms = _stage_ms_per_image(s), 1000.0 / s.serial_ips if s.serial_ips else None
    if stage_ms and serial_ms and stage_ms < 0.9 * serial_ms:
        return (f"the model got cheaper when split: the stages together computed an image in {stage_ms:.0f} ms, "
                f"the whole model in {serial_ms:.0f} ms (smaller stages fit the caches better)")
    return (f"the serial baseline is suspect: no load was seen on {host}, yet the stages together computed an "
            f"image in {stage_ms or 0:.0f} ms against the serial run's {serial_ms or 0:.0f} ms")


def _spread(s: RunSummary) -> list[Flag]:
    runs = [("serial baseline", s.serial_spread_ips, s.serial_ips)]
    if s.stages * s.replicas > 1:
        runs.insert(0, ("pipeline", s.throughput_spread_ips, s.throughput_ips))
    out = []
    for what, spread, mean in runs:
        if spread and len(spread) == 2 and mean and (spread[1] - spread[0]) / mean > SPREAD_LIMIT:
            out.append(Flag("throughput_spread", f"{what} throughput varied from {spread[0]:.2f} to {spread[1]:.2f} "
                                                 f"img/s across the timed passes ({(spread[1] - spread[0]) / mean:.0%} "
                                                 "of its mean): other work ran, or a host throttled"))
    return out


# -- hosts ---------------------------------------------------------------------------------------

def _overload(during: SampleWindow, cpus: int | None) -> str | None:
    """What says a host ran more threads than its CPUs while it was sampled, or None.

    The kernel's CPU pressure (`cpu_wait_mean`, the share of time some runnable thread waited for a CPU,
    averaged over the CPUs) times the CPUs is about how many threads more than its CPUs wanted one: flagged
    over LOAD_TOLERANCE_CORES, the controller's and the sampler's own share. A clean 2-stage run on a 2-CPU
    machine, controller included, waited 3-8 % of the time (0.06-0.16); a third busy loop makes it 50 % (1.0).
    Hosts without PSI fall back on the runnable threads counted at each sample's instant."""
    if not cpus:
        return None
    wait = during.cpu_wait_mean
    if wait is not None:
        if wait * cpus <= LOAD_TOLERANCE_CORES:
            return None
        return (f"threads waited for a CPU {wait:.0%} of the time (about {wait * cpus:.1f} threads more than its "
                f"{cpus} CPUs wanted one; /proc/pressure/cpu)")
    runnable = during.runnable_mean
    if runnable is not None and runnable > cpus + LOAD_TOLERANCE_CORES:
        return f"{runnable:.1f} threads were running or waiting for {cpus} CPUs"
    return None


def _machines(s: RunSummary, names: list[str]) -> list[list[str]]:
    """Hosts grouped by machine: those that share a kernel (the same boot id) are one machine."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        groups[_host_state(s, name).boot_id or f"host:{name}"].append(name)
    return list(groups.values())


def _who(group: list[str]) -> str:
    return group[0] if len(group) == 1 else f"{', '.join(group)} (one machine)"


def _host_health(s: RunSummary) -> list[Flag]:
    """Overload, throttling and heat while the pipeline ran (its figures read lower: a warning) or while the
    serial baseline ran (the baseline is slow and every speedup divided by it reads high: the result is
    SUSPECT)."""
    out = []
    for window, during in (("during_pipeline", "the pipeline"), ("during_baseline", "the serial baseline")):
        # A slowed baseline makes every speedup divided by it read high; a one-rank run divides nothing by it.
        baseline = window == "during_baseline" and s.stages * s.replicas > 1
        measured, own = own_wait(s, window)
        if own is not None:
            out.append(own)
        seen: dict[str, SampleWindow] = {name: w for name, rec in s.hosts.items()
                                         if (w := getattr(rec, window)) is not None and w.model_fields_set}
        for group in _machines(s, list(seen)):
            # Hosts on one machine sampled the same kernel: what any of them saw, the machine had.
            aggs = [seen[h] for h in group]
            throttled = sorted({str(v) for a in aggs for v in a.throttled})
            hottest = max((a.temp_max_c or 0.0 for a in aggs), default=0.0)
            cpus = _host_state(s, group[0]).cpus
            worst = max(aggs, key=lambda a: (a.cpu_wait_mean or 0.0, a.runnable_mean or 0.0))
            if not measured and (overload := _overload(worst, cpus)) is not None:
                out.append(Flag("host_overloaded", f"{_who(group)}: during {during}, {overload}", baseline))
            why = sorted({w for v in throttled for w in throttling(v)})
            if why:
                out.append(Flag("host_throttled", f"{_who(group)} was throttled during {during} "
                                                  f"({', '.join(why)}; vcgencmd get_throttled "
                                                  f"{', '.join(throttled)})", baseline))
            if hottest >= HOT_C:
                out.append(Flag("host_hot", f"{_who(group)} reached {hottest:.0f} C during {during} "
                                            f"(throttling starts at {HOT_C:.0f} C)", baseline))
    return out


def _stale_baseline(s: RunSummary) -> list[Flag]:
    base = s.baseline
    if not s.serial_reused or base is None:
        return []
    age, limit = base.age_s or 0.0, base.max_age_s
    why = []
    if limit is not None and age > limit:
        why.append(f"it is older than baseline_max_age ({age_text(limit)})")
    then = base.state.model_dump(exclude_none=True) if base.state else None
    if (change := state_change(then, _state(s, base.host))) is not None:
        why.append(f"its host changed since: {change}")
    return [Flag("baseline_stale", f"the serial baseline was reused ({age_text(age)} old) although "
                                   + " and ".join(why), invalidates=s.stages * s.replicas > 1)] if why else []


def _sharing(s: RunSummary) -> list[Flag]:
    """More stage threads than cores: on one host (its CPUs or its quota), or on one machine across hosts."""
    stages = [st for st in s.per_stage if st.host]
    if len(stages) < 2:
        return []
    count: dict[str, int] = defaultdict(int)
    threads: dict[str, int] = defaultdict(int)
    for st in stages:
        assert st.host is not None
        count[st.host] += 1
        threads[st.host] += st.threads or 1
    out = []
    for host in count:
        cores = capacity(_state(s, host)) if _state(s, host) else None
        if cores is not None and count[host] > 1 and threads[host] > cores:
            out.append(Flag("stages_share_cores", f"{host} runs {count[host]} stages with {threads[host]} threads "
                                                  f"on {cores:g} cores"))
    for group in machines({h: _state(s, h) for h in count}):  # (hosts pinned to cores of their own share none)
        if len(group) < 2 or not all(_state(s, h) for h in group):
            continue
        cpus = machine_cpus([_state(s, h) for h in group])
        # A host's CPU quota caps what its threads can take from the machine.
        used = sum(min(threads[h], capacity(_state(s, h))) for h in group)
        if used > cpus:
            out.append(Flag("stages_share_cores", f"{', '.join(group)} are one machine (one kernel) with {cpus} CPUs "
                                                  f"running {sum(count[h] for h in group)} stages with "
                                                  f"{sum(threads[h] for h in group)} threads"))
    return out


def _fill_drain_bound(s: RunSummary) -> tuple[int, float] | None:
    """Each replica's microbatches M, and GPipe's fill/drain bound M / (M + S - 1): the most of its ranks an
    exact pipeline can keep busy (None for one stage, or without images)."""
    stages = s.stages
    if stages < 2 or not s.images:
        return None
    microbatches = -(-s.images // (s.chunk or 1)) // s.replicas  # each replica fills and drains with its share
    if microbatches < 1:
        return None
    return microbatches, microbatches / (microbatches + stages - 1)


def _fill_drain(s: RunSummary) -> list[Flag]:
    found = _fill_drain_bound(s)
    if found is None:
        return []
    stages, chunk = s.stages, s.chunk or 1
    microbatches, bound = found
    if bound >= FILL_DRAIN_MIN:
        return []
    need = math.ceil(round(FILL_DRAIN_MIN / (1 - FILL_DRAIN_MIN) * (stages - 1), 6)) * chunk
    return [Flag("fill_drain_bound", f"{microbatches} microbatches through {stages} stages: filling and draining the "
                                     f"pipeline every pass caps its efficiency at {bound:.2f}; {need} images or more "
                                     f"keep the cap at {FILL_DRAIN_MIN}")]


def _wire(s: RunSummary) -> list[Flag]:
    """A compressing format that sends more than fp16 would on some link (lowrank:R with R near the token or
    channel count): it costs accuracy and saves less than a format that costs almost none. One flag per
    format and ratio, naming its cuts."""
    cuts: dict[tuple[str, float], list[str]] = defaultdict(list)
    for link in s.wire.links if s.wire else []:
        fmt, wire, raw = link.format, link.wire_bytes, link.raw_bytes
        if fmt in ("fp32", *HALF_PRECISION) or not wire or not raw or wire <= raw / 2:
            continue
        cuts[(fmt, round(wire / raw, 2))].append(f"{link.cut} (link {link.link})")
    flags = []
    for (fmt, ratio), where in cuts.items():
        than = "more than fp32 itself" if ratio >= 1 else "more than fp16's 0.50, which loses far less"
        flags.append(Flag("wire_no_saving", f"{fmt} sent {ratio:.2f} of fp32's bytes at {', '.join(where)}, {than}"))
    return flags
