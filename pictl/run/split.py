"""Phase 3, costs and split: under `balanced`, the split with the smallest predicted bottleneck, from the
hosts' cost profiles and the links between them; with refinement, the ranks get the cost table too and
correct the split from what they measure (`remote.runtime.refine`), and what they found is kept with
each host's profile (`keep_refined`) so the next run on the cluster starts from it.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, replace
from typing import Any

from pictl import errors as E
from pictl.cluster.jobs import HostJob
from pictl.events import Phase, SplitChosen
from pictl.planning.costs import CachedProfile, cost_table, host_profiles, keep_corrections, link_profiles
from pictl.run.context import RunContext
from pictl.run.placement import Placement
from pictl.run.timeline import StartupTimeline
from pictl.summary_figures import LinkCost, Prediction
from remote.floor.balance import NoFeasibleSplit, balanced_split
from remote.floor.run_records import Refine, Refined
from remote.floor.spec import RefineSpec, RunSpec
from remote.floor.wire import byte_ratio, parse_wire


@dataclass(frozen=True)
class SplitChoice:
    """The spec the hosts get (its split points decided), and under `balanced` what was predicted."""

    spec: RunSpec
    prediction: Prediction | None = None
    """As summary.json's `prediction` holds it, before the run refines it (`final_prediction`)."""
    pieces: tuple[str, ...] = ()
    """Under `balanced`: every piece's split-point name, in order (what the cost table's rows are)."""


async def choose_split(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec,
                       timeline: StartupTimeline) -> SplitChoice:
    if ctx.options.policy != "balanced" or spec.stages == 1:
        return SplitChoice(spec)
    o = ctx.options
    ratio = byte_ratio(parse_wire(o.wire).default)  # what crosses a link per byte of fp32 activations
    stage_hosts = placement.stage_hosts
    used = job.fleet.only(dict.fromkeys(stage_hosts))
    ctx.sink(Phase("balance", f"cost profiles of {len(used)} host(s)"))
    profiles = await host_profiles(used, ctx.caches.costs, model=spec.model, num_classes=spec.num_classes,
                                   chunk=spec.chunk, threads=placement.threads, code=ctx.code, tokens=spec.tokens,
                                   artifact=ctx.artifact, use_corrections=o.refine,
                                   announce=lambda line: ctx.sink(Phase("balance", line)))
    # With replicas, each runs the same split on its own hosts: the split is chosen for the slowest of them.
    replicas = [stage_hosts[r * spec.stages:(r + 1) * spec.stages] for r in range(spec.replicas)]
    hops = [(job.transport(a), job.transport(b)) for a, b in dict.fromkeys(
        (a, b) for hosts in replicas for a, b in itertools.pairwise(hosts) if a != b)]
    links, measured_links = await link_profiles(hops, ctx.caches.links)
    tables = [cost_table(hosts, profiles, links, wire_ratio=ratio) for hosts in replicas]
    table = tables[0]
    try:
        split = balanced_split(*tables)  # replicas share the split: the one whose slowest replica is fastest
    except NoFeasibleSplit as exc:
        raise E.ConfigError(f"policy balanced: {exc}") from None
    pieces = profiles.profile(stage_hosts[0]).pieces
    refine = RefineSpec(compute_s=[list(row) for row in table.compute_s], cut_bytes=list(table.cut_bytes),
                        links=[list(dataclasses.astuple(k)) for k in table.links],  # (Link's fields, in order)
                        comm_s_per_byte=list(table.comm_s_per_byte), recut=o.recut,
                        max_recuts=o.max_recuts) if o.refine else None
    chosen = replace(spec, policy="explicit", split_points=[pieces[i] for i in split.starts], refine=refine)
    # (built as computed, nothing coerced: an age in whole seconds stays an int in summary.json)
    prediction = Prediction.model_construct(
        stage_ms=[round(s * 1000, 3) for s in split.stage_s], link_ms=[round(s * 1000, 3) for s in split.link_s],
        bottleneck_ms=round(split.bottleneck_s * 1000, 3), profiled=profiles.measured, shared_machine=profiles.shared,
        corrections={h: profiles.correction(h) for h in dict.fromkeys(stage_hosts)},
        # How old each correction is: a host that has cooled down since is corrected again by the run.
        corrections_age_s={h: round(a) for h in dict.fromkeys(stage_hosts)
                           if (a := profiles.correction_age_s(h)) is not None},
        links={f"{a}->{b}": LinkCost.model_construct(latency_ms=round(k.latency_s * 1000, 3),
                                                     MB_per_s=round(k.bytes_per_s / 1e6, 1),
                                                     send_ns_per_byte=round(k.send_s_per_byte * 1e9, 2),
                                                     recv_ns_per_byte=round(k.recv_s_per_byte * 1e9, 2))
               for (a, b), k in links.items()},
        links_measured=measured_links, first_split=list(chosen.split_points), refine=o.refine)
    if profiles.measured:  # (the profiling processes, counted in the start-up's)
        timeline.launched("profile", {job.transport(h).host: 1 for h in profiles.measured})
    for group in profiles.shared:
        ctx.sink(Phase("balance", f"{', '.join(group)} share one machine: profiled one at a time"))
    source = (f"measured {', '.join(profiles.measured)}" if profiles.measured else
              cached_age([profiles.profile(h) for h in profiles.by_host]))
    ages = prediction.corrections_age_s
    corrected = [f"{h} x{f:.2f}" + (f" {ages[h]:.0f} s ago" if h in ages else "")
                 for h, f in prediction.corrections.items() if f != 1.0]
    ctx.sink(Phase("balance", f"split {', '.join(chosen.split_points)}: predicted "
                   + " / ".join(f"{ms:.1f}" for ms in prediction.stage_ms) + " ms per microbatch"
                   + f" ({source}" + (f"; corrected by earlier runs: {', '.join(corrected)}" if corrected else "")
                   + ")" + ("; refined during the run" if o.refine else "")))
    ctx.sink(SplitChosen(tuple(chosen.split_points), "balanced", tuple(prediction.stage_ms)))
    return SplitChoice(chosen, prediction, tuple(pieces))


