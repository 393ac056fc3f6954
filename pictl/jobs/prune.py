"""`pictl prune`: prune, fine-tune and evaluate a model on the controller or on one host.

The work is `remote.pruning.prune` (torch, torch-pruning), started as a process whose events
stream back like a run's. Everything lands in a job directory:

    <data dir>/prunes/<id>/
        spec.json, events/prune.jsonl, logs/prune.log     (a run directory's layout: `RunRecord`)
        model.safetensors      the artifact (`pictl run --model` takes it)
        summary.json           written atomically at the end, also when the job failed

With `--on HOST` the job holds that host's lease (as a run does: it is the host's whole
CPU for a while) and runs in `<workdir>/runs/prune-<id>`, where `pictl stop` finds its
process group (base weights sent there first); the artifact is fetched back, written
under a temporary name and renamed. The host's copy is removed afterwards.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.cluster.commands import worker_env
from pictl.cluster.jobs import HostJob, to_the_end
from pictl.cluster.stream import ProcessStream
from pictl.cluster.transport import Transport, transport_for
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster, Host
from pictl.job_summaries import AccuracyPoint, PrunedWidths, PruneSummary, Status
from pictl.jobs.prune_options import PruneOptions
from pictl.records.runs import RunRecord, default_runs_root, write_bytes_atomic
from pictl.summary import validation_problem
from pictl.summary_figures import Open
from pictl.summary_models import RunError
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.job_records import PruneAccuracy, PruneDone
from remote.floor.records import Record
from remote.floor.run_records import Error

ARTIFACT_NAME = "model.safetensors"
PRUNE_MODULE, PRUNE_ARGS = entries.PRUNE.module, ("--spec", "spec.json")


class NotReady(E.PictlError):
    """The machine chosen to prune on lacks the packages."""

    exit_code = E.EXIT_NOT_READY


def default_prunes_root() -> Path:
    return default_runs_root().parent / "prunes"


class PruneSession:
    """One pruning job; `await run()` returns its summary (also written to summary.json)."""

    def __init__(self, options: PruneOptions, *, cluster: Cluster | None = None, on_host: str | None = None,
                 root: Path | None = None, on_event: EventSink | None = None, wait: bool = False) -> None:
        self.options = options
        self.wait = wait
        """`--on HOST` held by another run: wait for it (True) or refuse at once (HostBusy)."""
        self.host: Host | None = cluster.host(on_host) if on_host and cluster else None
        if on_host and self.host is None:
            raise E.ConfigError(f"--on {on_host}: no inventory to find the host in")
        self.job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-prune-{secrets.token_hex(2)}"
        self.dir = (root or default_prunes_root()) / self.job_id
        self._sink = on_event or (lambda _e: None)
        self.done: PruneDone | None = None
        self.error: Error | None = None
        self.accuracy: list[AccuracyPoint] = []
        self._tail: list[str] = []
        self.summary: PruneSummary | None = None
        """The job's summary once it ended, failed or not (None before)."""
        self.record: RunRecord | None = None

    def _phase(self, message: str) -> None:
        self._sink(Phase("prune", message))

    @property
    def write_error(self) -> E.RecordWriteFailed | None:
        """The record could not be written whole (a full disk): the result stands, the record is incomplete."""
        return self.record.write_error if self.record is not None else None

    async def run(self) -> PruneSummary:
        """Prune; the job's summary, or the error that ended it (`summary` then holds the failed job's)."""
        await self._run()
        assert self.summary is not None  # _run returned: the record closed with the summary
        return self.summary

    async def _run(self) -> None:
        self.record = RunRecord(self.dir.parent, self.job_id)
        where = self.host.name if self.host else "controller"
        status: Status = "failed"
        ending: dict[str, Any] = {}
        """What the job's end adds to its summary: the artifact and its figures, or the error that ended it."""
        started = time.time()
        try:
            artifact = await (self._on_host() if self.host else self._local())
            assert self.done is not None
            ending = {"artifact": str(artifact), **PrunedArtifact.reported(self.done.meta, where).comparison()}
            status = "ok"
        except asyncio.CancelledError:
            status = "interrupted"
            raise E.Interrupted("interrupted: the pruning job was stopped") from None
        except E.PictlError as exc:
            ending = {"error": RunError(type=type(exc).__name__, message=str(exc))}
            raise
        finally:
            for stale in self.dir.glob(".*.tmp"):  # a write cut short by a stop: not a result
                stale.unlink(missing_ok=True)
            self.summary = PruneSummary(status=status, job_id=self.job_id, job_dir=str(self.dir), where=where,
                                        options=self.options.model_dump(), **ending,
                                        duration_s=round(time.time() - started, 2), accuracy_trace=self.accuracy)
            self.record.finish(self.summary.written())

    async def _local(self) -> Path:
        import importlib.util

        if importlib.util.find_spec("torch_pruning") is None or importlib.util.find_spec("timm") is None:
            raise NotReady("this controller has no torch, timm and torch-pruning to prune with: "
                           "install pictl[remote] here, or run the job on a host with --on HOST")
        o = self.options
        spec = o.spec(out=str(self.dir / ARTIFACT_NAME),
                      checkpoint=str(Path(o.checkpoint).expanduser().resolve()) if o.checkpoint else None,
                      data_path=str(Path(o.data_path or "").expanduser()))
        (self.dir / "spec.json").write_text(spec.to_json())
        controller = Host(name="controller", transport="local", workdir=str(self.dir))
        self._phase(f"pruning {o.model} on the controller: {o.importance} importance, ratio {o.ratio}, "
                    f"{o.epochs} fine-tuning epoch(s)")
        env = {k: v for k, v in worker_env(controller, o.threads or (os.cpu_count() or 1)).items()
               if k != "PYTHONPATH"}  # the controller runs its own installed `remote`, not pushed code
        await self._execute(controller, lambda stream: self._locally(transport_for(controller), env, stream))
        return self.dir / ARTIFACT_NAME

    async def _on_host(self) -> Path:
        assert self.host is not None
        h, o = self.host, self.options
        job = HostJob([h], f"prune-{self.job_id}")
        t, remote_dir = job.transport(h), job.run_dir(h)
        try:
            await job.hold(wait=self.wait, on_wait=lambda message: self._phase(message))
            await job.push()
            await job.stage({}, "cannot prepare the job")
            base = None
            if o.checkpoint:
                src = Path(o.checkpoint).expanduser()
                base = f"base{src.suffix}"
                self._phase(f"sending the base weights ({src.stat().st_size / 1e6:.0f} MB) to {h.name}")
                await t.put_bytes(src.read_bytes(), f"{remote_dir}/{base}")
            spec = o.spec(out=ARTIFACT_NAME, checkpoint=base, data_path=o.data_path or "")
            (self.dir / "spec.json").write_text(spec.to_json())
            await t.put_bytes(spec.to_json().encode(), f"{remote_dir}/spec.json")
            self._phase(f"pruning {o.model} on {h.name}: {o.importance} importance, ratio {o.ratio}, "
                        f"{o.epochs} fine-tuning epoch(s)")
            await self._execute(h, lambda stream: job.run_module(h, PRUNE_MODULE, PRUNE_ARGS, stream,
                                                                  threads=o.threads or 1, pgid_file="pgid-prune"))
            data = await t.get_bytes(f"{remote_dir}/{ARTIFACT_NAME}")
            target = self.dir / ARTIFACT_NAME
            try:
                write_bytes_atomic(target, data)
            except OSError as exc:  # a full disk: the pruned model is the result, and it is not kept
                raise E.RecordWriteFailed(f"the pruned artifact could not be written to {target}: "
                                          f"{exc.strerror or exc}") from None
            self._phase(f"artifact fetched from {h.name} ({len(data) / 1e6:.1f} MB)")
            return target
        finally:
            await to_the_end(job.close())

    async def _locally(self, t: Transport, env: dict[str, str], stream: ProcessStream) -> int:
        """On the controller, in the job's directory (no job: nothing to lease; stopped if we are)."""
        proc = await t.start([t.host.python_path(), "-m", PRUNE_MODULE, *PRUNE_ARGS], cwd=str(self.dir), env=env)
        try:
            return await stream.consume(proc)
        except asyncio.CancelledError:
            await asyncio.shield(proc.stop())
            raise

    async def _execute(self, host: Host, run: Callable[[ProcessStream], Awaitable[int]]) -> None:
        """The pruning process, run by `run` (on the controller or as the host job's), its lines read
        through one stream; its result, or the error that names why it failed."""

        def on_record(record: Record) -> bool:
            match record:
                case PruneDone():
                    self.done = record
                case Error():
                    self.error = record
                case PruneAccuracy():
                    self.accuracy.append(AccuracyPoint(phase=record.phase, epoch=record.epoch, top1=record.top1))
            return True

        assert self.record is not None  # (opened first thing in `_run`)
        stream = ProcessStream("prune", host.name, self.record, self._sink, on_record)
        rc = await run(stream)
        self._tail = [line.removeprefix("prune: ") for line in stream.tail]
        if rc == 0 and self.done is not None:
            return
        error = (self.error.message if self.error else None) or (self._tail or ["no output"])[-1]
        if rc == P.EXIT_BAD_INPUT:
            raise E.ConfigError(error)
        raise E.RunFailed(f"{host.name}: pruning failed: {error}")


