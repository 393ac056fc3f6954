"""One run from start to end: push -> plan -> serial baseline -> pipeline -> compare -> summary.

Reports through typed events (`on_event`), so the headless CLI and the dashboard
consume the same stream. Whatever happens (bad input, a failing host, Ctrl-C),
every process it started is stopped and, once a run directory exists, a summary
saying how the run ended is written.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.artifacts import artifact_summary, open_artifact, ship_all
from pictl.balance import NoFeasibleSplit, balanced_split
from pictl.baseline import Baseline, BaselineCache
from pictl.cache import JsonCache
from pictl.costs import cost_table, host_profiles, link_profiles
from pictl.inventory import Cluster, Host
from pictl.launch import (
    NodePlan,
    cleanup_host,
    master_port,
    module_argv,
    place_stages,
    supervised,
    torchrun_argv,
    worker_env,
)
from pictl.planning import plan_key, plans_cache, spec_from
from pictl.profiles import RunOptions
from pictl.push import push_all, tree_digest
from pictl.runs import RunRecord, default_runs_root
from pictl.telemetry import RunTelemetry, command_outcome, max_abs_diff, parse_event
from pictl.timeline import StartupTimeline
from pictl.traces import RankTrace, TraceGrab, grab_traces
from pictl.transport import RemoteProcess, Transport, preload, raise_for_failures, transport_for
from remote import protocol as P
from remote.spec import RunSpec

SUMMARY_SCHEMA = 1


@dataclass(frozen=True)
class Phase:
    """The session moved to a new step."""

    name: str
    message: str


@dataclass(frozen=True)
class HostOutput:
    """A line of ordinary output (not telemetry) from a host."""

    source: str
    host: str
    stream: str
    line: str


@dataclass(frozen=True)
class RankEvent:
    """A telemetry record from a rank or the serial run."""

    source: str
    host: str
    record: dict[str, Any]


SessionEvent = Phase | HostOutput | RankEvent
EventSink = Callable[[SessionEvent], None]


@dataclass
class _Stream:
    """What one process produced, as the session needs it."""

    telemetry: RunTelemetry
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    on_plan: Callable[[dict[str, Any]], None] | None = None  # the serial run may plan first


class RunSession:
    """Runs one experiment on a cluster; `await run()` returns the summary dict."""

    def __init__(self, cluster: Cluster, options: RunOptions, *, on_event: EventSink | None = None,
                 runs_root: Path | None = None, baseline_cache: BaselineCache | None = None,
                 reuse_baseline: bool = True, profile: str | None = None) -> None:
        self.cluster = cluster
        preload(cluster)  # before the start-up clock: importing is not connecting
        self.options = options
        self.profile = profile
        self._sink = on_event or (lambda _e: None)
        self.runs_root = runs_root or default_runs_root()
        self.cache = baseline_cache or BaselineCache()
        self.plans = plans_cache(self.cache)
        self.plan_reused = False
        self.prediction: dict[str, Any] | None = None
        self.reuse_baseline = reuse_baseline
        self.record: RunRecord | None = None
        self.telemetry = RunTelemetry()
        self._live: list[RemoteProcess] = []
        self._transports: dict[str, Transport] = {}
        self._started = time.time()
        self.timeline = StartupTimeline()
        self._master_port: int | None = None
        self.run_id = RunRecord.new_id(options.stages)
        self.last_summary: dict[str, Any] | None = None
        """The summary of the finished run, failed or not (None when nothing started)."""
        self.nodes: list[NodePlan] = []
        self.threads: dict[str, int] = {}  # per host, for its ranks (and for the serial run on host 0)
        self.artifact = open_artifact(options.artifact) if options.artifact else None
        self.serial_threads = options.threads
        self.pipeline_live = False
        self.grabs: list[dict[str, Any]] = []
        self._grab_tasks: set[asyncio.Task] = set()
        self._unrecorded: list[tuple[str, str, str]] = []  # (kind, source, line) that came before the record

    # -- events -----------------------------------------------------------------------------------

    def _phase(self, name: str, message: str) -> None:
        self._sink(Phase(name, message))

    async def _consume(self, source: str, host: Host, proc: RemoteProcess, stream: _Stream,
                       on_error: asyncio.Event | None = None) -> int:
        async for channel, line in proc.lines():
            record = parse_event(line) if channel == "stdout" else None
            if record is not None:
                self._keep("event", source, line)
                if record[P.KEY_EVENT] == P.PLAN and stream.on_plan is not None:
                    stream.on_plan(record)
                    stream.on_plan = None
                stream.telemetry.apply(host.name, record)
                if stream.telemetry is self.telemetry:  # a pipeline rank, not the serial baseline
                    self.timeline.observe(record)
                if not (record[P.KEY_EVENT] == P.ERROR and stream.on_plan is not None):
                    # (an error before the plan is bad input: the run's one error line says it)
                    self._sink(RankEvent(source, host.name, record))
                if record[P.KEY_EVENT] == P.ERROR and on_error is not None:
                    on_error.set()
            else:
                stream.tail.append(f"{source}: {line}")
                self._keep("log", source, line)
                self._sink(HostOutput(source, host.name, channel, line))
        return await proc.wait()

    def _keep(self, kind: str, source: str, line: str) -> None:
        if self.record is None:
            self._unrecorded.append((kind, source, line))
        elif kind == "event":
            self.record.event(source, line)
        else:
            self.record.log(source, line)

    def _open_record(self, nodes: list[NodePlan], spec: RunSpec, plan: dict[str, Any]) -> None:
        """The spec passed the plan: from here on the run exists, and ends with a summary."""
        self.record = RunRecord(self.runs_root, self.run_id)
        self.record.write_config({"options": self.options.model_dump(), "profile": self.profile,
                                  "cluster": self.cluster.source, "spec": spec.to_json(),
                                  "placement": [{"host": n.host.name, "ranks": list(n.ranks)} for n in nodes],
                                  "plan": plan})
        for kind, source, line in self._unrecorded:
            self._keep(kind, source, line)
        self._unrecorded.clear()
        self.timeline.mark("planned")

    # -- steps ------------------------------------------------------------------------------------

    async def _prepare_hosts(self, nodes: list[NodePlan], spec: RunSpec) -> None:
        hosts = [n.host for n in nodes]
        self._transports = {h.name: transport_for(h) for h in hosts}
        transports = list(self._transports.values())
        results = await asyncio.gather(*(t.connect() for t in transports), return_exceptions=True)
        raise_for_failures(results, transports, "")  # names every host that failed, not just the first
        self.timeline.mark("connected")
        await self._divide_threads(nodes)
        pushed = await push_all(transports)
        raise_for_failures(pushed, transports, "push failed")
        await self._ship_artifact(transports)
        self.timeline.mark("pushed")
        if self.options.policy == "balanced" and spec.stages > 1:
            await self._balance(nodes, spec)
        sent = sum(r.sent for r in pushed if not isinstance(r, BaseException))
        self._phase("push", f"{sent} changed file(s) pushed to {len(hosts)} host(s)" if sent
                    else f"code up to date on {len(hosts)} host(s)")

        async def sweep_and_place_spec(t: Transport) -> dict:
            # A controller that vanished may have left processes behind: stop them (never a live run's).
            # The sweep is best effort; only a spec that cannot be placed fails the run.
            cleaned, placed = await asyncio.gather(
                cleanup_host(t, orphans_only=True),
                t.put_bytes(spec.to_json().encode(), f"{t.host.run_dir(spec.run_id)}/{P.SPEC_FILE}"),
                return_exceptions=True)
            if isinstance(placed, BaseException):
                raise placed
            return cleaned if isinstance(cleaned, dict) else {}

        results = await asyncio.gather(*(sweep_and_place_spec(t) for t in transports), return_exceptions=True)
        raise_for_failures(results, transports, "cannot prepare the run")
        if spec.stages > 1:  # the port is checked before anything starts: a busy one is bad input
            self._master_port = await master_port(self._transports[hosts[0].name], self.options.master_port)
        self.timeline.mark("prepared")
        stopped = sum(len(c.get("stopped", [])) for c in results if isinstance(c, dict))
        if stopped:
            self._phase("cleanup", f"stopped {stopped} process group(s) an earlier run left behind")

    async def _ship_artifact(self, transports: list[Transport]) -> None:
        if self.artifact is None:
            return
        sent = await ship_all(transports, self.artifact)
        raise_for_failures(sent, transports, "cannot send the model artifact")
        count = sum(1 for s in sent if s is True)
        size_mb = self.artifact.path.stat().st_size / 1e6
        self._phase("push", f"model artifact {self.artifact.path.name} ({size_mb:.0f} MB) sent to {count} host(s)"
                    if count else f"model artifact {self.artifact.path.name} already on every host")

    async def _divide_threads(self, nodes: list[NodePlan]) -> None:
        """`--threads 0`: each host's cores are divided among the stages it runs; the serial run, alone
        on host 0, gets all of them. Otherwise every rank gets the asked-for count."""
        if self.options.threads > 0:
            self.threads = {n.host.name: self.options.threads for n in nodes}
            self.serial_threads = self.options.threads
            return

        async def cores(n: NodePlan) -> int:
            result = await self._transports[n.host.name].run(["nproc"], timeout_s=30)
            return int(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip().isdigit() else 1

        counts = await asyncio.gather(*(cores(n) for n in nodes))
        self.threads = {n.host.name: max(1, c // len(n.ranks)) for n, c in zip(nodes, counts, strict=True)}
        self.serial_threads = counts[0]
        self._phase("threads", ", ".join(f"{n.host.name}: {len(n.ranks)} stage(s) x {self.threads[n.host.name]} "
                                         f"thread(s) of {c} core(s)" for n, c in zip(nodes, counts, strict=True)))

    async def _balance(self, nodes: list[NodePlan], spec: RunSpec) -> None:
        """Choose the split from per-piece costs measured on the hosts (cached), before the spec goes out."""
        stage_hosts = [n.host.name for n in nodes for _ in n.ranks]
        used = [self._transports[name] for name in dict.fromkeys(stage_hosts)]
        self._phase("balance", f"cost profiles of {len(used)} host(s)")
        profiles, measured = await host_profiles(used, JsonCache(self.cache.root.parent / "costs"),
                                                 model=spec.model, num_classes=spec.num_classes,
                                                 chunk=spec.chunk, threads=self.threads, artifact=self.artifact)
        hops = [(self._transports[a], self._transports[b]) for a, b in itertools.pairwise(stage_hosts) if a != b]
        links, measured_links = await link_profiles(hops, JsonCache(self.cache.root.parent / "links"))
        try:
            split = balanced_split(cost_table(stage_hosts, profiles, links))
        except NoFeasibleSplit as exc:
            raise E.ConfigError(f"policy balanced: {exc}") from None
        pieces = profiles[stage_hosts[0]]["pieces"]
        spec.policy, spec.split_points = "explicit", [pieces[i] for i in split.starts]
        self.prediction = {"stage_ms": [round(s * 1000, 3) for s in split.stage_s],
                           "bottleneck_ms": round(split.bottleneck_s * 1000, 3), "profiled": measured,
                           "links": {f"{a}->{b}": {"latency_ms": round(k.latency_s * 1000, 3),
                                                   "MB_per_s": round(k.bytes_per_s / 1e6, 1)}
                                     for (a, b), k in links.items()},
                           "links_measured": measured_links}
        self._phase("balance", f"split {', '.join(spec.split_points)}: predicted "
                    + " / ".join(f"{ms:.1f}" for ms in self.prediction["stage_ms"]) + " ms per microbatch"
                    + (f" (measured {', '.join(measured)})" if measured else " (cached profiles)"))

    def _cached_plan(self, host: Host, spec: RunSpec) -> dict[str, Any] | None:
        key = plan_key(host, spec)
        if key and (cached := self.plans.get(key)):
            self.plan_reused = True
            self._phase("plan", f"plan for {spec.stages} stage(s) reused (same model, split and code)")
            return cached
        return None

    def _keep_plan(self, host: Host, spec: RunSpec, plan: dict[str, Any]) -> None:
        if key := plan_key(host, spec):
            self.plans.put(key, plan)

    async def _plan(self, host: Host, spec: RunSpec) -> dict[str, Any]:
        self._phase("plan", f"validating the spec and planning {spec.stages} stage(s) on {host.name}")
        t = self._transports[host.name]
        result = await t.run(module_argv(host, "remote.plan", P.SPEC_FILE), cwd=host.run_dir(spec.run_id),
                             env=worker_env(host, 1), timeout_s=300)
        plan, message = command_outcome(result, P.PLAN)
        if plan is not None:
            self._keep_plan(host, spec, plan)
            return plan
        if result.returncode == P.EXIT_BAD_INPUT:
            raise E.ConfigError(message)
        raise E.RunFailed(f"host '{host.name}': planning failed: {message}")

    def _baseline_fields(self, host: Host, spec: RunSpec) -> dict[str, Any]:
        ckpt = Path(spec.checkpoint).expanduser() if spec.checkpoint else None
        stat = ckpt.stat() if ckpt and ckpt.exists() else None
        return {"model": spec.model, "num_classes": spec.num_classes, "seed": spec.seed,
                "checkpoint": [str(ckpt), stat.st_size, stat.st_mtime] if stat else None,
                "artifact": self.artifact.digest if self.artifact else None,
                "data": [spec.data.kind, spec.data.path, spec.data.split], "images": spec.images,
                "chunk": spec.chunk, "threads": self.serial_threads, "warmup": spec.warmup, "repeats": spec.repeats,
                "check_images": spec.check_images, "host": [host.name, host.address, host.python_path()],
                "code": tree_digest()}

    def _reusable_baseline(self, host: Host, spec: RunSpec) -> Baseline | None:
        return self.cache.get(JsonCache.key(self._baseline_fields(host, spec))) if self.reuse_baseline else None

    async def _baseline(self, host: Host, spec: RunSpec,
                        on_plan: Callable[[dict[str, Any]], None] | None = None) -> Baseline:
        """The serial run on `host` (or its cached result). With `on_plan`, the same process plans first
        and `on_plan` gets the plan; bad input found by planning is a ConfigError, as from `_plan`."""
        fields = self._baseline_fields(host, spec)
        key = JsonCache.key(fields)
        if on_plan is None and self.reuse_baseline and (cached := self.cache.get(key)):
            self._phase("baseline", f"serial baseline reused: {cached.ips:.2f} img/s on {host.name}")
            return cached
        self._phase("baseline", f"measuring the serial baseline on {host.name}" if on_plan is None else
                    f"validating the spec, planning {spec.stages} stage(s) and measuring the serial "
                    f"baseline on {host.name}")
        t = self._transports[host.name]
        run_dir = host.run_dir(spec.run_id)

        def plan_arrived(plan: dict[str, Any]) -> None:
            self._keep_plan(host, spec, plan)
            assert on_plan is not None
            on_plan(plan)

        stream = _Stream(RunTelemetry(), on_plan=plan_arrived if on_plan else None)
        serial = module_argv(host, "remote.serial", P.SPEC_FILE) + (["--plan"] if on_plan else [])
        argv = supervised(host, serial, "pgid-serial")
        proc = await t.start(argv, cwd=run_dir, env=worker_env(host, self.serial_threads or 1))
        self._live.append(proc)
        rc = await self._consume("serial", host, proc, stream)
        self._live.remove(proc)
        tel = stream.telemetry
        if stream.on_plan is not None:  # still waiting: the process ended before its plan
            st = tel.stages.get(0)
            message = st.error["message"] if st and st.error else (list(stream.tail) or ["no output"])[-1]
            if rc == P.EXIT_BAD_INPUT:
                raise E.ConfigError(message)
            raise E.RunFailed(f"host '{host.name}': planning failed: {message}")
        st = tel.stages.get(0)
        if rc != 0 or not st or not st.ended or tel.mean_ips is None:
            message = st.error["message"] if st and st.error else f"exit status {rc}"
            raise self._failure(host, 0, "serial baseline", message, stream.tail)
        logits = await t.get_bytes(f"{run_dir}/{P.LOGITS_FILE_SERIAL}")
        baseline = Baseline(tel.mean_ips, tel.ips_spread or [], tel.top1, logits, time.time(),
                            st.peak_rss_mb, st.import_rss_mb)
        self.cache.put(key, baseline, fields)
        return baseline

    def _failure(self, host: Host, rank: int | None, what: str, message: str, tail: deque[str]) -> E.RunFailed:
        self._failure_info = {"host": host.name, "rank": rank, "message": message, "last_lines": list(tail)}
        where = f"host '{host.name}'" + (f" rank {rank}" if rank is not None else "")
        return E.RunFailed(f"{what} failed on {where}: {message}")

    async def _pipeline(self, nodes: list[NodePlan], spec: RunSpec) -> None:
        master = nodes[0].host
        port = self._master_port or await master_port(self._transports[master.name], None)
        self._phase("pipeline", f"launching {spec.stages} stage(s) on {len(nodes)} host(s), "
                                f"rendezvous {master.rendezvous_address}:{port}")
        stream = _Stream(self.telemetry)
        failed = asyncio.Event()
        procs: dict[str, RemoteProcess] = {}
        self.pipeline_live = True
        for node in nodes:
            argv = supervised(node.host, torchrun_argv(node, nnodes=len(nodes), master=master, master_port=port,
                                                       spec_path=P.SPEC_FILE), "pgid-torchrun")
            procs[node.host.name] = proc = await self._transports[node.host.name].start(
                argv, cwd=node.host.run_dir(spec.run_id), env=worker_env(node.host, self.threads[node.host.name]))
            self._live.append(proc)

        async def watch(node: NodePlan) -> None:
            rc = await self._consume(node.host.name, node.host, procs[node.host.name], stream, failed)
            ranks_done = all(self.telemetry.stages.get(r) and self.telemetry.stages[r].ended for r in node.ranks)
            if rc != 0 and not ranks_done:
                failed.set()

        watchers = [asyncio.create_task(watch(n)) for n in nodes]
        waiter = asyncio.create_task(failed.wait())
        try:
            await asyncio.wait([*watchers, waiter], return_when=asyncio.FIRST_COMPLETED)
            while not failed.is_set() and not all(w.done() for w in watchers):
                await asyncio.wait([*watchers, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            self.pipeline_live = False
        if failed.is_set():
            # A rank that dies makes its peers fail too ("connection closed by peer"); give
            # the dead rank's torchrun a moment to exit so the blame lands on the cause.
            await asyncio.sleep(1.5)
            exited = {n.host.name: procs[n.host.name].returncode for n in nodes}
            await self._stop_all()
            await asyncio.gather(*watchers, return_exceptions=True)
            raise self._pipeline_failure(nodes, stream, exited)

    def _pipeline_failure(self, nodes: list[NodePlan], stream: _Stream, exited: dict[str, int | None]) -> E.RunFailed:
        """Blame a rank that died without a word first, then the earliest rank that reported an error."""
        stages = self.telemetry.stages
        for node in nodes:
            rc = exited.get(node.host.name)
            if rc in (None, 0):
                continue
            for rank in node.ranks:
                st = stages.get(rank)
                if not (st and (st.ended or st.error)):
                    return self._failure(node.host, rank, "the pipeline", f"the rank died without reporting an "
                                         f"error (torchrun exit status {rc}: killed, out of memory or crashed)",
                                         stream.tail)
        st = self.telemetry.first_error()
        if st is not None:
            host = next(n.host for n in nodes if st.rank in n.ranks)
            return self._failure(host, st.rank, "the pipeline", st.error["message"], stream.tail)
        return self._failure(nodes[0].host, None, "the pipeline", "torchrun exited before every rank finished",
                             stream.tail)

    # -- traces -----------------------------------------------------------------------------------

    def _rank_traces(self) -> list[RankTrace]:
        return [RankTrace(n.host.name, r, self._transports[n.host.name], n.host.run_dir(self.run_id))
                for n in self.nodes for r in n.ranks]

    def _trace_gave_up(self, trace_id: str, rank: int) -> str | None:
        """Why `rank` will never deliver trace `trace_id`, or None while it still may."""
        for ev in self.telemetry.traces:
            if ev.get("id") == trace_id and ev.get("stage") == rank and not ev.get("file"):
                return f"rank {rank}: {ev.get('message') or 'no trace written'}"
        st = self.telemetry.stages.get(rank)
        if st is not None and st.error:
            return f"rank {rank} failed: {st.error.get('message')}"
        if not self.pipeline_live:
            return f"rank {rank}: the run ended before its trace arrived"
        return None

    async def grab_traces(self, steps: int, *, timeout_s: float = 120.0, trace_id: str | None = None,
                          request: bool = True) -> TraceGrab:
        """Profile `steps` steps on every rank of the running pipeline and merge what arrives.

        The run goes on meanwhile; passes the window touches are kept out of its throughput.
        """
        if request and (not self.pipeline_live or self.record is None):
            raise E.ConfigError("no pipeline is running: traces are taken from a live run (or run --trace-steps)")
        assert self.record is not None
        task = asyncio.current_task()
        if task is not None:
            self._grab_tasks.add(task)
        self._phase("traces", f"profiling {steps} step(s) on {sum(len(n.ranks) for n in self.nodes)} rank(s)")
        try:
            grab = await grab_traces(self._rank_traces(), self.record.path, steps=steps, timeout_s=timeout_s,
                                     gave_up=self._trace_gave_up, trace_id=trace_id, request=request)
        finally:
            self._grab_tasks.discard(task)
        self.grabs.append(grab.to_json())
        got = f"{len(grab.files)} of {len(grab.files) + len(grab.missing)} rank trace(s) in {grab.directory}"
        self._phase("traces", got + "".join(f"; {why}" for why in grab.missing.values()))
        return grab

    async def _settle_grabs(self, ok: bool) -> None:
        """Let trace grabs that are under way finish (a finished run has flushed every trace)."""
        pending = [t for t in self._grab_tasks if not t.done()]
        if not pending:
            return
        if not ok:
            for t in pending:
                t.cancel()
        await asyncio.wait(pending, timeout=60)

    async def _stop_all(self) -> None:
        live, self._live = self._live, []
        await asyncio.gather(*(p.stop() for p in live), return_exceptions=True)

    # -- the run ----------------------------------------------------------------------------------

    async def _fastest_hosts(self, stages: int) -> Cluster:
        """Fewer stages than hosts under `balanced`: the stages go to the hosts whose measured pieces
        add up to the least time (cached profiles; inventory order kept among the chosen)."""
        hosts = list(self.cluster.hosts)
        transports = [transport_for(h) for h in hosts]
        self._phase("balance", f"{stages} stage(s) on {len(hosts)} hosts: choosing the fastest")
        try:
            results = await asyncio.gather(*(t.connect() for t in transports), return_exceptions=True)
            raise_for_failures(results, transports, "")
            raise_for_failures(await push_all(transports), transports, "push failed")
            await self._ship_artifact(transports)
            o = self.options
            profiles, _ = await host_profiles(transports, JsonCache(self.cache.root.parent / "costs"),
                                              model=o.model, num_classes=o.num_classes, chunk=o.chunk,
                                              threads=o.threads or 1, artifact=self.artifact)
        finally:
            await asyncio.gather(*(t.close() for t in transports), return_exceptions=True)
        total = {h.name: sum(profiles[h.name]["compute_s"]) for h in hosts}
        chosen = set(sorted(total, key=total.__getitem__)[:stages])
        self._phase("balance", "fastest hosts: " + ", ".join(
            f"{h.name} ({total[h.name] * 1000:.0f} ms)" for h in hosts if h.name in chosen)
            + "; left out: " + ", ".join(f"{h.name} ({total[h.name] * 1000:.0f} ms)"
                                         for h in hosts if h.name not in chosen))
        return self.cluster.model_copy(update={"hosts": tuple(h for h in hosts if h.name in chosen)})

    async def run(self) -> dict[str, Any]:
        nodes = place_stages(self.cluster, self.options.stages)  # ConfigError: nothing started yet
        if self.options.policy == "balanced" and 1 < self.options.stages < len(self.cluster.hosts):
            nodes = place_stages(await self._fastest_hosts(self.options.stages), self.options.stages)
        spec = spec_from(self.options, self.run_id, self.artifact)
        self._failure_info: dict[str, Any] | None = None
        summary: dict[str, Any] = {}
        plan: dict[str, Any] = {}
        baseline: Baseline | None = None
        try:
            host0 = nodes[0].host
            try:
                await self._prepare_hosts(nodes, spec)
                plan = self._cached_plan(host0, spec) or {}
                if plan or self._reusable_baseline(host0, spec):
                    plan = plan or await self._plan(host0, spec)
                    self._open_record(nodes, spec, plan)
                    baseline = await self._baseline(host0, spec)
                else:  # neither is known: one process plans, then measures (one torch import, not two)
                    def opened(p: dict[str, Any]) -> None:
                        plan.update(p)
                        self._open_record(nodes, spec, p)
                    baseline = await self._baseline(host0, spec, on_plan=opened)
            except E.ConfigError:
                if self.record is None:  # bad input: leave nothing behind, on the hosts or here
                    await asyncio.gather(*(t.remove_tree(t.host.run_dir(spec.run_id))
                                           for t in self._transports.values()), return_exceptions=True)
                raise
            self.timeline.mark("baselined")
            if spec.stages > 1:
                self.nodes = nodes
                await self._pipeline(nodes, spec)
                await self._settle_grabs(ok=True)
                if spec.trace_steps:
                    await self.grab_traces(spec.trace_steps, trace_id="run", request=False, timeout_s=30)
                last = next(n for n in nodes if spec.stages - 1 in n.ranks).host
                logits = await self._transports[last.name].get_bytes(
                    f"{last.run_dir(spec.run_id)}/{P.LOGITS_FILE_PIPELINE}")
                self.record.save_bytes(P.LOGITS_FILE_PIPELINE, logits)
            else:
                logits = baseline.logits
            self.record.save_bytes(P.LOGITS_FILE_SERIAL, baseline.logits)
            summary = self._summary("ok", nodes, plan, baseline, logits)
            if not summary["outputs_match"]:
                summary["status"] = "failed"
                raise E.OutputMismatch(f"pipeline output differs from the serial run "
                                       f"(max abs diff {summary['max_abs_diff']})")
            return summary
        except asyncio.CancelledError:
            summary = self._summary("interrupted", nodes, plan, baseline, None)
            raise E.Interrupted("interrupted: every rank was stopped") from None
        except E.PictlError as exc:
            if self.record is None:
                raise  # failed before the run existed: nothing to summarise
            if not summary:
                summary = self._summary("failed", nodes, plan, baseline, None)
            summary["error"] = {"type": type(exc).__name__, "message": str(exc), **(self._failure_info or {})}
            raise
        finally:
            await asyncio.shield(self._settle_grabs(ok=False))
            await asyncio.shield(self._cleanup())
            if self.record is not None:
                self.record.finish(summary)
                self.last_summary = summary

    async def _cleanup(self) -> None:
        await self._stop_all()
        await asyncio.gather(*(t.close() for t in self._transports.values()), return_exceptions=True)

    def _summary(self, status: str, nodes: list[NodePlan], plan: dict[str, Any], baseline: Baseline | None,
                 logits: bytes | None) -> dict[str, Any]:
        o = self.options
        serial_only = o.stages == 1
        ips = baseline.ips if serial_only and baseline else self.telemetry.mean_ips
        diff = max_abs_diff(logits, baseline.logits) if logits is not None and baseline else None
        host_of = {r: n.host.name for n in nodes for r in n.ranks}
        planned = {s["stage"]: s for s in plan.get("stages", [])}
        per_stage = []
        for rank in range(o.stages):
            st = self.telemetry.stages.get(rank)
            totals = st.totals if st else {}
            busy = [totals.get(k) for k in ("compute_s", "send_s", "microbatches")]
            per_stage.append({
                # Seconds per microbatch the stage was busy (computing or blocked on a send),
                # beside what the balanced policy predicted for it.
                "measured_ms": round((busy[0] + busy[1]) / busy[2] * 1000, 3) if None not in busy and busy[2] else None,
                "predicted_ms": self.prediction["stage_ms"][rank] if self.prediction else None,
                "host": host_of.get(rank), "rank": rank, "threads": self.threads.get(host_of.get(rank, ""), o.threads),
                "modules": planned.get(rank, {}).get("modules", st.modules if st else []),
                "params": planned.get(rank, {}).get("params", st.params if st else 0),
                "compute_s": totals.get("compute_s"), "wait_s": totals.get("wait_s"),
                "send_s": totals.get("send_s"), "bytes_sent": totals.get("bytes_sent"),
                "microbatches": totals.get("microbatches"),
                "load_s": st.load_s if st else None, "import_rss_mb": st.import_rss_mb if st else None,
                "peak_rss_mb": st.peak_rss_mb if st else None,
            })
        speedup = ips / baseline.ips if ips and baseline else None
        return {
            "schema": SUMMARY_SCHEMA, "status": status, "run_id": self.run_id,
            "run_dir": str(self.record.path) if self.record else None,
            "model": o.model, "stages": o.stages, "policy": o.policy,
            "artifact": artifact_summary(self.artifact) if self.artifact else None,
            "split_points": plan.get("split_points", list(o.split)),
            "images": o.images, "chunk": o.chunk, "threads": o.threads, "warmup": o.warmup, "repeats": o.repeats,
            "data": o.data, "profile": self.profile,
            "throughput_ips": round(ips, 4) if ips else None,
            "throughput_spread_ips": baseline.ips_spread if serial_only and baseline else self.telemetry.ips_spread,
            "serial_ips": round(baseline.ips, 4) if baseline else None,
            "serial_reused": baseline.reused if baseline else None,
            "serial_peak_rss_mb": baseline.peak_rss_mb if baseline else None,
            "serial_import_rss_mb": baseline.import_rss_mb if baseline else None,
            "speedup": round(speedup, 4) if speedup else None,
            "efficiency": round(speedup / o.stages, 4) if speedup else None,
            "outputs_match": (diff is not None and diff <= o.atol) if logits is not None else None,
            "max_abs_diff": diff, "compared_images": min(o.check_images, o.images),
            "accuracy": baseline.top1 if serial_only and baseline else self.telemetry.top1,
            "serial_accuracy": baseline.top1 if baseline else None,
            "per_stage": per_stage,
            "plan_reused": self.plan_reused,
            "traces": self.grabs,
            "traced_passes": len(self.telemetry.traced_throughputs),
            "prediction": self.prediction,
            "startup": self.timeline.summary(),
            "started_at": self._started, "duration_s": round(time.time() - self._started, 2),
        }