def cached_age(profiles: list[CachedProfile]) -> str:
    """"profiles cached 3 min ago": how old the oldest cached profile in use is."""
    import time

    until = [p.measured_until for p in profiles if isinstance(p.measured_until, (int, float))]
    if not until:
        return "cached profiles"
    age = max(0.0, time.time() - min(until))
    return f"profiles cached {age:.0f} s ago" if age < 120 else f"profiles cached {age / 60:.0f} min ago"


def final_prediction(choice: SplitChoice, refined: Refined | None) -> dict[str, Any] | None:
    """What the run predicted for the split its timed passes ran: the ranks' refined prediction when they
    refined, else the controller's; with the corrections the run found, per host."""
    if choice.prediction is None:
        return None
    if refined is None:
        return choice.prediction.written()
    links = refined.link_ms or []
    return {**choice.prediction.written(), "stage_ms": refined.predicted_ms, "link_ms": links,
            "bottleneck_ms": max([*refined.predicted_ms, *links])}


def keep_refined(ctx: RunContext, placement: Placement, choice: SplitChoice, refined: Refined) -> dict:
    """The ranks settled on a split: each host's correction (measured / profiled) is kept with its profile.
    Returns the corrections, per host."""
    assert choice.prediction is not None
    earlier = choice.prediction.corrections
    per_host: dict[str, list[float]] = {}
    for host, factor in zip(placement.stage_hosts, refined.factors, strict=True):
        per_host.setdefault(host, []).append(factor)
    corrections = {h: earlier.get(h, 1.0) * sum(fs) / len(fs) for h, fs in per_host.items()}
    o = ctx.options
    keep_corrections(ctx.caches.costs, {n.host.name: n.host for n in placement.nodes}, corrections,
                     model=o.model, num_classes=o.num_classes, chunk=o.chunk, threads=placement.threads,
                     code=ctx.code, artifact=ctx.artifact, tokens=o.tokens)
    return {h: round(f, 4) for h, f in corrections.items()}


REFINE_ROUND_FIELDS = ("round", "split_points", "predicted_ms", "measured_ms", "low_ms", "high_ms", "first_round",
                       "passes", "link_ms", "factors", "next_split", "adopted_round", "reason")


def refine_summary(rounds: list[Refine], chosen: Refined | None) -> dict[str, Any]:
    """`balanced`'s rounds (each split measured, with its noise, and the decision), and which round's split the
    timed passes began on, as measured, with what refinement added to start-up (`summary.json`'s `refine`)."""
    out: dict[str, Any] = {"rounds": [{k: getattr(r, k) for k in REFINE_ROUND_FIELDS} for r in rounds]}
    if chosen is not None:
        out |= {"chosen_round": chosen.chosen_round, "chosen_split": chosen.split_points,
                "measured_ms": chosen.measured_ms, "low_ms": chosen.low_ms, "high_ms": chosen.high_ms,
                "passes": chosen.passes, "calibration_passes": chosen.calibration_passes,
                "calibration_s": chosen.calibration_s, "reason": chosen.reason}
    return out
