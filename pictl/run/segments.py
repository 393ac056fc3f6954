"""A run made of segments: each one split on its hosts over a window of timed passes, with what it measured and
how it ended. Every pipeline run has at least one (a serial-only run has none); a re-cut ends a segment and opens
the next, and so does a host lost mid-run (`HostLoss`: the next segment runs on the hosts left,
`pictl.run.continuation`).

The re-cut is decided here, on the controller, from what it already receives: after each timed pass of a
`balanced` run that re-cuts, rank 0 reports every stage's compute per microbatch (`PassWatched`); the watch
(`remote.floor.recut.Watch`, started from what refinement ended on) judges it, and the answer goes back to
rank 0 as a file it waits for (`protocol.recut_decision_file`). The hosts keep only the mechanism: measure,
wait, rebuild. What the watch decided is recorded as the ranks' records were before (`Recut`, then `Refined`
with the corrected factors), so every view and the profile corrections read it as they did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from remote.floor.balance import evaluate
from remote.floor.records import Record
from remote.floor.recut import RecutDecision, Watch, to_ms, watch_of
from remote.floor.run_records import PassWatched, Recut, Refined
from remote.floor.spec import RefineSpec


@dataclass
class Segment:
    """One split on its hosts over timed passes `first_pass`..`last_pass` (0-based, inclusive)."""

    split_points: list[str]
    hosts: list[str]
    """The host of each stage, in order."""
    first_pass: int = 0
    last_pass: int | None = None
    """None while it runs (the run's last segment ends with the run)."""
    ended_by: str | None = None
    """`re-cut` (the watch moved the cut after its last pass), `host-lost` (a host of it was lost: the run went on
    without it), or None: it ran to the run's end."""
    lost_host: str | None = None
    """The host whose loss ended it (`host-lost`)."""


@dataclass
class Segments:
    """The run's segments as they happen (the session's `Logbook` holds them)."""

    items: list[Segment] = field(default_factory=list)

    def begin(self, split_points: Sequence[str], hosts: Sequence[str]) -> None:
        """The timed passes begin on this split (a run's first segment)."""
        self.items = [Segment(list(split_points), list(hosts))]

    def refined(self, split_points: Sequence[str]) -> None:
        """Refinement, before the first timed pass, chose the split the first segment runs."""
        if self.items and self.items[-1].first_pass == 0:
            self.items[-1].split_points = list(split_points)

    def cut(self, after_pass: int, split_points: Sequence[str]) -> None:
        """The split moves after timed pass `after_pass`: this segment ends there, the next begins."""
        current = self.items[-1]
        current.last_pass, current.ended_by = after_pass, "re-cut"
        self.items.append(Segment(list(split_points), list(current.hosts), first_pass=after_pass + 1))

    def ran(self, split_points: Sequence[str]) -> None:
        """The ranks said where their stages began: the split of a segment the hosts planned (`equal`'s)."""
        if self.items and not self.items[-1].split_points:
            self.items[-1].split_points = list(split_points)

    def host_lost(self, host: str, completed: int, split_points: Sequence[str], hosts: Sequence[str]) -> None:
        """`host` was lost after `completed` timed passes of the run: this segment ends with the last of them (none
        of its own, if it completed none), and the next runs the rest on `hosts`."""
        current = self.items[-1]
        current.last_pass, current.ended_by, current.lost_host = completed - 1, "host-lost", host
        self.items.append(Segment(list(split_points), list(hosts), first_pass=completed))

    def summary(self, pass_ips: Sequence[float], images: int, serial_ips: float | None,
                planned: Sequence[str]) -> list[dict[str, Any]]:
        """`summary.json`'s `segments`: each one's hosts, split, passes, img/s (mean of its passes) and speedup.
        A split the hosts' plan made (`equal`'s) is `planned`: only a `balanced` split is known before the launch,
        and only a `balanced` run re-cuts."""
        out = []
        for k, seg in enumerate(self.items):
            last = seg.last_pass if seg.last_pass is not None else len(pass_ips) - 1
            ips = list(pass_ips[seg.first_pass:last + 1]) if last >= seg.first_pass else []
            mean = round(sum(ips) / len(ips), 4) if ips else None
            out.append({"index": k, "hosts": seg.hosts, "split_points": seg.split_points or list(planned),
                        "passes": [seg.first_pass, last] if ips else None, "pass_ips": ips,
                        "images": images * len(ips), "ips": mean,
                        "speedup": round(mean / serial_ips, 4) if mean and serial_ips else None,
                        "ended_by": seg.ended_by, "lost_host": seg.lost_host})
        return out


@dataclass
class HostLoss:
    """One host lost during the run, and what it cost: the time from the failure to the next segment's first
    output, and the images computed again (the pass in flight)."""

    host: str
    rank: int | None
    message: str
    completed_passes: int
    """Timed passes finished before the loss (the next segment begins at this one)."""
    stages_before: int
    stages_after: int
    hosts_after: list[str]
    recomputed_images: int
    """The images of the timed pass that was in flight (0: the host was lost before the timed passes)."""
    failed_at: float
    """When the controller saw the launch fail (`time.time()`)."""
    relaunched_at: float | None = None
    """When the next segment's launch began: re-planned and staged."""
    first_output_at: float | None = None
    """When the next segment's first output reached the controller."""

    def to_json(self) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return round(t - self.failed_at, 3) if t is not None else None

        return {"host": self.host, "rank": self.rank, "message": self.message,
                "completed_passes": self.completed_passes, "stages_before": self.stages_before,
                "stages_after": self.stages_after, "hosts_after": self.hosts_after,
                "recomputed_images": self.recomputed_images, "failed_at": round(self.failed_at, 3),
                "replan_s": since(self.relaunched_at), "lost_s": since(self.first_output_at)}


class RecutWatch:
    """The controller's watch over a re-cutting run's timed passes: started from refinement's result, it judges
    each pass rank 0 reports and says what the ranks do next."""

    def __init__(self, refine: RefineSpec, pieces: Sequence[str], segments: Segments, rank0_host: str) -> None:
        self.refine, self.pieces, self.segments, self.host = refine, list(pieces), segments, rank0_host
        self.watch: Watch | None = None
        self.rounds = 0

    def on_refined(self, rec: Refined) -> None:
        """Refinement is over (its `Refined`, `chosen_round` set): the timed passes begin on its split, and the
        watch starts from its corrected factors."""
        if rec.chosen_round is None:
            return
        self.segments.refined(rec.split_points)
        self.rounds = rec.rounds
        if self.refine.recut:
            self.watch = watch_of(self.refine, self._starts(rec.split_points), rec.factors)

    def judge(self, rec: PassWatched) -> tuple[list[Record], list[str] | None]:
        """One timed pass: the records of the decision (none when there was none) and the split the next pass
        runs (None: this one again)."""
        if self.watch is None:
            return [], None
        found = self.watch.observe([ms / 1000 for ms in rec.measured_ms], rec.after_pass)
        if found is None:
            return [], None
        records = self._records(found)
        if not found.moved:
            return records, None
        split = self._named(found.new_starts)
        self.segments.cut(rec.after_pass, split)
        return records, split

    def _records(self, found: RecutDecision) -> list[Record]:
        """The decision as the run records it: why and what moved (`Recut`), then the corrected factors and the
        prediction of the split that runs now (`Refined`: the controller keeps the corrections with each host's
        profile, as after refinement)."""
        assert self.watch is not None
        now = evaluate(self.watch.table.corrected(self.watch.factors), found.new_starts)
        old, new = self._named(found.old_starts), self._named(found.new_starts)
        made: list[Record] = [
            Recut(after_pass=found.after_pass, reason=found.reason, split_points=old, next_split=new,
                  moved=found.moved, measured_ms=to_ms(found.measured_s), expected_ms=to_ms(found.expected_s),
                  predicted_ms=to_ms(found.old_predicted_s), next_predicted_ms=to_ms(found.new_predicted_s),
                  factors=[round(x, 4) for x in found.factors]),
            Refined(rounds=self.rounds, split_points=new, predicted_ms=to_ms(now.stage_s), link_ms=to_ms(now.link_s),
                    factors=[round(f, 4) for f in self.watch.factors])]
        t = round(time.time(), 6)
        return [replace(r, t=t, rank=0, role="controller", host=self.host) for r in made]

    def _starts(self, split_points: Sequence[str]) -> tuple[int, ...]:
        return tuple(self.pieces.index(name) for name in split_points)

    def _named(self, starts: Sequence[int]) -> list[str]:
        return [self.pieces[i] for i in starts]
