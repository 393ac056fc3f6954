"""Phase 4, staging: every host of the run gets the spec and the owner file in its run directory, orphans
a vanished controller left are stopped (never another run's), a chosen rendezvous port is checked, and
each host's state and versions (and the checkpoint's hash, where it lives) are read for the baseline's
key and the run's flags; a host whose torch the host code does not run on is refused (exit 6).
"""

from __future__ import annotations

from dataclasses import dataclass

from pictl.cluster.commands import master_port
from pictl.cluster.hoststate import HostFacts, read_run_facts, refuse_unsupported_torch
from pictl.cluster.jobs import HostJob
from pictl.events import Phase
from pictl.run.context import RunContext
from pictl.run.placement import Placement
from pictl.run.timeline import StartupTimeline
from remote.floor import protocol as P
from remote.floor.spec import RunSpec, hf_model_dir


@dataclass(frozen=True)
class Staged:
    facts: dict[str, HostFacts]
    master_port: int | None
    """The port asked for (`--master-port`), checked free; None: chosen at launch."""


async def stage(ctx: RunContext, job: HostJob, placement: Placement, spec: RunSpec,
                timeline: StartupTimeline) -> Staged:
    names = [n.host.name for n in placement.nodes]
    swept = await job.stage({P.SPEC_FILE: spec.to_json().encode()}, "cannot prepare the run", names)
    port = None
    if ctx.options.ranks > 1 and ctx.options.master_port:  # a chosen port is checked before anything starts
        port = await master_port(job.transport(names[0]), ctx.options.master_port)
    first = placement.first.host
    facts = await read_run_facts(job.transport(first), job.fleet.only(names[1:]), base_dir=first.run_dir(spec.run_id),
                                 checkpoint=spec.checkpoint if spec.checkpoint and not ctx.artifact
                                 else hf_model_dir(spec.model))  # (a model directory: its files' content)
    # A torch the host code does not run on fails every rank's first pass: refused here, before the baseline.
    refuse_unsupported_torch([n.host for n in placement.nodes], facts)
    timeline.mark("prepared")
    stopped = sum(len(c.get("stopped", [])) for c in swept.values())
    if stopped:
        ctx.sink(Phase("cleanup", f"stopped {stopped} process group(s) an earlier run left behind"))
    for name, c in swept.items():
        live = {k["run"] for k in c.get("kept", []) if k.get("pgid")}
        if live:  # (a run without a lease: an older pictl) it shares this host's CPUs with ours
            ctx.sink(Phase("cleanup", f"{name}: {len(live)} other run(s) still running in this workdir "
                           f"({', '.join(sorted(live))}); their processes are left alone"))
    return Staged(facts, port)
