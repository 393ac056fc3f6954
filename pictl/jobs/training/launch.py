"""Starting a training job's processes and reading them to the end: the `single` reference on the first
host (a plain process), and the job itself (torchrun on every host, one rank per stage or replica).

A rank that reports an error, or a host whose torchrun exits before its ranks ended, stops every host;
the blame goes to the rank that died without a word first, else to the earliest error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from pictl import errors as E
from pictl.cluster.commands import master_port, supervised, worker_env
from pictl.cluster.culprit import await_culprit
from pictl.cluster.fleet import Fleet
from pictl.cluster.stream import LineKeeper, ProcessStream
from pictl.cluster.transport import RemoteProcess
from pictl.events import EventSink
from pictl.inventory import Host
from pictl.jobs.training.telemetry import TrainTelemetry
from pictl.planning.placement import NodePlan
from pictl.run.launch import torchrun_argv
from remote import protocol as P

MODULE = "remote.training.train"
REFERENCE_SPEC = "reference-spec.json"


class Processes:
    """What a job started, so that whatever happens every one of them is stopped."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.live: list[RemoteProcess] = []

    async def start(self, host: Host, argv: list[str], *, cwd: str, env: dict[str, str]) -> RemoteProcess:
        proc = await self.fleet[host.name].start(argv, cwd=cwd, env=env)
        self.live.append(proc)
        return proc

    async def stop_all(self) -> None:
        live, self.live = self.live, []
        await asyncio.gather(*(p.stop() for p in live), return_exceptions=True)


def _failure(tail: deque[str], record: dict[str, Any] | None, host: str, rank: int | None, what: str,
             ) -> E.PictlError:
    message = (record or {}).get("message") or (list(tail) or ["no output"])[-1]
    if record is not None and record.get("kind") == "bad_input":
        return E.ConfigError(message)
    where = f"host '{host}'" + (f" rank {rank}" if rank is not None else "")
    return E.RunFailed(f"{what} failed on {where}: {message}")


async def run_reference(procs: Processes, node: NodePlan, run_dir: str, keep: LineKeeper, sink: EventSink,
                        threads: int) -> dict[int, float]:
    """The same job as `single` for its first steps, on the first host: the losses every mode must match."""
    host = node.host
    losses: dict[int, float] = {}
    errors: list[dict[str, Any]] = []

    def on_record(record: dict[str, Any]) -> bool:
        if record[P.KEY_EVENT] == P.TRAIN_STEP and "loss" in record:
            losses[int(record["step"])] = float(record["loss"])
        elif record[P.KEY_EVENT] == P.ERROR:
            errors.append(record)
        return record[P.KEY_EVENT] in (P.TRAIN_STEP, P.ERROR)

    argv = supervised(host, [host.python_path(), "-m", MODULE, "--spec", REFERENCE_SPEC], "pgid-reference")
    proc = await procs.start(host, argv, cwd=run_dir, env=worker_env(host, threads))
    stream = ProcessStream("reference", host.name, keep, sink, on_record)
    rc = await stream.consume(proc)
    if rc != 0 or errors:
        raise _failure(stream.tail, errors[0] if errors else None, host.name, None, "the single-mode reference")
    return losses


async def run_ranks(procs: Processes, nodes: list[NodePlan], run_id: str, keep: LineKeeper, sink: EventSink,
                    tel: TrainTelemetry, threads: int) -> None:
    """torchrun on every host until each rank has ended (or one failed: then every host is stopped)."""
    master = nodes[0].host
    port = await master_port(procs.fleet[master.name], None)
    failed = asyncio.Event()
    tail: deque[str] = deque(maxlen=20)
    started: dict[str, RemoteProcess] = {}
    ended: dict[str, int] = {}  # host -> torchrun's exit status, once its output is read to the end
    for node in nodes:
        argv = supervised(node.host, torchrun_argv(node, nnodes=len(nodes), master=master, master_port=port,
                                                   spec_path=P.SPEC_FILE, run_id=run_id, module=MODULE),
                          "pgid-torchrun")
        started[node.host.name] = await procs.start(node.host, argv, cwd=node.host.run_dir(run_id),
                                                    env=worker_env(node.host, threads))

    async def watch(node: NodePlan) -> None:
        name = node.host.name

        def seen(record: dict[str, Any]) -> bool:
            tel.apply(name, record)
            if record[P.KEY_EVENT] == P.ERROR:
                failed.set()
            return True

        rc = ended[name] = await ProcessStream(name, name, keep, sink, seen, tail).consume(started[name])
        if rc != 0 and not all(tel.ranks.get(r) and tel.ranks[r].end for r in node.ranks):
            failed.set()

    watchers = [asyncio.create_task(watch(n)) for n in nodes]
    waiter = asyncio.create_task(failed.wait())
    try:
        while not failed.is_set() and not all(w.done() for w in watchers):
            await asyncio.wait([*watchers, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    crashed = next((w.exception() for w in watchers if w.done() and not w.cancelled() and w.exception()), None)
    if crashed is not None:  # reading a host's output failed (a bug): never a job that looks complete
        await procs.stop_all()
        await asyncio.gather(*watchers, return_exceptions=True)
        raise crashed
    if not failed.is_set():
        return
    culprit = await await_culprit(
        ended, {n.host.name: n.ranks for n in nodes},
        reported=lambda r: bool(tel.ranks.get(r) and (tel.ranks[r].end or tel.ranks[r].error)),
        errored=lambda r: bool(tel.ranks.get(r) and tel.ranks[r].error))
    await procs.stop_all()
    await asyncio.gather(*watchers, return_exceptions=True)
    if culprit is not None:
        raise E.RunFailed(f"training failed on host '{culprit.host}' rank {culprit.rank}: {culprit.message}")
    first = tel.first_error()
    if first is not None:
        raise _failure(tail, first.error, first.host, first.rank, "training")
    raise E.RunFailed(f"training failed on host '{master.name}': torchrun exited before every rank finished")
