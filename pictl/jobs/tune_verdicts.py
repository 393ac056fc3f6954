"""One candidate as `pictl tune` saw it (`Measured`: predicted, screened by one run, then measured in rounds)
and the verdict on it: kept when its runs end ok and its outputs are bit-identical to the serial run (exact),
or, lossy, when its top-1 agreement with the fp32 serial run (and its accuracy, where the images have labels)
keeps the user's bound. Every speedup divides by the tune's one reference: the fp32 serial run on the named
host at the base's threads and chunk, measured in the same tune (a screening run's by the first run's serial
run, a round's by that round's reference). The serial run itself is a measured row (`reference`): a winner must
beat it beyond the noise, never merely be the fastest of slower ones. Who wins is `pictl.jobs.tune_rounds`'s
decision, made once and marked on the rows (`won`).

A candidate that changes the arithmetic (a chunk or thread count other than the base's) is also compared with
the tune's reference serial run (`Versus`: its logits): it is exact only when bit-identical to it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pictl.cluster.hoststate import capacity
from pictl.jobs.tune_model import Machines
from pictl.jobs.tune_space import Candidate
from pictl.summary_models import RunSummary


@dataclass(frozen=True)
class Versus:
    """A run's outputs against the tune's reference serial run (the base configuration, fp32)."""

    max_abs_diff: float | None
    """None: the two logit files differ in size (nothing comparable)."""
    agreement: float | None
    """Share of images whose top-1 class is the reference's."""
    serial_ips: float | None
    accuracy: float | None


@dataclass(frozen=True)
class RoundRun:
    """One of a candidate's measurements in the tune's rounds, against that round's reference serial run."""

    round: int
    run_id: str | None
    ips: float
    reference_ips: float
    """That round's reference serial run, img/s (the reference's own row: its own img/s)."""
    speedup: float
    """`ips` over `reference_ips`: what the rounds' median and interval are taken over."""

    @classmethod
    def of(cls, round_no: int, run_id: str | None, ips: float, reference_ips: float) -> RoundRun:
        return cls(round_no, run_id, ips, reference_ips, round(ips / reference_ips, 4))


@dataclass
class Measured:
    """One candidate as the tune saw it: predicted, screened by one run, then (a finalist) measured in rounds
    against the reference; its figures and verdict. `throughput_ips` and `speedup_vs_fp32` are the rounds'
    medians once it has rounds, its screening run's before."""

    candidate: Candidate
    predicted_ips: float | None = None
    run_id: str | None = None
    status: str | None = None
    throughput_ips: float | None = None
    speedup_vs_fp32: float | None = None
    """Against the tune's reference (the fp32 serial run of the base configuration on the named host): numerics,
    threads, chunk and parallelism together; the median over its rounds once it has rounds."""
    interval: list[float] | None = None
    """[low, high]: the interval of that speedup over its rounds (None: not measured in rounds, or too few)."""
    speedup_own: float | None = None
    """Against its own serial run (same numerics, threads and chunk): what parallelism alone gained."""
    agreement_vs_fp32: float | None = None
    identical: bool | None = None
    """Bit-identical to the tune's reference serial run (None: not compared, its arithmetic is the base's)."""
    max_abs_diff_vs_reference: float | None = None
    accuracy: float | None = None
    """Top-1 on labelled images, and the fp32 serial run's (None without labels)."""
    fp32_accuracy: float | None = None
    latency_p50_ms: float | None = None
    machines: Machines = field(default_factory=dict)
    """The run's hosts: [machine (boot id), its CPUs, the host's cap] (`Calibration.machines`)."""
    serial_ips: float | None = None
    """The fp32 serial run's img/s its own run measured or reused (where it changes the arithmetic: the tune's
    reference); never what `speedup_vs_fp32` divides by unless it is the reference."""
    split_points: list[str] = field(default_factory=list)
    kept: bool = False
    why: str = ""
    reference: bool = False
    """The tune's reference serial run (one copy on one host): shown among the rows, never the winner."""
    screening_ips: float | None = None
    """Its screening run's img/s (the one run that chose the finalists), kept once the rounds replace it."""
    screening_speedup: float | None = None
    rounds: list[RoundRun] = field(default_factory=list)
    """Its measurements in the tune's rounds, each against its round's reference."""
    compared: str = ""
    """What the rounds said of it: against the row ranked under it, or why it leaves the rounds."""
    won: bool = False
    """The tune's decision (`pictl.jobs.tune_rounds.decide`): the configuration it saves."""

    @property
    def exact(self) -> bool:
        """Exact by construction and, where it changes the arithmetic, bit-identical to the reference."""
        return not self.candidate.lossy and self.identical is not False

    def row(self) -> dict[str, Any]:
        c = self.candidate
        return {"candidate": c.label, **asdict(c), "exact": self.exact,
                **{k: v for k, v in asdict(self).items() if k not in ("candidate", "machines")}}


