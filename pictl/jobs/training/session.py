"""One training job, start to end, as a straight line:

    hosts      connect once, hold every host's lease, push the code (or borrow them from the sweep that holds
               them for all of its jobs: `hosts=`)
    balance    under `balanced` pipeline training: the split from the hosts' cost profiles
    stage      the spec and owner file in every host's run directory (orphans of vanished runs swept)
    reference  the same job as `single` for its first steps on the first host (cached): the losses the
               job's own first steps must match (skipped for `single`, which is the reference: one that
               ends well is cached as such)
    train      torchrun on every host; every rank's lines streamed, folded and recorded
    collect    the trained model's logits, and the ranks' weights merged into one model file
    summary    losses, top-1, samples/s, time per category and rank, the agreement verdict

Whatever happens (bad input, a failing rank, Ctrl-C), every process is stopped, each host confirms,
its run directory goes, the leases are released, and the job's `summary.json` says how it ended.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.jobs import HostJob
from pictl.cluster.push import local_tree, manifest_digest
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.job_summaries import EvalPoint, LossAgreement, TrainPrediction, TrainSummary
from pictl.jobs.ending import Ending, RankJob
from pictl.jobs.training.checkpoint import MODEL_FILE, merge_parts, trained_meta
from pictl.jobs.training.launch import REFERENCE_SPEC, run_ranks, run_reference
from pictl.jobs.training.options import AMP_LOSS_TOLERANCE, LOSS_TOLERANCE, TrainOptions
from pictl.jobs.training.split import balanced_points
from pictl.jobs.training.telemetry import TrainTelemetry, agreement, link_figures
from pictl.jobs.training.waterfall import train_waterfall
from pictl.planning.placement import NodePlan, place_stages
from pictl.records.cache import JsonCache, cache_root
from pictl.records.runs import RunRecord, default_runs_root
from pictl.records.tracker_writers import check_trackers, track_record
from pictl.records.trackers import train_series
from pictl.run.hosts import HeldHosts
from pictl.summary_figures import Open
from remote.floor import protocol as P
from remote.floor.spec import TrainSpec
from remote.floor.wire import parse_wire

SUMMARY_SCHEMA = 1


def default_trains_root() -> Path:
    """Training jobs live beside the runs (`.../pictl/trains/<id>/`), in a run directory's layout."""
    return default_runs_root().parent / "trains"


def placement(cluster: Cluster, options: TrainOptions) -> list[NodePlan]:
    """One rank on the first host for `single`; else stages (or replicas) over the hosts in order."""
    return place_stages(cluster, 1 if options.mode == "single" else options.stages)


class ReferenceLosses(Open):
    """The `single` reference's first losses as this job keeps them (the cache holds the same, less `reused`):
    read by field as kept (`Open.view`), step numbers as strings."""

    host: Any = None
    losses: Any = {}
    measured_at: Any = None
    from_job: Any = None
    """The job that measured it, where a `single` job was kept as the reference."""
    reused: Any = None