class PrunedTop1(Open):
    """The artifact's top-1 figures (`ArtifactMeta.accuracy`): before pruning, right after it, per fine-tuning
    epoch, and the kept best."""

    before: float | None = None
    pruned: float | None = None
    epochs: list[float] = []
    best: float | None = None
    best_epoch: int | None = None


class PrunedArtifact(Open):
    """What the pruning process reported of its artifact (`PruneDone.meta`: `remote.floor.artifact_meta.ArtifactMeta`),
    read once: the figures the job's summary takes from it (its other keys pass through, unread)."""

    base_model: str
    ratio: float
    importance: str
    params_base: int
    params: int
    macs_base: float
    macs: float
    accuracy: PrunedTop1 = PrunedTop1()
    widths: PrunedWidths | None = None

    @classmethod
    def reported(cls, meta: dict[str, Any], where: str) -> PrunedArtifact:
        """`meta` as the process on `where` reported it; RunFailed naming the field it lacks or holds wrongly."""
        try:
            return cls.model_validate(meta)
        except ValidationError as exc:
            raise E.RunFailed(f"{where}: the pruning job's report of its artifact is not readable "
                              f"({validation_problem(exc)})") from None

    def comparison(self) -> dict[str, Any]:
        """The course's Part 3 columns that pruning alone decides (throughput comes from runs), as the job's
        summary names them."""
        acc = self.accuracy
        return {"base_model": self.base_model, "ratio": self.ratio, "importance": self.importance,
                "params_base": self.params_base, "params": self.params, "macs_base": self.macs_base, "macs": self.macs,
                "top1_before": acc.before, "top1_pruned": acc.pruned, "top1_epochs": acc.epochs, "top1": acc.best,
                "best_epoch": acc.best_epoch, "widths": self.widths}
