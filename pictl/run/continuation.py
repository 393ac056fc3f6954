"""Fail in place: a run that loses a host goes on with the hosts it has left, as a new segment.

A host is lost to a run when one of its ranks dies without a word (killed, out of memory, its power or link gone:
`errors.HostLost`, named by the launch's culprit). Under `--on-host-loss continue` (the default) the session then
asks `cannot_continue` whether it can, and `continue_without` makes the next segment:

    the launch already stopped every rank (`cluster.ranks.RankLaunch`); the timed passes it finished stand
    the stages go over the hosts left (their ranks there as before), under the same policy (`explicit`'s cuts
        fit no other number of stages: `equal`), from the cost profiles the run already has; the lost host's
        lease is given back (it was not re-admitted: a later run may use it)
    the spec, numbered to begin at the first timed pass that did not finish, is staged there, and the session
        launches it (`run.pipeline`), warm processes where the hosts have them

The unit of recovery is the timed pass: torch's GPipe schedule hands a pass's outputs back together, so the pass a
host was lost in is computed again whole on the hosts left. Every pass is all of the run's images, so each pass
counted is one whole set of outputs, measured on one split: none lost, none counted twice. The outputs checked
against the serial run are the last segment's (its first timed pass, as in any run). The serial baseline measured
before the pipeline stays the run's one reference, whichever host was lost: it was measured, under the same
protocol and threads, before the loss.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from pictl import errors as E
from pictl.cluster.jobs import HostJob
from pictl.events import HostDropped, Phase
from pictl.planning.specs import spec_from
from pictl.run.context import RunContext
from pictl.run.logbook import Logbook
from pictl.run.placement import Placement, candidates, place
from pictl.run.segments import HostLoss
from pictl.run.split import SplitChoice, choose_split
from pictl.run.staging import Staged
from remote.floor import protocol as P
from remote.floor.wire import parse_wire


def cannot_continue(ctx: RunContext, placement: Placement, lost: E.HostLost, book: Logbook, *,
                    comparison: bool = False) -> str | None:
    """Why the run cannot go on without `lost`'s host (one line), or None when it can. A run of a comparison (a
    sweep's or a tune's) never does: its figure stands for one configuration, measured whole."""
    o = ctx.options
    if o.on_host_loss == "fail":
        return "--on-host-loss fail"
    if comparison:
        return ("a run of a sweep or tune is measured whole on one set of hosts (the comparison measures it again "
                "on the hosts left)")
    if o.replicas > 1:
        return "a run with replicas ends when a host is lost (each replica's split is shared: re-planning one is " \
               "not built)"
    if parse_wire(o.wire).per_cut:
        return f"--wire {o.wire} names its cuts: a re-planned split has others"
    left = [n for n in placement.nodes if n.host.name != lost.host]
    if not left:
        return "no host is left"
    if sum(n.nproc for n in left) < 2:
        return f"only {left[0].host.name} is left: a pipeline needs two stages"
    if len(book.telemetry.throughputs) >= o.repeats:
        return "every timed pass had finished: the run ended after its passes, in its outputs or traces"
    return None


@dataclass(frozen=True)
class Continued:
    """The next segment: the run's context with the options it now runs (fewer stages), and its phases' results."""

    ctx: RunContext
    placement: Placement
    choice: SplitChoice
    staged: Staged
    loss: HostLoss


async def continue_without(ctx: RunContext, job: HostJob, placement: Placement, staged: Staged, lost: E.HostLost,
                           book: Logbook) -> Continued:
    """Re-plan for the hosts left and stage the rest of the timed passes there (see the module's docstring)."""
    o, tel = ctx.options, book.telemetry
    failed_at = lost.failed_at or time.time()
    completed = len(tel.throughputs)
    # After the first timed pass the passes run back to back: the loss fell in pass `completed` (or at the barrier
    # that begins it); before it, in the warm-up or refinement, no timed image was lost.
    in_flight = completed > 0 or any(st.progress is not None and st.progress.phase == "timed"
                                     for st in tel.stages.values())
    left = [n for n in placement.nodes if n.host.name != lost.host]
    stages = sum(n.nproc for n in left)
    options = o.model_copy(update={"stages": stages, "split": [], "slowdown": None,
                                   "policy": "equal" if o.policy == "explicit" else o.policy})
    names = {n.host.name for n in left}
    cluster = ctx.cluster.model_copy(update={"hosts": tuple(h for h in ctx.cluster.hosts if h.name in names)})
    ctx = dataclasses.replace(ctx, cluster=cluster, options=options, pushed=ctx.tree)
    ctx.sink(Phase("host-lost", f"{lost.host} lost after {completed} of {o.repeats} timed pass(es) ({lost.detail}); "
                                f"continuing on {', '.join(h.name for h in cluster.hosts)} with {stages} stage(s)"
                                + (" (explicit cuts do not fit: equal)" if o.policy == "explicit" else "")))
    ctx.sink(HostDropped(lost.host, lost.detail))
    tel.new_launch(completed)
    nodes = await place(ctx, job, candidates(cluster, stages, options.policy), book.timeline)
    spec = dataclasses.replace(spec_from(options, ctx.run_id, ctx.artifact), first_pass=completed)
    choice = await choose_split(ctx, job, nodes, spec, book.timeline)
    if choice.spec.refine is not None:
        # `balanced`'s costs were corrected by this run's own passes moments ago (kept with each host's profile):
        # the next segment measures its split in its warm-up and tries no other, so no calibration pass delays it;
        # the watch over its timed passes still re-cuts if a host drifts.
        quick = dataclasses.replace(choice.spec.refine, max_rounds=1)
        choice = dataclasses.replace(choice, spec=dataclasses.replace(choice.spec, refine=quick))
    hosts = [n.host.name for n in nodes.nodes]
    await job.stage({P.SPEC_FILE: choice.spec.to_json().encode()}, "cannot continue the run", hosts)
    book.segments.host_lost(lost.host, completed, choice.spec.split_points, nodes.stage_hosts[:stages])
    loss = HostLoss(lost.host, lost.rank, lost.detail or str(lost), completed, o.stages, stages, hosts,
                    o.images if in_flight else 0, failed_at, relaunched_at=time.time())
    book.losses.append(loss)
    return Continued(ctx, nodes, choice, Staged(staged.facts, None), loss)
