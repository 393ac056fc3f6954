"""A training job's telemetry folded as it arrives, and the figures its summary reports.

Per step the loss (from the rank that sees it); per epoch the top-1; per rank where its step time went
(`remote.floor.protocol.TRAIN_TIME_KEYS`, adding up to the step's wall time) over the timed steps; and the
check that makes a mode's numbers trustworthy: its first steps' losses against a `single` run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote.floor import protocol as P
from remote.floor.job_records import TrainEnd, TrainEval, TrainStart, TrainStep
from remote.floor.records import Record
from remote.floor.run_records import Error, Outputs, StageReady


@dataclass
class RankTrain:
    rank: int
    host: str
    modules: list[str] = field(default_factory=list)
    params: int = 0
    steps: int = 0
    last_step: int = 0
    times: dict[str, float] = field(default_factory=lambda: dict.fromkeys(P.TRAIN_TIME_KEYS, 0.0))
    """Seconds per category over the timed steps (folded step by step; the end event has the same totals)."""
    end: TrainEnd | None = None
    error: Error | None = None
    compute_s: list[float] = field(default_factory=list)
    """Each timed step's computation (forward and backward) seconds: the time a link's bandwidth is over."""


@dataclass
class TrainTelemetry:
    ranks: dict[int, RankTrain] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    """Step (from 1) -> mean loss over the step's microbatches."""
    step_s: dict[int, float] = field(default_factory=dict)
    """Step -> wall seconds of its slowest rank. Every rank starts a step together, so the step ends when the
    last one does: in a pipeline that is the first stage (its backward comes last), not the rank that sees
    the loss."""
    timed: set[int] = field(default_factory=set)
    evals: list[dict[str, Any]] = field(default_factory=list)
    start: TrainStart | None = None
    outputs: tuple[str, Outputs] | None = None
    """(host, the record) of the rank that wrote the trained model's logits."""

    def _rank(self, host: str, rank: int) -> RankTrain:
        return self.ranks.setdefault(rank, RankTrain(rank, host))

    def apply(self, host: str, record: Record) -> None:
        rank = record.rank
        match record:
            case TrainStart():
                self.start = record
            case StageReady():
                r = self._rank(host, rank)
                r.modules, r.params = list(record.modules), record.params
            case TrainStep():
                r = self._rank(host, rank)
                r.last_step = record.step
                if record.timed:
                    r.steps += 1
                    for key in P.TRAIN_TIME_KEYS:
                        r.times[key] += _seconds((record.times or {}).get(key))
                    r.compute_s.append(sum(_seconds((record.times or {}).get(k)) for k in ("forward_s", "backward_s")))
                self.step_s[record.step] = max(self.step_s.get(record.step, 0.0), float(record.seconds))
                if record.timed:
                    self.timed.add(record.step)
                if record.loss is not None:
                    self.losses[record.step] = float(record.loss)
            case TrainEval():
                self.evals.append({"epoch": record.epoch, "step": record.step, "top1": record.top1,
                                   "correct": record.correct, "total": record.total, "seconds": record.seconds})
            case Outputs():
                self.outputs = (host, record)
            case TrainEnd():
                self._rank(host, rank).end = record
            case Error():
                self._rank(host, rank).error = record

    def first_error(self) -> RankTrain | None:
        failed = [r for r in self.ranks.values() if r.error is not None]
        return min(failed, key=lambda r: r.error.t if r.error else 0.0) if failed else None

    def all_ended(self, ranks: range) -> bool:
        return all(r in self.ranks and self.ranks[r].end is not None for r in ranks)

    def samples_per_s(self, batch_size: int) -> float | None:
        """Samples per second over the timed steps (the warm-up steps left out)."""
        seconds = sum(self.step_s[s] for s in self.timed)
        return round(batch_size * len(self.timed) / seconds, 4) if seconds > 0 else None

    def breakdown(self) -> list[dict[str, Any]]:
        """Per rank: seconds per category over the timed steps, their mean per step and their shares."""
        out = []
        for rank in sorted(self.ranks):
            r = self.ranks[rank]
            total = sum(r.times.values())
            out.append({"rank": rank, "host": r.host, "modules": r.modules, "params": r.params, "steps": r.steps,
                        "seconds": {k: round(v, 6) for k, v in r.times.items()},
                        "per_step_ms": {k.removesuffix("_s"): round(v * 1000 / r.steps, 3) if r.steps else None
                                        for k, v in r.times.items()},
                        "share": {k.removesuffix("_s"): round(v / total, 4) if total else None
                                  for k, v in r.times.items()},
                        "bytes_sent": r.end.bytes_sent if r.end else None,
                        "grad_bytes_sent": r.end.grad_bytes_sent if r.end else None,
                        "allreduce_s": r.end.allreduce_s if r.end else None,
                        "peak_rss_mb": r.end.peak_rss_mb if r.end else None})
        return out


def link_figures(ranks: dict[int, RankTrain], cuts: list[str], wire: Any) -> list[dict[str, Any]]:
    """Per pipeline link (stage r to r + 1), per step: the bytes each way, and on each side the average and
    peak bandwidth as the source defines them: the bytes sent or received over the side's computation time
    (forward and backward) of a step, its mean and its best step. `wire` (`remote.floor.wire.Wire`) names each
    cut's format."""
    out = []
    for r in sorted(ranks)[:-1]:
        sender, receiver = ranks[r], ranks.get(r + 1)
        if receiver is None or sender.end is None or receiver.end is None or not sender.last_step:
            continue
        steps = sender.last_step  # the counters cover every step, the warm-up ones too
        forward = (sender.end.bytes_sent or 0) / steps
        backward = (receiver.end.grad_bytes_sent or 0) / steps

        cut = cuts[r] if r < len(cuts) else None
        out.append({"link": f"{r}->{r + 1}", "cut": cut, "format": str(wire.at(cut)) if cut else str(wire.default),
                    "forward_bytes_per_step": round(forward), "backward_bytes_per_step": round(backward),
                    "sender": _bandwidth(sender, forward + backward),
                    "receiver": _bandwidth(receiver, forward + backward)})
    return out


def _bandwidth(rank: RankTrain, bytes_per_step: float) -> dict[str, float | None]:
    times = [s for s in rank.compute_s if s > 0]
    if not times:
        return {"avg_MBps": None, "peak_MBps": None}
    return {"avg_MBps": round(bytes_per_step / (sum(times) / len(times)) / 1e6, 3),
            "peak_MBps": round(bytes_per_step / min(times) / 1e6, 3)}


def _seconds(value: Any) -> float:
    """A category's seconds from a step's `times` table (a table the host filled: a non-number counts 0)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def agreement(losses: dict[int, float], reference: dict[int, float], steps: int, tolerance: float,
              ) -> dict[str, Any]:
    """The first `steps` losses against the reference's: each step's difference relative to max(1, |loss|)."""
    checked = [s for s in range(1, steps + 1) if s in reference]
    rows = [{"step": s, "loss": losses.get(s), "reference": reference[s],
             "rel_diff": (None if losses.get(s) is None
                          else round(abs(losses[s] - reference[s]) / max(1.0, abs(reference[s])), 8))}
            for s in checked]
    worst = max((r["rel_diff"] for r in rows if r["rel_diff"] is not None), default=None)
    passed = bool(rows) and all(r["rel_diff"] is not None and r["rel_diff"] <= tolerance for r in rows)
    return {"steps": len(rows), "tolerance": tolerance, "max_rel_diff": worst, "passed": passed, "per_step": rows}
