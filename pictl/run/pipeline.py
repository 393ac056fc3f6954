"""Phase 6, launch and stream: torchrun on every host, every rank's lines read as they come, until every
rank has finished or one has failed (then every host is stopped, and the blame lands on the cause).

A port chosen at launch is free when chosen, but another user's process may bind it before torchrun's
agent has started: then every host is stopped and the launch is tried again on another port.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pictl import errors as E
from pictl.cluster.clock import measure_clock
from pictl.cluster.commands import PORT_ATTEMPTS, PORT_TAKEN, master_port
from pictl.cluster.culprit import SilentDeath
from pictl.cluster.jobs import HostJob
from pictl.cluster.ranks import RankLaunch, RankWatch
from pictl.events import Phase, RankEvent, Rejected
from pictl.planning.placement import NodePlan
from pictl.run.context import RunContext
from pictl.run.logbook import Logbook
from pictl.run.placement import Placement
from pictl.run.segments import RecutWatch
from pictl.run.split import SplitChoice, keep_refined
from pictl.run.staging import Staged
from remote.floor import protocol as P
from remote.floor.records import Record, encode
from remote.floor.recut import decision_body
from remote.floor.run_records import FirstOutput, PassWatched, Refined

CONTROLLER = "controller"
"""The source of the records the controller adds to a run's own (its watch's decisions)."""


class _PortTaken(Exception):
    """torchrun could not bind the rendezvous port we chose: it was taken in between."""


@dataclass(frozen=True)
class PipelineDone:
    corrections: dict[str, float] | None
    """`balanced` refined its split: each host's correction (measured / profiled), kept for the next run."""
    clocks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The first and last stages' hosts' clocks against ours (`offset_ns`, `uncertainty_ns`), or why not."""


class Pipeline:
    """One launch of the pipeline; `live` while its ranks run (trace grabs look at it)."""

    def __init__(self, ctx: RunContext, job: HostJob, placement: Placement, choice: SplitChoice, staged: Staged,
                 book: Logbook) -> None:
        """In `book`: the ranks' records folded (`telemetry`) and kept (`record`), the launch's [start, end]
        (`windows["pipeline"]`) and its start-up marks."""
        self.ctx, self.job, self.placement, self.choice, self.staged = ctx, job, placement, choice, staged
        self.book, self.telemetry = book, book.telemetry
        self.launch: RankLaunch | None = None
        self.corrections: dict[str, float] | None = None
        spec = choice.spec
        if not book.segments.items:  # (a launch that continues a run on fewer hosts: its segment is already open)
            book.segments.begin(spec.split_points, placement.stage_hosts[:spec.stages])
        # A `balanced` run that refines: the controller's watch over its timed passes (re-cuts end segments).
        self.recut = RecutWatch(spec.refine, choice.pieces, book.segments, placement.first.host.name) \
            if spec.refine is not None and spec.stages > 1 and spec.replicas == 1 and choice.pieces else None
        self._answers: set[asyncio.Task[None]] = set()
        self.first_output_at: float | None = None
        """When the last stage's first output of this launch reached the controller (`time.time()`)."""

    @property
    def live(self) -> bool:
        return self.launch is not None and self.launch.live

    async def run(self) -> PipelineDone:
        ctx, master = self.ctx, self.placement.first.host
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = self.staged.master_port or await master_port(self.job.transport(master), None)
            try:
                await self._launch(port)
                self._check_figures()
                return PipelineDone(self.corrections, await self._clocks())
            except _PortTaken:
                if self.staged.master_port or attempt == PORT_ATTEMPTS:
                    raise E.RunFailed.on(master.name, 0, "the pipeline", f"the rendezvous port {port} was taken on "
                                     f"{master.name} before torchrun could bind it", deque()) from None
                ctx.sink(Phase("pipeline", f"port {port} was taken on {master.name} before torchrun bound it; "
                                           "launching again on another port"))
        raise AssertionError("unreachable")

    async def _clocks(self) -> dict[str, dict[str, Any]]:
        """The hosts where images enter and leave, against our clock: a latency spans both (local: 0)."""
        hosts = list(dict.fromkeys([self.placement.first.host, self.placement.node_of(self.choice.spec.stages - 1)
                                    .host]))
        found = await asyncio.gather(*(measure_clock(self.job.transport(h)) for h in hosts), return_exceptions=True)
        return {h.name: ({"error": str(r)} if isinstance(r, BaseException) else
                         {"offset_ns": r.offset_ns, "uncertainty_ns": r.uncertainty_ns})
                for h, r in zip(hosts, found, strict=True)}

    def _check_figures(self) -> None:
        """Every rank ended well: still, a run whose figures did not all arrive (a host sent records that
        broke the protocol, or none) fails rather than end "OK" with a number missing."""
        tel, spec = self.telemetry, self.choice.spec
        ranks = spec.stages * spec.replicas
        missing = tel.missing_figures(ranks, spec.repeats)
        if missing is None:
            return
        rejected = tel.rejected_summary()
        why = f"{missing}" + (f"; {rejected['count']} telemetry record(s) rejected, the first from "
                              f"{rejected['first'][0]['host']}: {rejected['first'][0]['reason']}" if rejected else "")
        silent = next((r for r in range(ranks) if not (tel.stages.get(r) and tel.stages[r].ended)), ranks - 1)
        raise E.RunFailed.on(self.placement.node_of(silent).host.name, silent, "the pipeline", why)

    def _on_record(self, host: str, record: Record) -> bool:
        ctx = self.ctx
        self.telemetry.apply(host, record)
        if isinstance(record, Refined) and self.choice.prediction is not None:
            self.corrections = keep_refined(ctx, self.placement, self.choice, record)
            if self.recut is not None:
                self.recut.on_refined(record)
        elif isinstance(record, PassWatched) and record.rank == 0:
            self._judge(host, record)
        elif isinstance(record, FirstOutput) and self.first_output_at is None:
            self.first_output_at = time.time()
        self.book.timeline.observe(record)
        return True

    def _judge(self, host: str, watched: PassWatched) -> None:
        """Rank 0 measured a timed pass and waits: the watch's decision is recorded (as the ranks' records are),
        folded, shown, and sent back to rank 0 (a re-cut: the next segment's split)."""
        # (Rank 0 waits for an answer whatever happens: with no watch here, the answer is to keep the split.)
        records, split = self.recut.judge(watched) if self.recut is not None else ([], None)
        for record in records:
            self.book.record.event(CONTROLLER, encode(record))
            self._on_record(host, record)
            self.ctx.sink(RankEvent(CONTROLLER, host, record))
        first = self.placement.first.host
        path = f"{first.run_dir(self.choice.spec.run_id)}/{P.recut_decision_file(watched.after_pass)}"
        # put_bytes writes to a temporary name and renames: rank 0 never reads half an answer.
        task = asyncio.get_running_loop().create_task(
            self.job.transport(first).put_bytes(decision_body(watched.after_pass, split), path))
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    async def _launch(self, port: int) -> None:
        ctx, spec, nodes = self.ctx, self.choice.spec, self.placement.nodes
        master = nodes[0].host
        copies = f"{spec.replicas} replicas x " if spec.replicas > 1 else ""
        ctx.sink(Phase("pipeline", f"launching {copies}{spec.stages} stage(s) on {len(nodes)} host(s), "
                                   f"rendezvous {master.rendezvous_address}:{port}"))
        stages = self.telemetry.stages

        def on_record(node: NodePlan, record: Record) -> bool:
            if record.rank not in node.ranks:  # a host speaks only for the ranks it runs
                self.telemetry.reject(node.host.name, Rejected(record.EVENT, f"rank {record.rank} does not run on "
                                                                            "this host"))
                return False
            return self._on_record(node.host.name, record)

        watch = RankWatch(on_record, finished=lambda r: bool(stages.get(r) and stages[r].ended),
                          errored=lambda r: bool(stages.get(r) and stages[r].error),
                          on_rejected=self.telemetry.reject)
        self.book.timeline.launched("launch", {n.host: 1 + n.nproc for n in nodes})  # an agent and its ranks each
        self.launch = RankLaunch(self.job, nodes, port=port, threads=self.placement.threads, keep=self.book.record,
                                 sink=ctx.sink, watch=watch)
        self.book.windows["pipeline"] = self.launch.window  # [start, end], filled as the ranks run
        launched = await self.launch.run()
        self.book.segments.ran(self._ranks_split())
        if launched.failed:
            if not self.telemetry.stages and any(PORT_TAKEN in line for line in launched.tail):
                raise _PortTaken(port)  # no rank ever started: nothing of this attempt is in the figures
            raise self._blame(launched.culprit, launched.tail, launched.failed_at)

    def _ranks_split(self) -> list[str]:
        """Where the ranks' stages began, in their own words (each rank's first piece): the split a plan made on
        the hosts (`equal`'s) is known here first."""
        stages = self.telemetry.stages
        firsts = [stages[r].pieces[0] if r in stages and stages[r].pieces else None
                  for r in range(1, self.choice.spec.stages)]
        return [f for f in firsts if f is not None] if all(firsts) else []

    def _blame(self, culprit: SilentDeath | None, tail: deque[str], failed_at: float | None) -> E.RunFailed:
        """A rank that died without a word first (its host is lost to the run: `HostLost`), then the earliest
        rank that reported an error."""
        if culprit is not None:
            lost = E.HostLost.on(culprit.host, culprit.rank, "the pipeline", culprit.message, tail)
            lost.failed_at = failed_at
            return lost
        st = self.telemetry.first_error()
        if st is not None and st.error is not None:
            return E.RunFailed.on(self.placement.node_of(st.rank).host.name, st.rank, "the pipeline",
                              st.error.message, tail)
        return E.RunFailed.on(self.placement.first.host.name, None, "the pipeline",
                          "torchrun exited before every rank finished", tail)
