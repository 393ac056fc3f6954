"""Launching ranks on a job's hosts, for a run's pipeline and a training job alike: which ranks each host's
torchrun agent runs (`NodePlan`), the exact torchrun command line every host gets, every rank's lines
streamed, and on a failure every host stopped once the culprit (`pictl.cluster.culprit`) is known.

Static rendezvous (torchrun's default) is named explicitly: under c10d the node
order would be a string sort of addresses and --node-rank would be ignored.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pictl.cluster.commands import WARM_CLIENT, python_module, supervised, worker_env
from pictl.cluster.culprit import SilentDeath, await_culprit
from pictl.cluster.jobs import HostJob
from pictl.cluster.stream import LineKeeper, ProcessStream
from pictl.cluster.transport import RemoteProcess
from pictl.events import EventSink, Rejected
from pictl.inventory import Host
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.records import Record
from remote.floor.run_records import Error


@dataclass(frozen=True)
class NodePlan:
    """One torchrun agent: a host and the consecutive stages (ranks) it runs."""

    host: Host
    node_rank: int
    first_rank: int
    nproc: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


def torchrun_argv(node: NodePlan, *, nnodes: int, master: Host, master_port: int, spec_path: str,
                  run_id: str = "none", module: str = entries.PIPELINE.module) -> list[str]:
    # --rdzv-id: the static rendezvous keys its store by it, so agents of another run that reach our
    # port (a shared Pi) never mix with ours.
    # Warm: torchrun's agent is forked from the host's warm process, and it starts each rank as the warm
    # client, which has the rank forked too (`python -u -m remote.host.warmclient MODULE ...`): torchrun stays
    # the launcher, and nothing it starts imports torch.
    workers = ["-m", WARM_CLIENT, module] if node.host.warm else ["-m", module]
    return [
        *python_module(node.host, entries.TORCHRUN.module),
        f"--nnodes={nnodes}", f"--nproc-per-node={node.nproc}", f"--node-rank={node.node_rank}",
        "--rdzv-backend=static", f"--rdzv-id={run_id}", f"--master-addr={master.rendezvous_address}",
        f"--master-port={master_port}", "--max-restarts=0",
        *workers, "--spec", spec_path,
    ]


@dataclass(frozen=True)
class RankWatch:
    """How a launch reads its ranks' records: which it keeps, and what each rank has said."""

    on_record: Callable[[NodePlan, Record], bool]
    """Sees a host's record first; returns whether it is kept (an `error` kept stops every host)."""
    finished: Callable[[int], bool]
    """The rank reported its end."""
    errored: Callable[[int], bool]
    """The rank reported an error."""
    on_rejected: Callable[[str, Rejected], None] | None = None
    """A host's line that claimed to be telemetry but broke the protocol."""


@dataclass(frozen=True)
class Launched:
    """How the ranks ended: every one well (`failed` False), or which rank is to blame when one is known."""

    failed: bool
    culprit: SilentDeath | None
    tail: deque[str]
    failed_at: float | None = None
    """When the failure was seen (the controller's `time.time()`): before the culprit was awaited and the hosts
    stopped."""


class RankLaunch:
    """torchrun on every host of `nodes`, every rank's lines streamed, until each rank has ended or one has
    failed: then the culprit is awaited and every host is stopped. `live` while the ranks run; `window`:
    [start, end] on the controller's clock."""

    def __init__(self, job: HostJob, nodes: Sequence[NodePlan], *, port: int, threads: Mapping[str, int],
                 keep: LineKeeper, sink: EventSink, watch: RankWatch, module: str = entries.PIPELINE.module,
                 spec_path: str = P.SPEC_FILE) -> None:
        self.job, self.nodes, self.port, self.threads = job, list(nodes), port, threads
        self.keep, self.sink, self.watch, self.module, self.spec_path = keep, sink, watch, module, spec_path
        self.live = False
        self.window: list[float] = []

    async def run(self) -> Launched:
        job, nodes, rules = self.job, self.nodes, self.watch
        master = nodes[0].host
        failed = asyncio.Event()
        tail: deque[str] = deque(maxlen=20)
        procs: dict[str, RemoteProcess] = {}
        ended: dict[str, int] = {}  # host -> torchrun's exit status, once its output is read to the end
        self.live = True
        self.window[:] = [time.time(), time.time()]
        for node in nodes:
            argv = supervised(node.host, torchrun_argv(node, nnodes=len(nodes), master=master, master_port=self.port,
                                                       spec_path=self.spec_path, run_id=job.job_id,
                                                       module=self.module), "pgid-torchrun")
            procs[node.host.name] = await job.start(node.host, argv, cwd=job.run_dir(node.host),
                                                    env=worker_env(node.host, self.threads[node.host.name]))

        async def watch(node: NodePlan) -> None:
            name = node.host.name

            def on_record(record: Record) -> bool:
                kept = rules.on_record(node, record)
                if kept and isinstance(record, Error):
                    failed.set()
                return kept

            rejected = rules.on_rejected
            stream = ProcessStream(name, name, self.keep, self.sink, on_record, tail,
                                   on_rejected=(lambda why: rejected(name, why)) if rejected else None)
            rc = ended[name] = await stream.consume(procs[name])
            if rc != 0 and not all(rules.finished(r) for r in node.ranks):
                failed.set()

        watchers = [asyncio.create_task(watch(n)) for n in nodes]
        waiter = asyncio.create_task(failed.wait())
        try:
            await asyncio.wait([*watchers, waiter], return_when=asyncio.FIRST_COMPLETED)
            while not failed.is_set() and not all(w.done() for w in watchers):
                await asyncio.wait([*watchers, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            self.live = False
            self.window[1:] = [time.time()]
        crashed = next((w.exception() for w in watchers if w.done() and not w.cancelled() and w.exception()), None)
        if crashed is not None:  # reading a host's output failed (a bug): never a job that looks complete
            await job.stop_all()
            await asyncio.gather(*watchers, return_exceptions=True)
            raise crashed
        if not failed.is_set():
            return Launched(False, None, tail)
        failed_at = self.window[1]
        culprit = await await_culprit(ended, {n.host.name: n.ranks for n in nodes},
                                      reported=lambda r: rules.finished(r) or rules.errored(r),
                                      errored=rules.errored)
        await job.stop_all()
        await asyncio.gather(*watchers, return_exceptions=True)
        return Launched(True, culprit, tail, failed_at)