class TrainSession(RankJob):
    """One training job; `await run()` returns its summary (also written to summary.json)."""

    def __init__(self, cluster: Cluster, options: TrainOptions, *, on_event: EventSink | None = None,
                 root: Path | None = None, wait: bool = False, hosts: HeldHosts | None = None) -> None:
        self.cluster, self.options, self.wait = cluster, options, wait
        self.held = hosts
        """The hosts the training sweep this job is one of holds, borrowed (None: the job connects, leases and
        pushes itself); closing the job stops its processes and removes its run directories, and leaves them held."""
        self.nodes = placement(cluster, options)  # ConfigError: nothing started yet
        self.trackers = list(options.track or cluster.track)
        check_trackers(self.trackers)
        self.job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-train-{options.mode}-{secrets.token_hex(2)}"
        self.root = root or default_trains_root()
        self.sink = on_event or (lambda _e: None)
        self.telemetry = TrainTelemetry()
        self.summary: TrainSummary | None = None
        """The job's summary once it ended, failed or not (None when nothing started)."""
        self.record: RunRecord | None = None
        self._reference: dict[str, Any] | None = None
        self._fp32_reference: dict[int, float] | None = None
        """Under --amp, the fp32 single reference's losses when one is cached (for the report)."""
        self._collected: dict[str, Any] = {}
        self._prediction: dict[str, Any] | None = None

    def _phase(self, name: str, message: str) -> None:
        self.sink(Phase(name, message))

    @property
    def write_error(self) -> E.RecordWriteFailed | None:
        """The record could not be written whole (a full disk): the result stands, the record is incomplete."""
        return self.record.write_error if self.record is not None else None

    async def run(self) -> TrainSummary:
        """Run the job; its summary, or the error that ended it (`summary` then holds the failed job's)."""
        await self._run()
        assert self.summary is not None  # _run returned: the record closed with the summary
        return self.summary

    async def _run(self) -> None:
        hosts = [n.host for n in self.nodes]
        job = self.held.lend(self.job_id, hosts) if self.held is not None else HostJob(hosts, self.job_id)
        self._tree = self.held.tree if self.held is not None else local_tree()
        self._code = manifest_digest(self._tree)  # once per job: it reads the whole tree
        self._ended: dict[str, Any] | None = None
        """The summary of a job that ran through its phases (the check reads it; the record keeps it)."""
        await self._run_to_the_end(job)

    async def _phases(self, job: HostJob) -> None:
        await self._hosts(job, self._tree)
        spec = await self._balance(job, self._code)
        self._open_record(spec)
        await job.stage({P.SPEC_FILE: spec.to_json().encode()}, "cannot prepare the job")
        if self.options.mode != "single" and self.options.check_steps:
            await self._reference_losses(job, self._code)
        await self._train(job)
        await self._collect(job)

    def _verify(self, ending: Ending) -> None:
        self._keep_as_reference(self._code)
        self._ended = self._summarize("ok", ending.started, None)
        self._check(self._ended)

    async def _close(self, ending: Ending) -> None:
        assert self.record is not None
        error = ending.error.model_dump(exclude_none=True) if ending.error else None
        summary = self._ended or self._summarize(ending.status, ending.started, error)
        if error and not TrainSummary.view(summary).error:
            summary.update(status="failed", error=error)
        self.record.finish(summary)
        self.summary = TrainSummary.model_validate(summary)
        if ending.status != "interrupted" and self.trackers:  # a second Ctrl-C must not wait on a tracker
            await self._track(self.record.path, self.summary)

    async def _hosts(self, job: HostJob, tree: dict[str, bytes]) -> None:
        """Every host held and holding the code; nothing to do for a job whose sweep holds them."""
        if self.held is not None:
            return
        await job.hold(wait=self.wait, on_wait=lambda message: self._phase("lease", message))
        sent = await job.push(tree)
        self._phase("push", f"{sent} changed file(s) pushed to {len(self.nodes)} host(s)")

    async def _balance(self, job: HostJob, code: str) -> TrainSpec:
        """The spec the hosts run: under `balanced` pipeline training, with the split the cost profiles give."""
        o = self.options
        if o.policy != "balanced" or o.mode != "pipeline":
            return o.spec(self.job_id)
        stage_hosts = [n.host.name for n in self.nodes for _ in n.ranks]
        self._phase("balance", f"cost profiles of {len(set(stage_hosts))} host(s)")
        points, self._prediction = await balanced_points(job.fleet, stage_hosts, o, code)
        stage_ms = TrainPrediction.view(self._prediction).stage_ms
        self._phase("balance", f"split {', '.join(points)}: predicted " + " / ".join(
            f"{ms:.1f}" for ms in stage_ms) + " ms per microbatch (forward and backward)")
        return o.spec(self.job_id, split=points)

    def _open_record(self, spec: TrainSpec) -> None:
        o = self.options
        self.record = RunRecord(self.root, self.job_id)
        self.record.write_config({"options": o.model_dump(), "spec": dataclasses.asdict(spec),
                                  "placement": [{"host": n.host.name, "ranks": list(n.ranks)} for n in self.nodes],
                                  "hosts_file": str(self.cluster.source),
                                  "hosts_held_by": self.held.holder if self.held is not None else None})

    async def _train(self, job: HostJob) -> None:
        """torchrun on every host, every rank's lines folded into the telemetry and kept in the record."""
        o = self.options
        assert self.record is not None
        self._phase("train", f"{o.mode}{' (' + o.schedule + ')' if o.mode == 'pipeline' else ''}: "
                    f"{len(self.telemetry.ranks) or sum(n.nproc for n in self.nodes)} rank(s) on "
                    f"{len(self.nodes)} host(s), batch {o.batch_size} as {o.chunks} microbatch(es)")
        await run_ranks(job, self.nodes, self.record, self.sink, self.telemetry, o.threads)

    def _check(self, summary: dict[str, Any]) -> None:
        """The job's first losses against the reference's: beyond the tolerance, the job failed (its summary
        says so), unless the check is only reported (a lossy wire's)."""
        found = TrainSummary.view(summary).agreement  # (the dict being built: viewed through its own model)
        check = found if isinstance(found, LossAgreement) else LossAgreement.view(found)
        # (enforced None: not said, so enforced; only a lossy wire's check says False)
        if found and not check.passed and check.enforced is not False:
            summary["status"] = "failed"
            raise E.OutputMismatch(f"training: the first {check.steps} step(s)' losses differ from a single "
                                   f"run's by up to {check.max_rel_diff} (relative; tolerance "
                                   f"{check.tolerance})")

    async def _track(self, path: Path, summary: TrainSummary) -> None:
        await track_record(self.trackers, path, lambda: train_series(summary),
                           lambda message: self._phase("track", message))

    def _reference_key(self, code: str, *, amp: bool | None = None,
                       ) -> tuple[JsonCache, str, TrainSpec]:
        """Where the `single` reference of this job is cached, its key, and the spec that measures it: at the
        job's own precision (an --amp job is held to single under --amp: bf16 moves a CNN's loss by several
        per cent from fp32's, with every mode computing the same), or at `amp`'s when given."""
        o, node = self.options, self.nodes[0]
        spec = o.spec(self.job_id, mode="single", stop_after=o.check_steps)
        # What a single run does not depend on is left out, so one reference serves every mode and schedule;
        # and it reads its images and keeps its activations plainly: a job that prefetches or recomputes them
        # is held to the plain losses.
        spec = dataclasses.replace(spec, amp=o.amp if amp is None else amp, eval_images=0, check_images=0,
                                   save=False, break_rank=None, schedule="gpipe", policy="equal", workers=0,
                                   checkpoint_activations=False, wire="fp32")
        fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "run_id"}
        key = JsonCache.key({"spec": fields, "host": [node.host.name, node.host.address, node.host.python_path()],
                             "code": code})
        return JsonCache(cache_root() / "train-reference"), key, spec

    def _keep_as_reference(self, code: str) -> None:
        """A `single` job that ended well is the reference of every later job with its settings (a sweep's
        pipeline and ddp jobs then start no reference run of their own). Not with a broken rank, and not
        when an evaluation came before the last checked step (it runs between the reference's steps)."""
        o, tel = self.options, self.telemetry
        per_epoch = (tel.start.steps_per_epoch if tel.start else None) or 0
        if (o.mode != "single" or not o.check_steps or o.break_rank is not None or o.checkpoint_activations
                or (o.eval_images and per_epoch < o.check_steps)
                or any(step not in tel.losses for step in range(1, o.check_steps + 1))):
            return
        cache, key, _ = self._reference_key(code)
        if cache.get(key) is None:
            losses = {str(step): tel.losses[step] for step in range(1, o.check_steps + 1)}
            cache.put(key, {"host": self.nodes[0].host.name, "losses": losses, "measured_at": time.time(),
                            "from_job": self.job_id})

    async def _reference_losses(self, job: HostJob, code: str) -> None:
        """The `single` reference's first losses: cached per job, host and code; else measured now."""
        node = self.nodes[0]
        cache, key, spec = self._reference_key(code)
        o = self.options
        cached = cache.get(key)
        if o.amp:
            fp32_cache, fp32_key, _ = self._reference_key(code, amp=False)
            found = fp32_cache.get(fp32_key)
            self._fp32_reference = ({int(k): v for k, v in ReferenceLosses.view(found).losses.items()} if found
                                    else None)
        if cached is not None:
            self._reference = {**cached, "reused": True}
            self._phase("reference", f"single-mode reference reused ({len(cached['losses'])} step(s) on "
                                     f"{node.host.name})")
            return
        self._phase("reference", f"single-mode reference: {o.check_steps} step(s) on {node.host.name}")
        await job.transport(node.host).put_bytes(spec.to_json().encode(), f"{job.run_dir(node.host)}/{REFERENCE_SPEC}")
        assert self.record is not None
        losses = await run_reference(job, node, self.record, self.sink, o.threads)
        self._reference = {"host": node.host.name, "losses": {str(k): v for k, v in losses.items()},
                           "measured_at": time.time(), "reused": False}
        cache.put(key, {k: v for k, v in self._reference.items() if k != "reused"})

    async def _collect(self, job: HostJob) -> None:
        """The trained model's logits, and (when saved) its weights merged into one file."""
        assert self.record is not None
        tel, o = self.telemetry, self.options
        if tel.outputs is not None:
            host, outputs = tel.outputs
            data = await job.transport(host).get_bytes(f"{job.run_dir(self.cluster.host(host))}/{outputs.logits_file}")
            saved = self.record.save_bytes(P.LOGITS_FILE_TRAINED, data)
            self._collected["trained_logits"] = str(saved) if saved else None
        parts = [(r.host, r.end.part_file) for r in tel.ranks.values() if r.end and r.end.part_file]
        if not (o.save and parts):
            return
        blobs = [await job.transport(h).get_bytes(f"{job.run_dir(self.cluster.host(h))}/{f}") for h, f in parts]
        heads: dict[str, int] = {}
        for r in tel.ranks.values():
            heads.update((r.end.heads if r.end else None) or {})
        start = tel.start
        evals = [EvalPoint.view(e) for e in tel.evals]
        accuracy: dict[str, Any] = {"best": evals[-1].top1 if evals else None, "epochs": [e.top1 for e in evals]}
        dropped = o.learned_wire and not o.keep_compressor
        if dropped:  # the stages learned around a compressor this artifact leaves out: not its top-1
            accuracy = {"best": None, "epochs": [], "note": f"trained through --wire {o.wire}; the compressor "
                        "pair is not in this artifact, so the job's top-1 is not this model's"}
        meta = trained_meta(o.model, (start.num_classes if start else None) or o.classes or 10,
                            dict((start.model_kwargs if start else None) or o.model_args), heads, o.data, accuracy)
        if o.learned_wire and o.keep_compressor:  # each pair's cut, in order (its tensors: `wire_pairs.N.*`)
            wire = parse_wire(o.wire)
            meta.compressors = [{"at": cut, "wire": str(wire.at(cut))} for cut in self._split_points()
                                if wire.at(cut).learned]
        info = merge_parts(blobs, meta, self.record.path / MODEL_FILE)
        if o.learned_wire:  # (which is right for serving: docs/training.md, "A compressed link")
            info["compressor"] = "removed" if dropped else "kept"
        self._collected["checkpoint"] = info
        self._phase("collect", f"trained model: {info['path']} ({info['params']:,} parameters)")

    def _summarize(self, status: str, started: float, error: dict[str, Any] | None) -> dict[str, Any]:
        o, tel = self.options, self.telemetry
        losses = [{"step": s, "loss": tel.losses[s]} for s in sorted(tel.losses)]
        tolerance = AMP_LOSS_TOLERANCE if o.amp else LOSS_TOLERANCE
        check = None
        if self._reference is not None:
            kept = ReferenceLosses.view(self._reference)
            reference = {int(k): v for k, v in kept.losses.items()}
            check = {**agreement(tel.losses, reference, o.check_steps, tolerance),
                     "reference_host": kept.host, "reference_reused": kept.reused, "reference_job": kept.from_job,
                     "against": "single, bf16 autocast" if o.amp else "single, fp32"}
            if o.lossy_wire:  # a lossy wire moves the loss by design: how far is reported, never a failure
                check.update(enforced=False, against=f"{check['against']} (lossy wire {o.wire}: reported)")
            if o.amp and self._fp32_reference:  # how far bf16 moved the loss: reported, never a failure
                fp32 = agreement(tel.losses, self._fp32_reference, o.check_steps, AMP_LOSS_TOLERANCE)
                check["vs_fp32"] = {k: fp32[k] for k in ("steps", "max_rel_diff", "per_step")}
        start = tel.start
        summary: dict[str, Any] = {
            "kind": "train", "schema": SUMMARY_SCHEMA, "status": status, "job_id": self.job_id,
            "job_dir": str(self.record.path) if self.record else None, "mode": o.mode,
            "schedule": o.schedule if o.mode == "pipeline" else None, "stages": len(tel.ranks) or None,
            "placement": [{"host": n.host.name, "ranks": list(n.ranks)} for n in self.nodes],
            "model": o.model, "model_args": o.model_args, "data": o.data, "amp": o.amp,
            "batch_size": o.batch_size, "chunks": o.chunks, "microbatch": o.batch_size // o.chunks,
            "steps": start.steps if start else None, "steps_done": max(tel.losses, default=0),
            "steps_per_epoch": start.steps_per_epoch if start else None, "lr": o.lr, "optimizer": o.optimizer,
            "threads": o.threads, "workers": o.workers, "checkpoint_activations": o.checkpoint_activations,
            "lora": o.lora or None,
            "wire": o.wire, "error_feedback": o.error_feedback if "lowrank" in o.wire else None,
            "links": link_figures(tel.ranks, self._split_points(), parse_wire(o.wire)) if o.mode == "pipeline" else [],
            "samples_per_s": tel.samples_per_s(o.batch_size),
            "losses": losses, "evals": tel.evals, "top1": EvalPoint.view(tel.evals[-1]).top1 if tel.evals else None,
            "policy": o.policy if o.mode == "pipeline" else None, "split_points": self._split_points(),
            "prediction": self._prediction, "breakdown": tel.breakdown(), "agreement": check, **self._collected,
            "started_at": started, "duration_s": round(time.time() - started, 2),
        }
        summary["waterfall"] = train_waterfall(summary)
        if "checkpoint" in self._collected:
            summary["run_with"] = f"pictl run --model {self._collected['checkpoint']['path']}"
        if error:
            summary["error"] = error
        return summary

    def _split_points(self) -> list[str]:
        """Where stages 2..N began, as the ranks reported their modules."""
        ranks = self.telemetry.ranks
        return [ranks[r].modules[0] for r in sorted(ranks)[1:] if ranks[r].modules] if self.options.mode == "pipeline" \
            else []
