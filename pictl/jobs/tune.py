"""`pictl tune`: the fastest configuration the cluster allows, exact first, and past N times where the user
accepts a bounded loss.

The search space is replicas x stages (stages beyond the hosts through their slots) and, with `allow_loss`,
int8-dynamic numerics and compressing wire formats (one lossy source per candidate, so its agreement with the
fp32 serial run is the one measured). Every candidate is predicted from the hosts' cost profiles (the ones
`balanced` measures, `pictl.planning.costs`): each replica's split is the balanced one for the slowest
replica's hosts, a pass takes (M / R + S - 1) bottleneck steps, and int8 scales compute by the gain its
serial run measured. The first measurement is the pipeline over every host (R = 1, `balanced`): it profiles
the hosts, is the pipeline-only answer, and with its serial run calibrates the model (`Calibration`); with
`allow_loss`, an int8 serial run measures what int8 gains here. Then the best predicted candidates are
measured, each a full `pictl run` against the serial run, until `measure` of them are in or the budget is
spent. A candidate is kept when its run is ok and its outputs are bit-identical to the serial run in its
numerics (exact), or, lossy, when its top-1 agreement with the fp32 serial run is at least `min_agreement`;
the winner is the kept one with the highest measured throughput. `tune.json` is rewritten after every
measurement, so an interrupted tune keeps what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.cluster.artifacts import Artifact
from pictl.cluster.hoststate import capacity
from pictl.events import EventSink, Phase
from pictl.inventory import Cluster
from pictl.planning.costs import Profiles, cost_table, profile_key
from pictl.planning.options import RunOptions
from pictl.planning.placement import place_stages
from pictl.records.cache import JsonCache
from pictl.records.runs import write_json_atomic
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession
from pictl.summary_models import RunSummary
from remote.balance import NoFeasibleSplit, balanced_split
from remote.wire import byte_ratio, parse_wire

LOSSY_WIRES = ("fp16", "int8")
"""The compressing formats a lossy tune tries (lowrank loses far more for its bytes on DeiT-S's links)."""


@dataclass(frozen=True)
class Candidate:
    replicas: int
    stages: int
    numerics: str = "fp32"
    wire: str = "fp32"

    @property
    def lossy(self) -> bool:
        return self.numerics != "fp32" or not parse_wire(self.wire).lossless

    @property
    def label(self) -> str:
        shape = f"{self.replicas}x{self.stages}"
        extra = [x for x in (self.numerics if self.numerics != "fp32" else "",
                             f"wire {self.wire}" if self.wire != "fp32" else "") if x]
        return " ".join([shape, *extra])

    def options(self, base: RunOptions) -> RunOptions:
        """The run that measures this candidate: `balanced` cuts a pipeline; the base's images, chunk, passes."""
        fields = {**base.model_dump(exclude={"artifact"}), "stages": self.stages, "replicas": self.replicas,
                  "numerics": self.numerics, "wire": self.wire, "split": [],
                  "policy": "balanced" if self.stages > 1 else "equal"}
        if base.artifact:
            fields["model"] = base.artifact
        return RunOptions(**fields)


def candidates(cluster: Cluster, base: RunOptions, *, allow_loss: bool) -> list[Candidate]:
    """Every shape that fits the slots and deals the pass's microbatches evenly, in each numerics and wire."""
    microbatches = -(-base.images // base.chunk)
    out = []
    for ranks in range(1, cluster.slots + 1):
        for replicas in (r for r in range(1, ranks + 1) if ranks % r == 0 and microbatches % r == 0):
            stages = ranks // replicas
            out.append(Candidate(replicas, stages))
            if allow_loss:
                out.append(Candidate(replicas, stages, numerics="int8-dynamic"))
                out += [Candidate(replicas, stages, wire=w) for w in LOSSY_WIRES if stages > 1]
    return out


def cached_profiles(cluster: Cluster, base: RunOptions, cache_root: Path, code: str,
                    artifact: Artifact | None = None) -> Profiles | None:
    """The hosts' cost profiles from the cache the runs fill (None while any host has none); `code`: the digest
    of the tree the runs pushed, `artifact`: the model file they ran (its digest keys the profiles too)."""
    costs = JsonCache(cache_root / "costs")
    by_host = {}
    for host in cluster.hosts:
        found = costs.get(profile_key(host, base.model, base.num_classes, base.chunk, base.threads or 1, code=code,
                                      artifact=artifact))
        if not isinstance(found, dict) or not found.get("compute_s"):
            return None
        by_host[host.name] = found
    return Profiles(by_host, [], [])


@dataclass(frozen=True)
class Calibration:
    """What the tune's first measurements correct in the cost model: `serial`, the measured serial run over the
    profiles' serial prediction (the profiles time pieces inside passes, a little slower than the whole model);
    `pipeline`, the measured pipeline over every host against its (serial-corrected) prediction: what the
    model leaves out of a pipeline (links, the schedule's own time), applied to every candidate with stages.
    `machines`: host -> [machine, its CPUs, the host's own cap], from the first run's host records: hosts that
    share one machine share its CPUs, so a candidate running more threads on it than it has is slowed by the
    ratio (the shipped local cluster's four "hosts" on one machine; Pis never share)."""

    serial: float = 1.0
    pipeline: float = 1.0
    int8_gain: float | None = None
    """int8's gain over fp32 on a host whose machine has none of its own in `int8_gains`."""
    machines: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    int8_gains: dict[str, float] = field(default_factory=dict)
    """Host -> int8's gain measured on its machine (one serial run per machine: an ARM core gains less)."""

    def int8_on(self, hosts: list[str]) -> float | None:
        """int8's gain for a candidate on `hosts`: its least-gaining host's (the pipeline waits for it)."""
        gains = [self.int8_gains.get(h, self.int8_gain) for h in hosts]
        return None if not gains or None in gains else min(g for g in gains if g is not None)

    def crowding(self, hosts: list[str], threads: int) -> float:
        """The share of its CPU time the most crowded machine gives each of `hosts`' ranks (1: enough CPUs)."""
        demand: dict[str, float] = {}
        cpus: dict[str, float] = {}
        for h in hosts:
            machine, n, cap = self.machines.get(h, (h, float("inf"), float("inf")))
            demand[machine] = demand.get(machine, 0.0) + min(float(threads), cap)
            cpus[machine] = n
        return min([1.0, *(cpus[m] / d for m, d in demand.items() if d > 0)])


def predict(c: Candidate, cluster: Cluster, base: RunOptions, profiles: Profiles,
            calibration: Calibration | None = None) -> float | None:
    """Predicted img/s of `c`, or None when nothing can be said (no int8 gain measured yet, no feasible split)."""
    cal = calibration or Calibration()
    hosts = [n.host.name for n in place_stages(cluster, c.replicas * c.stages) for _ in n.ranks]
    gain = cal.int8_on(hosts) if c.numerics != "fp32" else 1.0
    if gain is None:
        return None
    tables = [cost_table(hosts[r * c.stages:(r + 1) * c.stages], profiles,
                         wire_ratio=byte_ratio(parse_wire(c.wire).default)) for r in range(c.replicas)]
    try:
        step_s = balanced_split(*tables).bottleneck_s  # replicas share the split: the slowest one's
    except NoFeasibleSplit:
        return None
    per_replica = -(-base.images // base.chunk) // c.replicas
    ips = base.images / ((per_replica + c.stages - 1) * step_s) * cal.serial * cal.crowding(hosts, base.threads or 1)
    ips *= cal.pipeline if c.stages > 1 else 1.0
    return ips * gain


@dataclass
class Measured:
    """One candidate as the tune saw it: predicted, then (if measured) its run's figures and verdict."""

    candidate: Candidate
    predicted_ips: float | None = None
    run_id: str | None = None
    status: str | None = None
    throughput_ips: float | None = None
    speedup_vs_fp32: float | None = None
    """Against the fp32 serial run: numerics and parallelism together."""
    agreement_vs_fp32: float | None = None
    accuracy: float | None = None
    """Top-1 on labelled images, and the fp32 serial run's (None without labels)."""
    fp32_accuracy: float | None = None
    latency_p50_ms: float | None = None
    machines: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    """The run's hosts: [machine (boot id), its CPUs, the host's cap] (`Calibration.machines`)."""
    serial_ips: float | None = None
    """The fp32 serial run's img/s the run was measured against."""
    split_points: list[str] = field(default_factory=list)
    kept: bool = False
    why: str = ""

    def row(self) -> dict[str, Any]:
        c = self.candidate
        return {"candidate": c.label, **asdict(c), "exact": not c.lossy,
                **{k: v for k, v in asdict(self).items() if k not in ("candidate", "machines")}}


def judge(m: Measured, summary: RunSummary | None, min_agreement: float) -> None:
    """Fill `m` from its run's summary (None: it ended before it had one) and decide whether it may win."""
    c = m.candidate
    if summary is None:
        m.status, m.kept, m.why = "failed", False, "its run failed"
        return
    s, n = summary, summary.numerics
    m.run_id, m.status = s.run_id, s.status
    m.throughput_ips, m.split_points = s.throughput_ips, list(s.split_points)
    m.accuracy = s.accuracy
    if c.numerics != "fp32":
        m.speedup_vs_fp32 = n.speedup_vs_fp32 if n else None
        m.agreement_vs_fp32 = n.agreement_vs_fp32 if n else None
        m.serial_ips, m.fp32_accuracy = (n.fp32_serial_ips, n.fp32_serial_accuracy) if n else (None, None)
    else:
        m.speedup_vs_fp32, m.serial_ips, m.fp32_accuracy = s.speedup, s.serial_ips, s.serial_accuracy
        m.agreement_vs_fp32 = s.agreement if c.lossy else 1.0 if s.outputs_match else None
    pipeline = s.latency.pipeline if s.latency else None
    m.latency_p50_ms = pipeline.p50_ms if pipeline else None
    for name, record in s.hosts.items():
        if record.state and record.state.cpus:
            m.machines[name] = (record.state.boot_id or name, float(record.state.cpus),
                                capacity(record.state.model_dump(exclude_none=True)))
    if m.status != "ok" or not s.outputs_match:
        m.kept, m.why = False, "its run failed" if m.status != "ok" else "outputs differ from the serial run"
    elif c.lossy and (m.agreement_vs_fp32 is None or m.agreement_vs_fp32 < min_agreement):
        m.kept, m.why = False, f"top-1 agreement with fp32 {m.agreement_vs_fp32} is below {min_agreement}"
    elif c.lossy and m.accuracy is not None and m.fp32_accuracy and m.accuracy < min_agreement * m.fp32_accuracy:
        # With labels, the accuracy is bounded too: it keeps at least that share of the fp32 serial run's.
        m.kept, m.why = False, (f"accuracy {m.accuracy} keeps less than {min_agreement} of the fp32 serial run's "
                                f"{m.fp32_accuracy}")
    else:
        m.kept, m.why = True, "bit-identical" if not c.lossy else f"agreement {m.agreement_vs_fp32} >= {min_agreement}"


def ranked(rows: list[Measured]) -> list[Measured]:
    """Measured candidates first, fastest first, then the predicted rest, best predicted first."""
    return sorted(rows, key=lambda m: (m.throughput_ips is None, -(m.throughput_ips or 0.0), -(m.predicted_ips or 0.0)))


def winner(rows: list[Measured]) -> Measured | None:
    """The kept candidate with the highest measured throughput (an exact one wins a tie)."""
    kept = [m for m in rows if m.kept and m.throughput_ips]
    return max(kept, key=lambda m: (m.throughput_ips or 0.0, not m.candidate.lossy), default=None)


@dataclass
class TuneSettings:
    measure: int = 3
    """Candidates measured at most (the pipeline-only one and the int8 serial run included)."""
    budget_s: float = 1800.0
    allow_loss: bool = False
    min_agreement: float = 0.99
    wait: bool = False


async def run_tune(cluster: Cluster, base: RunOptions, settings: TuneSettings, out: Path, *,
                   on_event: EventSink | None = None, cache: BaselineCache | None = None,
                   on_rows: Callable[[list[Measured]], object] | None = None) -> list[Measured]:
    """Measure, predict, measure the best; `tune.json` in `out` after every run (E.Interrupted keeps it).
    Returns every candidate, `ranked`: those measured have a `status`."""
    say = on_event or (lambda _e: None)
    started = time.monotonic()
    everything = candidates(cluster, base, allow_loss=settings.allow_loss)
    rows = {c: Measured(c) for c in everything}
    measured: list[Measured] = []
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started_at": time.time(), "cluster": cluster.source, "options": base.model_dump(),
            "settings": asdict(settings)}

    def save(status: str) -> None:
        best, exact = winner(measured), winner([m for m in measured if not m.candidate.lossy])
        pipeline = winner([m for m in measured if m.candidate.replicas == 1 and not m.candidate.lossy])
        write_json_atomic(out / "tune.json", {
            **meta, "status": status, "elapsed_s": round(time.monotonic() - started, 1),
            "winner": best.row() if best else None, "best_exact": exact.row() if exact else None,
            "best_pipeline": pipeline.row() if pipeline else None,
            "rows": [m.row() for m in ranked(list(rows.values()))]})
        if on_rows:
            on_rows(list(measured))

    first: list[RunSession] = []  # its tree's digest and its model file key the profiles it measured

    async def measure(m: Measured, why: str, on: str | None = None, *, counted: bool = True) -> None:
        """Run `m` (on the host `on` alone, when given) and judge it; a row of the table counts toward
        --measure, a further machine's int8 serial run does not."""
        say(Phase("tune", f"measuring {m.candidate.label} ({why})"))
        hosts = cluster.model_copy(update={"hosts": tuple(h for h in cluster.hosts if h.name == on)}) if on else cluster
        session = RunSession(hosts, m.candidate.options(base), on_event=on_event, runs_root=out / "runs",
                             baseline_cache=cache, wait=settings.wait)
        first[:] = first or [session]
        summary: RunSummary | None
        try:
            summary = await session.run()
        except (E.RunFailed, E.OutputMismatch, E.TransportError) as exc:
            summary = session.last_summary
            say(Phase("tune", f"{m.candidate.label}: {exc}"))
        except E.ConfigError as exc:
            if not measured:  # the first run: the tune's own options are at fault, nothing is measured
                raise
            summary = None  # this shape cannot run here (no split fits, say): the rest can
            say(Phase("tune", f"{m.candidate.label} refused: {exc}"))
        except E.Interrupted:
            if session.last_summary:
                judge(m, session.last_summary, settings.min_agreement)
                measured.extend([m] if counted else [])
            save("interrupted")
            raise
        judge(m, summary, settings.min_agreement)
        measured.extend([m] if counted else [])
        save("running")
        say(Phase("tune", f"{m.candidate.label}: {m.throughput_ips} img/s, "
                          + ("kept" if m.kept else f"not kept: {m.why}")))

    # One stage per host (a single host: one per slot): `balanced` profiles every host it runs on.
    pipeline = Candidate(1, len(cluster.hosts) if len(cluster.hosts) > 1 else cluster.slots)
    await measure(rows.setdefault(pipeline, Measured(pipeline)), "the pipeline over every host; it profiles them")
    gains: dict[str, float] = {}
    if settings.allow_loss:  # one int8 serial run per machine: the table's row is the first machine's
        serial8 = Candidate(1, 1, numerics="int8-dynamic")
        for i, group in enumerate(by_machine(cluster, rows[pipeline].machines)):
            m = rows[serial8] if i == 0 else Measured(serial8)
            shared = f" (one machine with {', '.join(group[1:])})" if group[1:] else ""
            await measure(m, f"what int8 gains on {group[0]}{shared}", on=group[0], counted=i == 0)
            if m.status == "ok" and m.speedup_vs_fp32:
                gains |= dict.fromkeys(group, m.speedup_vs_fp32)
        meta["int8_gains"] = gains
    profiles = cached_profiles(cluster, base, (cache or BaselineCache()).root.parent, first[0].ctx.code,
                               first[0].ctx.artifact)
    if profiles is None:
        raise E.RunFailed("tune: the hosts' cost profiles are not in the cache after the first run"
                          + ("" if rows[pipeline].status == "ok" else " (it failed: see its record)"))
    calibration = calibrate(rows[pipeline], cluster, base, profiles, gains)
    say(Phase("tune", f"cost model calibrated: serial x{calibration.serial:.2f}, pipelines x{calibration.pipeline:.2f}"
                      + (f", int8 x{min(gains.values()):.2f}-{max(gains.values()):.2f}" if gains else "")))
    meta["calibration"] = asdict(calibration)
    for m in rows.values():
        m.predicted_ips = predict(m.candidate, cluster, base, profiles, calibration)
    save("running")
    todo = sorted((m for m in rows.values() if m not in measured and m.predicted_ips),
                  key=lambda m: -(m.predicted_ips or 0.0))
    if settings.allow_loss:  # the best exact configuration is measured too, to stand beside the lossy winner
        exact = [m for m in todo if not m.candidate.lossy][:1]
        todo = exact + [m for m in todo if m not in exact]
    for m in todo:
        if len(measured) >= settings.measure:
            break
        if time.monotonic() - started > settings.budget_s:
            say(Phase("tune", f"budget of {settings.budget_s:.0f} s spent: {len(measured)} candidate(s) measured"))
            break
        await measure(m, f"predicted {m.predicted_ips:.1f} img/s")
    save("done")
    return ranked(list(rows.values()))


def by_machine(cluster: Cluster, machines: dict[str, tuple[str, float, float]]) -> list[list[str]]:
    """The cluster's hosts grouped by the machine they run on (the first run's boot ids; a host it did not
    record is a machine of its own), in the inventory's order; all of them as one when it recorded none (it
    failed: one int8 run stands for every host, as the tune cannot tell them apart)."""
    if not machines:
        return [[h.name for h in cluster.hosts]]
    groups: dict[str, list[str]] = {}
    for h in cluster.hosts:
        groups.setdefault(machines.get(h.name, (f"host:{h.name}", 0.0, 0.0))[0], []).append(h.name)
    return list(groups.values())


def calibrate(first: Measured, cluster: Cluster, base: RunOptions, profiles: Profiles,
              int8_gains: dict[str, float] | None = None) -> Calibration:
    """The model corrected by the first run: its serial run, and (when it is a pipeline) the pipeline itself."""
    raw_serial = predict(Candidate(1, 1), cluster, base, profiles)
    serial = first.serial_ips / raw_serial if first.serial_ips and raw_serial else 1.0
    pipeline = 1.0
    if first.candidate.stages > 1 and first.status == "ok" and first.throughput_ips:
        raw = predict(first.candidate, cluster, base, profiles, Calibration(serial, machines=first.machines))
        pipeline = first.throughput_ips / raw if raw else 1.0
    return Calibration(round(serial, 4), round(pipeline, 4), None, dict(first.machines), dict(int8_gains or {}))
