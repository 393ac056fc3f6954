"""Starting a training job's processes and reading them to the end: the `single` reference on the first
host (a plain process), and the job itself (torchrun on every host, one rank per stage or replica), both
over the job's hold on its hosts (`pictl.cluster.jobs.HostJob`) and the one rank launcher
(`pictl.cluster.ranks.RankLaunch`) that runs use too.

A rank that reports an error, or a host whose torchrun exits before its ranks ended, stops every host;
the blame goes to the rank that died without a word first, else to the earliest error.
"""

from __future__ import annotations

from collections import deque

from pictl import errors as E
from pictl.cluster.commands import master_port
from pictl.cluster.jobs import HostJob
from pictl.cluster.ranks import NodePlan, RankLaunch, RankWatch
from pictl.cluster.stream import LineKeeper, ProcessStream
from pictl.events import EventSink
from pictl.jobs.training.telemetry import TrainTelemetry
from remote.floor import entries
from remote.floor.job_records import TrainStep
from remote.floor.records import Record
from remote.floor.run_records import Error

MODULE = entries.TRAIN.module
REFERENCE_SPEC = "reference-spec.json"


def _failure(tail: deque[str], record: Error | None, host: str, rank: int | None, what: str) -> E.PictlError:
    message = record.message if record is not None else (list(tail) or ["no output"])[-1]
    if record is not None and record.kind == "bad_input":
        return E.ConfigError(message)
    return E.RunFailed.on(host, rank, what, message, tail)


async def run_reference(job: HostJob, node: NodePlan, keep: LineKeeper, sink: EventSink, threads: int,
                        ) -> dict[int, float]:
    """The same job as `single` for its first steps, on the first host: the losses every mode must match."""
    host = node.host
    losses: dict[int, float] = {}
    errors: list[Error] = []

    def on_record(record: Record) -> bool:
        match record:
            case TrainStep(loss=float() | int() as loss):
                losses[record.step] = float(loss)
            case Error():
                errors.append(record)
        return isinstance(record, TrainStep | Error)

    stream = ProcessStream("reference", host.name, keep, sink, on_record)
    rc = await job.run_module(host, MODULE, ["--spec", REFERENCE_SPEC], stream, threads=threads,
                              pgid_file="pgid-reference")
    if rc != 0 or errors:
        raise _failure(stream.tail, errors[0] if errors else None, host.name, None, "the single-mode reference")
    return losses


async def run_ranks(job: HostJob, nodes: list[NodePlan], keep: LineKeeper, sink: EventSink, tel: TrainTelemetry,
                    threads: int) -> None:
    """torchrun on every host until each rank has ended (or one failed: then every host is stopped)."""
    master = nodes[0].host
    port = await master_port(job.transport(master), None)

    def on_record(node: NodePlan, record: Record) -> bool:
        tel.apply(node.host.name, record)
        return True

    ranks = tel.ranks
    watch = RankWatch(on_record, finished=lambda r: bool(ranks.get(r) and ranks[r].end),
                      errored=lambda r: bool(ranks.get(r) and ranks[r].error))
    launched = await RankLaunch(job, nodes, port=port, threads={n.host.name: threads for n in nodes}, keep=keep,
                                sink=sink, watch=watch, module=MODULE).run()
    if not launched.failed:
        return
    if launched.culprit is not None:
        culprit = launched.culprit
        # A training run does not go on without the host (`pictl run` does): the lost stage's weights and optimizer
        # state lived only there, and its last checkpoint is the step the run began from.
        raise E.HostLost.on(culprit.host, culprit.rank, "training", f"{culprit.message}; a training run does not "
                            "continue on the hosts left (the lost stage's weights and optimizer state lived only on "
                            "it)")
    first = tel.first_error()
    if first is not None:
        raise _failure(launched.tail, first.error, first.host, first.rank, "training")
    raise E.RunFailed(f"training failed on host '{master.name}': torchrun exited before every rank finished")
