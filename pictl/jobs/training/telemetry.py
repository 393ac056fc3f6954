"""A training job's telemetry folded as it arrives, and the figures its summary reports.

Per step the loss (from the rank that sees it); per epoch the top-1; per rank where its step time went
(`remote.protocol.TRAIN_TIME_KEYS`, adding up to the step's wall time) over the timed steps; and the
check that makes a mode's numbers trustworthy: its first steps' losses against a `single` run's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote import protocol as P


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
    end: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


@dataclass
class TrainTelemetry:
    ranks: dict[int, RankTrain] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    """Step (from 1) -> mean loss over the step's microbatches."""
    step_s: dict[int, float] = field(default_factory=dict)
    """Step -> wall seconds on the rank that reports the loss."""
    timed: set[int] = field(default_factory=set)
    evals: list[dict[str, Any]] = field(default_factory=list)
    start: dict[str, Any] | None = None
    outputs: tuple[str, dict[str, Any]] | None = None
    """(host, the event) of the rank that wrote the trained model's logits."""

    def _rank(self, host: str, rank: int) -> RankTrain:
        return self.ranks.setdefault(rank, RankTrain(rank, host))

    def apply(self, host: str, record: dict[str, Any]) -> None:
        kind, rank = record[P.KEY_EVENT], int(record.get(P.KEY_RANK) or 0)
        if kind == P.TRAIN_START:
            self.start = record
        elif kind == P.STAGE_READY:
            r = self._rank(host, rank)
            r.modules, r.params = list(record.get("modules") or []), int(record.get("params") or 0)
        elif kind == P.TRAIN_STEP:
            r = self._rank(host, rank)
            r.last_step = int(record["step"])
            if record.get("timed"):
                r.steps += 1
                for key in P.TRAIN_TIME_KEYS:
                    r.times[key] += float(record["times"].get(key, 0.0))
            if "loss" in record:
                step = int(record["step"])
                self.losses[step] = float(record["loss"])
                self.step_s[step] = float(record["seconds"])
                if record.get("timed"):
                    self.timed.add(step)
        elif kind == P.TRAIN_EVAL:
            self.evals.append({k: record.get(k) for k in ("epoch", "step", "top1", "correct", "total", "seconds")})
        elif kind == P.OUTPUTS:
            self.outputs = (host, record)
        elif kind == P.TRAIN_END:
            self._rank(host, rank).end = record
        elif kind == P.ERROR:
            self._rank(host, rank).error = record

    def first_error(self) -> RankTrain | None:
        failed = [r for r in self.ranks.values() if r.error is not None]
        return min(failed, key=lambda r: r.error["t"] if r.error else 0) if failed else None

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
            end = r.end or {}
            out.append({"rank": rank, "host": r.host, "modules": r.modules, "params": r.params, "steps": r.steps,
                        "seconds": {k: round(v, 6) for k, v in r.times.items()},
                        "per_step_ms": {k.removesuffix("_s"): round(v * 1000 / r.steps, 3) if r.steps else None
                                        for k, v in r.times.items()},
                        "share": {k.removesuffix("_s"): round(v / total, 4) if total else None
                                  for k, v in r.times.items()},
                        "bytes_sent": end.get("bytes_sent"), "allreduce_s": end.get("allreduce_s"),
                        "peak_rss_mb": end.get("peak_rss_mb")})
        return out


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
