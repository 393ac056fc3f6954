"""One generation job, start to end, as a straight line:

    hosts     connect once, hold every host's lease
    model     the model's shape (a directory's config.json read from the first host, or the size given), the
              stages' first layers checked against it, and each stage's weights against its host's free memory:
              bad input is refused here, before any process starts; then the code is pushed
    stage     the spec in every host's run directory
    serial    every layer on the first host, the same prompts, the same greedy decoding (left out, and said,
              when the whole model does not fit that host)
    pipeline  torchrun on every host, one stage per rank
    summary   token ids against the serial run's, tokens per second, time to the first token, inter-token
              latency, each stage's time per token, the decoding waterfall

Whatever happens (bad input, a failing rank, Ctrl-C), every process is stopped, each host confirms, its run
directory goes, the leases are released, and the job's `summary.json` says how it ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from collections import deque
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.cluster.check import PackageVersions
from pictl.cluster.commands import master_port
from pictl.cluster.hoststate import read_facts
from pictl.cluster.jobs import HostJob
from pictl.cluster.push import local_tree
from pictl.cluster.ranks import RankLaunch, RankWatch
from pictl.cluster.stream import ProcessStream
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster, Host
from pictl.jobs.ending import Ending, RankJob
from pictl.jobs.generation.figures import (
    GenerateSummary,
    Pace,
    Status,
    TokenFile,
    agreement,
    first_difference,
    pace,
    stage_figures,
    waterfall,
)
from pictl.jobs.generation.options import GenerateOptions, ModelShape, built_shape, shape_of, stage_starts
from pictl.planning.placement import NodePlan, place_stages
from pictl.records.runs import RunRecord, default_runs_root
from pictl.summary_models import HostState, RunError
from remote.floor import entries
from remote.floor import protocol as P
from remote.floor.job_records import GenEnd, GenStart
from remote.floor.records import Record
from remote.floor.run_records import Error
from remote.floor.spec import GenerateSpec

MODULE = entries.GENERATE.module
SERIAL_TOKENS = "serial-tokens.json"
SERIAL_FP32_TOKENS = "serial-fp32-tokens.json"
TOKENS = "tokens.json"
MEMORY_HEADROOM = 1.25
"""A stage needs its weights (fp32) this many times over, plus `RUNTIME_MB`: the KV caches, activations and
allocator slack of a few sequences (measured: a 0.5B model's stage peaked at 1.1-1.2x its weights)."""
RUNTIME_MB = 600
"""torch, transformers and the interpreter, before any weight (measured: 0.76 GB resident on x86-64)."""


def default_generations_root() -> Path:
    """Generation jobs live beside the runs (`.../pictl/generations/<id>/`), in a run directory's layout."""
    return default_runs_root().parent / "generations"


class Ranks:
    """What the ranks (or the serial run) said: each stage's start and end, the first error."""

    def __init__(self) -> None:
        self.starts: dict[int, GenStart] = {}
        self.ends: dict[int, GenEnd] = {}
        self.errors: list[tuple[str, Error]] = []

    def apply(self, host: str, record: Record) -> bool:
        match record:
            case GenStart():
                self.starts[record.stage] = record
            case GenEnd():
                self.ends[record.stage] = record
            case Error():
                self.errors.append((host, record))
        return isinstance(record, GenStart | GenEnd | Error)


def _failure(errors: list[tuple[str, Error]], tail: deque[str], host: str, what: str) -> E.PictlError:
    if errors:
        where, record = errors[0]
        if record.kind == "bad_input":
            return E.ConfigError(record.message)
        return E.RunFailed.on(where, record.rank, what, record.message, tail)
    return E.RunFailed.on(host, None, what, (list(tail) or ["no output"])[-1], tail)


class GenerateSession(RankJob):
    """One generation job; `await run()` returns its summary (also written to summary.json)."""

    def __init__(self, cluster: Cluster, options: GenerateOptions, *, on_event: EventSink | None = None,
                 root: Path | None = None, wait: bool = False) -> None:
        self.cluster, self.options, self.wait = cluster, options, wait
        if options.model is not None and not PurePosixPath(options.model).is_absolute():
            raise E.ConfigError(f"--model {options.model}: give the model directory's absolute path on the hosts")
        self.nodes: list[NodePlan] = place_stages(cluster, options.stages)  # ConfigError: nothing started yet
        self.shape: ModelShape | None = None
        self.split: list[int] = []
        if options.model is None:  # a built model's shape is known here: a bad cut is refused before any connection
            self.shape = built_shape(options)
            self.split = stage_starts(options, self.shape, options.label)
        self.job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-gen-s{options.stages}-{secrets.token_hex(2)}"
        self.root = root or default_generations_root()
        self.sink = on_event or (lambda _e: None)
        self.summary: GenerateSummary | None = None
        self.record: RunRecord | None = None
        self.serial_fits = True
        self._serial: tuple[Pace, list[list[int]]] | None = None
        self._serial_fp32: tuple[Pace, list[list[int]]] | None = None
        self._serial_engine: str | None = None
        self._pipeline: tuple[Pace, list[list[int]]] | None = None
        self._ranks = Ranks()
        self._stage_hosts = {rank: n.host.name for n in self.nodes for rank in n.ranks}

    @property
    def write_error(self) -> E.RecordWriteFailed | None:
        return self.record.write_error if self.record is not None else None

    def _phase(self, name: str, message: str) -> None:
        self.sink(Phase(name, message))

    async def run(self) -> GenerateSummary:
        await self._run()
        assert self.summary is not None
        return self.summary

    async def _run(self) -> None:
        await self._run_to_the_end(HostJob([n.host for n in self.nodes], self.job_id, kind="generate"))

    async def _phases(self, job: HostJob) -> None:
        await job.hold(wait=self.wait, on_wait=lambda message: self._phase("lease", message))
        spec = await self._model(job)  # (bad input refused before the code is pushed)
        sent = await job.push(local_tree())
        self._phase("push", f"{sent} changed file(s) pushed to {len(self.nodes)} host(s)")
        self._open_record(spec)
        await job.stage({P.SPEC_FILE: spec.to_json().encode()}, "cannot prepare the job")
        if self.serial_fits:
            self._serial = await self._serial_run(job, spec)
            if spec.numerics != "fp32":  # the bounded loss: the same prompts in fp32, beside the int8 run
                fp32 = dataclasses.replace(spec, numerics="fp32")
                self._serial_fp32 = await self._serial_run(job, fp32, SERIAL_FP32_TOKENS)
        await self._pipeline_run(job)

    def _verify(self, ending: Ending) -> None:
        self._check()

    async def _close(self, ending: Ending) -> None:
        assert self.record is not None
        self.summary = self._summarize(ending.status, ending.started, ending.error)
        self.record.finish(self.summary.written())

    # -- model ---------------------------------------------------------------------------------------------

    async def _model(self, job: HostJob) -> GenerateSpec:
        """The shape, the cuts and the memory check; the spec every stage runs."""
        o, first = self.options, self.nodes[0].host
        if o.model is not None:
            where = f"--model {o.model}"
            try:
                raw = await job.transport(first).get_bytes(f"{o.model.rstrip('/')}/config.json")
                config = json.loads(raw)
            except (E.TransportError, OSError) as exc:
                raise E.ConfigError(f"{where}: no config.json readable on host '{first.name}' ({exc})") from None
            except ValueError as exc:
                raise E.ConfigError(f"{where}/config.json on host '{first.name}': not JSON ({exc})") from None
            if not isinstance(config, dict):
                raise E.ConfigError(f"{where}/config.json on host '{first.name}': not a JSON object")
            self.shape = shape_of(config, f"{where}/config.json")
            self.split = stage_starts(o, self.shape, o.label)
        assert self.shape is not None
        if o.prompts is not None and (bad := max(t for p in o.prompts for t in p)) >= self.shape.vocab:
            raise E.ConfigError(f"--prompts: token id {bad} is outside {o.label}'s vocabulary "
                                f"(0..{self.shape.vocab - 1})")
        await self._memory(job)
        cuts = ", ".join(f"layer {c}" for c in self.split) or "none"
        self._phase("model", f"{o.label}: {self.shape.layers} decoder layers, {len(self.nodes)} host(s), stages "
                             f"begin at {cuts}")
        return o.spec(self.job_id, self.shape, self.split)

    async def _memory(self, job: HostJob) -> None:
        """Each host's stages against its available memory (refused when one does not fit), and transformers
        there (else NotReady, exit 6); whether the whole model fits the first host, for the serial run."""
        assert self.shape is not None
        shape, starts = self.shape, [0, *self.split, self.shape.layers]
        facts = await asyncio.gather(*(read_facts(job.transport(n.host)) for n in self.nodes))
        free = {f.host: HostState.view(f.state).mem_available_mb for f in facts}
        lacking = [f.host for f in facts if f.packages and not PackageVersions.view(f.packages).transformers]
        if lacking:
            raise E.NotReady(f"host '{lacking[0]}' has no transformers in its Python environment: `pictl provision` "
                             "installs the pinned stack")

        o = self.options
        prompts = o.prompt_ids(shape.vocab)
        # Every position the timed pass caches (the warm-up's caches are gone before it begins).
        positions = sum(len(p) for p in prompts) + len(prompts) * o.new_tokens

        def need_mb(first: int, end: int) -> float:
            """Weights (fp32, with headroom) and the KV caches of every sequence to its last token, and the
            runtime: the caches are what grows with --sequences and --new-tokens."""
            return (shape.stage_params(first, end) * 4 * MEMORY_HEADROOM
                    + shape.kv_bytes_per_position(end - first) * positions) / 2**20 + RUNTIME_MB

        for node in self.nodes:
            need = sum(need_mb(starts[r], starts[r + 1]) for r in node.ranks)
            have = free.get(node.host.name)
            if isinstance(have, int | float) and need > have:
                raise E.ConfigError(f"{o.label} does not fit host '{node.host.name}': its stage(s) "
                                    f"{', '.join(map(str, node.ranks))} need about {need:,.0f} MB (weights and KV "
                                    f"caches) and it has {have:,.0f} MB available (more stages or hosts, or fewer "
                                    "sequences or tokens)")
        whole, have = need_mb(0, shape.layers), free.get(self.nodes[0].host.name)
        self.serial_fits = not (isinstance(have, int | float) and whole > have)

    def _open_record(self, spec: GenerateSpec) -> None:
        self.record = RunRecord(self.root, self.job_id)
        self.record.write_config({"options": self.options.model_dump(), "spec": dataclasses.asdict(spec),
                                  "placement": self._placement(), "hosts_file": str(self.cluster.source)})

    def _placement(self) -> list[dict[str, Any]]:
        return [{"host": n.host.name, "ranks": list(n.ranks)} for n in self.nodes]

    # -- the runs ------------------------------------------------------------------------------------------

    async def _tokens(self, job: HostJob, host: Host, name: str) -> TokenFile:
        data = await job.transport(host).get_bytes(f"{job.run_dir(host)}/{name}")
        assert self.record is not None
        self.record.save_bytes(name, data)
        try:
            return TokenFile.model_validate_json(data)
        except ValidationError as exc:
            raise E.RunFailed(f"host '{host.name}': its token file {name} is not what a stage writes ({exc})") from None

    async def _serial_run(self, job: HostJob, spec: GenerateSpec, tokens: str = SERIAL_TOKENS,
                          ) -> tuple[Pace, list[list[int]]]:
        """Every layer on the first host, the spec's prompts and numerics: its pace and ids."""
        host = self.nodes[0].host
        serial = dataclasses.replace(spec, split=[], tokens_file=tokens)
        name = f"{tokens.removesuffix('-tokens.json')}-spec.json"
        await job.transport(host).put_bytes(serial.to_json().encode(), f"{job.run_dir(host)}/{name}")
        self._phase("serial", f"every layer on {host.name}{'' if spec.numerics == 'fp32' else ', ' + spec.numerics}: "
                              f"{len(spec.prompts)} sequence(s), {spec.new_tokens} new token(s) each")
        said = Ranks()
        assert self.record is not None
        source = tokens.removesuffix("-tokens.json")
        stream = ProcessStream(source, host.name, self.record, self.sink, lambda r: said.apply(host.name, r))
        rc = await job.run_module(host, MODULE, ["--spec", name], stream, threads=self.options.threads,
                                  pgid_file=f"pgid-{source}")
        if rc != 0 or said.errors or 0 not in said.ends:
            raise _failure(said.errors, stream.tail, host.name, f"the {source} run")
        produced = await self._tokens(job, host, tokens)
        if spec.numerics == self.options.numerics:  # (not the fp32 run beside an int8 one)
            self._serial_engine = said.starts[0].engine
        return pace(produced), produced.tokens

    async def _pipeline_run(self, job: HostJob) -> None:
        ranks, o = self._ranks, self.options
        sequences = o.sequences if o.prompts is None else len(o.prompts)
        self._phase("pipeline", f"{o.stages} stage(s) on {len(self.nodes)} host(s), {sequences} sequence(s) in flight")
        port = await master_port(job.transport(self.nodes[0].host), None)
        watch = RankWatch(lambda node, record: ranks.apply(node.host.name, record),
                          finished=lambda r: r in ranks.ends,
                          errored=lambda r: any(e.rank == r for _h, e in ranks.errors))
        assert self.record is not None
        launched = await RankLaunch(job, self.nodes, port=port, threads={n.host.name: o.threads for n in self.nodes},
                                    keep=self.record, sink=self.sink, watch=watch, module=MODULE).run()
        if launched.failed:
            if launched.culprit is not None:
                c = launched.culprit
                raise E.HostLost.on(c.host, c.rank, "generation", f"{c.message}; a generation job does not continue "
                                    "on the hosts left (the lost stage's KV caches lived only on it)")
            raise _failure(ranks.errors, launched.tail, self.nodes[0].host.name, "generation")
        produced = await self._tokens(job, self.nodes[0].host, TOKENS)
        self._pipeline = (pace(produced), produced.tokens)

    def engines_differ(self) -> list[str]:
        """Under int8, the quantised engines of the serial run and the stages when they are not one (an x86 first
        host beside Pis on qnnpack): their ids need not be bit-identical, so they are compared, not enforced."""
        found = {f"{self._serial_engine} on {self.nodes[0].host.name}"} if self._serial_engine else set()
        found |= {f"{st.engine} on {self._stage_hosts.get(rank, '?')}" for rank, st in self._ranks.starts.items()
                  if st.engine}
        return sorted(found) if len({f.split(" on ")[0] for f in found}) > 1 else []

    def _check(self) -> None:
        if self._serial is None or self._pipeline is None or self.engines_differ():
            return
        difference = first_difference(self._serial[1], self._pipeline[1])
        if difference is not None:
            raise E.OutputMismatch(f"generation: sequence {difference.sequence}'s token {difference.position} is "
                                   f"{difference.pipeline} on the pipeline and {difference.serial} on the serial run")

    # -- summary -------------------------------------------------------------------------------------------

    def _summarize(self, status: Status, started: float, error: RunError | None) -> GenerateSummary:
        o, shape = self.options, self.shape
        serial = self._serial[0] if self._serial else None
        pipeline = self._pipeline[0] if self._pipeline else None
        stages = stage_figures(self._ranks.starts, self._ranks.ends, self._stage_hosts)
        difference = first_difference(self._serial[1], self._pipeline[1]) if self._serial and self._pipeline else None
        prompts = o.prompt_ids(shape.vocab) if shape else []
        differ = self.engines_differ()
        if difference is not None and status == "ok" and not differ:
            status = "failed"
        return GenerateSummary(
            status=status, job_id=self.job_id, job_dir=str(self.record.path) if self.record else None,
            model=o.label, arch=shape.model_type if shape else None, layers=shape.layers if shape else None,
            stages=o.stages, split=self.split, placement=self._placement(), sequences=len(prompts) or o.sequences,
            new_tokens=o.new_tokens, prompt_tokens=[len(p) for p in prompts], threads=o.threads,
            serial=serial, serial_host=self.nodes[0].host.name if serial else None,
            serial_note=None if self.serial_fits else f"no serial run: the whole model does not fit host "
                                                       f"'{self.nodes[0].host.name}'",
            pipeline=pipeline,
            speedup=round(pipeline.tokens_per_s / serial.tokens_per_s, 4)
            if serial and pipeline and serial.tokens_per_s and pipeline.tokens_per_s else None,
            numerics=o.numerics, serial_fp32=self._serial_fp32[0] if self._serial_fp32 else None,
            speedup_fp32=round(pipeline.tokens_per_s / fp32.tokens_per_s, 4)
            if (fp32 := self._serial_fp32[0] if self._serial_fp32 else None) and pipeline and fp32.tokens_per_s
            and pipeline.tokens_per_s else None,
            agreement_fp32=agreement(self._serial_fp32[1], self._pipeline[1]) if self._serial_fp32 and self._pipeline
            else None,
            tokens_identical=(difference is None) if serial and pipeline else None, first_difference=difference,
            engines_differ=differ or None,
            stage_figures=stages, waterfall=waterfall(serial, pipeline, stages) if serial and pipeline else [],
            tokens_file=TOKENS if pipeline else None, error=error, started_at=started,
            duration_s=round(time.time() - started, 2))