def judge(m: Measured, summary: RunSummary | None, min_agreement: float, versus: Versus | None = None,
          *, allow_loss: bool = False, reference_ips: float | None = None) -> None:
    """Fill `m` from its screening run's summary (None: it ended before it had one) and decide whether it may
    win; `versus`: its outputs against the tune's reference, for a candidate that changes the arithmetic;
    `reference_ips`: the tune's reference serial run, which its speedup divides by (None: the first run, whose
    own serial run is the reference)."""
    c = m.candidate
    if summary is None:
        m.status, m.kept, m.why = "failed", False, "its run failed"
        return
    s, n = summary, summary.numerics
    m.run_id, m.status = s.run_id, s.status
    m.throughput_ips, m.split_points, m.speedup_own = s.throughput_ips, list(s.split_points), s.speedup
    m.accuracy = s.accuracy
    if c.numerics != "fp32":
        m.speedup_vs_fp32 = n.speedup_vs_fp32 if n else None
        m.agreement_vs_fp32 = n.agreement_vs_fp32 if n else None
        m.serial_ips, m.fp32_accuracy = (n.fp32_serial_ips, n.fp32_serial_accuracy) if n else (None, None)
    else:
        m.speedup_vs_fp32, m.serial_ips, m.fp32_accuracy = s.speedup, s.serial_ips, s.serial_accuracy
        m.agreement_vs_fp32 = s.agreement if c.lossy else 1.0 if s.outputs_match else None
    if versus is not None:
        diff = versus.max_abs_diff
        m.identical, m.max_abs_diff_vs_reference = diff == 0.0, diff
        m.agreement_vs_fp32, m.serial_ips, m.fp32_accuracy = versus.agreement, versus.serial_ips, versus.accuracy
        m.speedup_vs_fp32 = (round(m.throughput_ips / versus.serial_ips, 3)
                             if m.throughput_ips and versus.serial_ips else None)
    if reference_ips and m.throughput_ips:  # one reference for every row, never the run's own baseline
        m.speedup_vs_fp32 = round(m.throughput_ips / reference_ips, 4)
    m.screening_ips, m.screening_speedup = m.throughput_ips, m.speedup_vs_fp32
    pipeline = s.latency.pipeline if s.latency else None
    m.latency_p50_ms = pipeline.p50_ms if pipeline else None
    for name, record in s.hosts.items():
        if record.state and record.state.cpus:
            m.machines[name] = (record.state.boot_id or name, float(record.state.cpus),
                                capacity(record.state.model_dump(exclude_none=True)))
    m.kept, m.why = _verdict(m, s, min_agreement, allow_loss)


def judge_serial(m: Measured, summary: RunSummary) -> None:
    """Fill `m`, the 1x1 row at the base's threads and chunk, from the tune's first run's serial run (the
    reference every speedup divides by): measured there, so a row of its own, at 1x by definition."""
    if not summary.serial_ips:
        return
    serial = summary.latency.serial if summary.latency else None
    m.run_id, m.status, m.throughput_ips, m.serial_ips = summary.run_id, "ok", summary.serial_ips, summary.serial_ips
    m.speedup_vs_fp32 = m.speedup_own = m.agreement_vs_fp32 = 1.0
    m.accuracy = m.fp32_accuracy = summary.serial_accuracy
    m.latency_p50_ms = serial.p50_ms if serial else None
    m.kept, m.reference = True, True
    m.screening_ips, m.screening_speedup = m.throughput_ips, 1.0
    m.why = f"the serial run (measured in {summary.run_id}): the reference every speedup is against"


def _verdict(m: Measured, s: RunSummary, min_agreement: float, allow_loss: bool) -> tuple[bool, str]:
    if m.status != "ok":
        return False, "its run failed" + (f": {s.error.message}" if s.error and s.error.message else "")
    if not s.outputs_match:
        return False, "outputs differ from its serial run"
    if m.exact:
        return True, "bit-identical"
    if not m.candidate.lossy and not allow_loss:
        diff = m.max_abs_diff_vs_reference
        return False, ("outputs differ from the reference serial run's"
                       + (f" by up to {diff:.1e}" if diff is not None else " (not comparable)")
                       + ": exact only with --allow-loss's bound")
    if m.agreement_vs_fp32 is None or m.agreement_vs_fp32 < min_agreement:
        return False, f"top-1 agreement with fp32 {m.agreement_vs_fp32} is below {min_agreement}"
    if m.accuracy is not None and m.fp32_accuracy and m.accuracy < min_agreement * m.fp32_accuracy:
        # With labels, the accuracy is bounded too: it keeps at least that share of the fp32 serial run's.
        return False, (f"accuracy {m.accuracy} keeps less than {min_agreement} of the fp32 serial run's "
                       f"{m.fp32_accuracy}")
    return True, f"agreement {m.agreement_vs_fp32} >= {min_agreement}"


def _score(m: Measured) -> tuple[float, float]:
    """What ranks a measured candidate: its speedup over the tune's one reference (the rounds' median once it
    has rounds: each round's img/s over that round's reference, so load that comes and goes hits every row
    alike), then its img/s."""
    return m.speedup_vs_fp32 or 0.0, m.throughput_ips or 0.0


def ranked(rows: list[Measured]) -> list[Measured]:
    """The rows measured in rounds first, best first (`_score`), then the rest measured once (screening), then
    the predicted rest, best predicted first."""
    return sorted(rows, key=lambda m: (m.throughput_ips is None, not m.rounds, *(-x for x in _score(m)),
                                       -(m.predicted_ips or 0.0)))


def best_kept(rows: list[Measured]) -> Measured | None:
    """The kept candidate ranked first (`ranked`; an exact one first in a tie), whether or not it beats the
    serial run (the best pipeline is shown beside the winner even when it is slower)."""
    kept = [m for m in rows if m.kept and m.throughput_ips and not m.reference]
    return min(kept, key=lambda m: (not m.rounds, *(-x for x in _score(m)), not m.exact), default=None)


def winner(rows: list[Measured]) -> Measured | None:
    """The configuration the tune decided on (`won`, set once by `pictl.jobs.tune_rounds.decide`): None while
    it runs, and when no candidate beat the serial run beyond the noise (nothing is saved)."""
    return next((m for m in rows if m.won), None)
