"""A sweep's table: one row per configuration from its rounds (`pictl.jobs.sweep_rounds`), ranked by the
comparison's statistics (`pictl.records.compare_stats`), each naming the one reference every speedup in it divides
by, and the verdicts between neighbours in the ranking; table.csv, table.md and sweep.json.

A row's img/s and speedup are the medians over its rounds with their interval; its speedup is its img/s over
the same round's reference, round by round. Its other figures (latency, bytes on the wire, the waterfall's
dominant term, the bottleneck) are those of its median round's run (`run_id`; every round's in `run_ids`).
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path
from typing import Any

from pictl.records import waterfall_view
from pictl.records.compare_stats import Ranking, Spread
from pictl.records.runs import write_bytes_atomic, write_json_atomic
from pictl.summary_figures import Open, SweepRowRecord
from pictl.summary_models import RunSummary

__all__ = ["COLUMNS", "MD_COLUMNS", "markdown_table", "reference_line", "row_of", "sweep_rows", "verdict_lines",
           "write_table", "write_tables"]

COLUMNS = ("place", "stages", "chunk", "policy", "wire", "status", "throughput_ips", "speedup", "efficiency", "rounds",
           "latency_p50_ms", "throughput_low", "throughput_high", "speedup_low", "speedup_high", "serial_ips",
           "reference", "tied_with", "bytes_per_image", "agreement", "bottleneck_rank", "latency_p95_ms", "dominant",
           "bottleneck", "split_points", "outputs_match", "run_id", "run_ids", "flags", "label", "j_per_image")
"""table.csv's and sweep.json's columns (place: 1 + how many configurations are faster beyond the noise, so ties
share one; throughput and speedup: medians over rounds, with their interval's ends; serial_ips: the reference's
median; latency: the median round's pipeline's per image, in ms; dominant: the largest loss in its waterfall;
j_per_image: the median round's joules per image, None where a host has no power meter)."""
MD_COLUMNS = ("place", "stages", "chunk", "policy", "wire", "status", "throughput_ips", "speedup", "speedup_interval",
              "efficiency", "rounds", "latency_p50_ms")
"""table.md's columns (speedup_interval: the interval's ends, written `low-high`)."""


class TableRow(SweepRowRecord):
    """A row of sweep.json as this module reads back what it wrote (`Open.view`: each value as written): the
    record's figures and the ranking's, the interval's ends and the lists table.csv and table.md flatten."""

    place: Any = None
    speedup_low: Any = None
    speedup_high: Any = None
    outputs_match: Any = None
    split_points: Any = None
    flags: Any = None
    run_ids: Any = None
    tied_with: Any = None


class SweepReference(Open):
    """sweep.json's `reference`: the one serial reference every speedup divides by (`pictl.jobs.sweep`)."""

    host: Any = None
    line: Any = None
    """`reference_line`: what every speedup divides by, in words (written under the tables)."""


class TableMeta(Open):
    """The parts of sweep.json besides its rows that the tables write under them, each as written."""

    reference: Any = None
    verdicts: Any = None
    """`verdict_lines`: the verdict between each configuration and the next in the ranking."""
    host_lost: Any = None
    """The hosts the sweep lost and went on without (`sweep_rounds.SweepHostLoss`)."""


class LostHost(Open):
    """One of sweep.json's `host_lost`: what the sweep did without the host, in words (`line`)."""

    line: Any = None


def row_of(point: Any, summary: RunSummary | None, error: str | None = None) -> dict[str, Any]:
    """One run's figures as a sweep row takes them (`point`: a `SweepPoint`); the figures over rounds are
    `sweep_rows`'."""
    row: dict[str, Any] = {"stages": point.stages, "chunk": point.chunk, "policy": point.policy, "wire": point.wire}
    if summary is None:
        return {**row, "status": "failed", "error": error}
    s = summary
    busy = [(st.compute_s or 0) + (st.send_s or 0) for st in s.per_stage]
    slowest = max(range(len(busy)), key=busy.__getitem__) if busy else None
    latency, gap = waterfall_view.latency_of(s), waterfall_view.waterfall_of(s)
    pipeline = latency.pipeline if latency else None  # a serial point's latency is its own
    return {**row, "status": s.status, "throughput_ips": s.throughput_ips, "serial_ips": s.serial_ips,
            "speedup": s.speedup, "efficiency": s.efficiency, "bottleneck_rank": slowest,
            "bottleneck": (s.per_stage[slowest].modules or ["-"])[0] if slowest is not None else None,
            "split_points": s.split_points, "outputs_match": s.outputs_match,
            # What crossed the wire per image (all links, one timed pass), and a lossy wire's agreement.
            "bytes_per_image": round(sum(st.bytes_sent or 0 for st in s.per_stage) / (s.images * (s.repeats or 1)))
            if s.images else None,
            "agreement": s.agreement, "latency_p50_ms": pipeline.p50_ms if pipeline else None,
            "latency_p95_ms": pipeline.p95_ms if pipeline else None, "dominant": gap.dominant if gap else None,
            "run_id": s.run_id, "flags": [f.code for f in s.flags], **({"error": error} if error else {}),
            # (a serial point's energy is its serial run's: it ran no pipeline)
            "j_per_image": (s.energy.pipeline_j_per_image if s.stages * s.replicas > 1 else s.energy.serial_j_per_image)
            if s.energy else None}


def sweep_rows(points: list[Any], labels: list[str], runs: dict[str, list[Any]], ranking: Ranking,
               reference: str, retired: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per point (`runs`: its label's `RoundRun`s, in round order), fastest first by place and median
    speedup; `reference` names the reference in every row. `retired`: configurations a lost host left no room,
    and why (status `retired` where none of their runs failed)."""
    entries = {e.name: e for e in ranking.entries}
    rows = []
    for point, label in zip(points, labels, strict=True):
        mine = runs.get(label, [])
        measured = [r for r in mine if r.ips is not None]
        typical = _median_run(measured) or (mine[-1] if mine else None)
        row = row_of(point, typical.summary if typical else None, typical.error if typical else None)
        failed = [r for r in mine if r.ips is None]
        entry = entries.get(label)
        speedup = entry.speedup if entry else None
        throughput = entry.throughput if entry else None
        ranks = (point.stages or 1) * max(1, getattr(typical.summary, "replicas", 1) if typical and typical.summary
                                          else 1)
        row.update({
            "label": label, "place": entry.place if entry and measured else None,
            "status": "ok" if mine and not failed else "interrupted" if any(r.error == "interrupted" for r in failed)
            else "failed",
            "rounds": len(measured), "throughput_ips": _r(throughput.median if throughput else None),
            "throughput_low": _r(throughput.low if throughput else None),
            "throughput_high": _r(throughput.high if throughput else None),
            "speedup": _r(speedup.median if speedup else None), "speedup_low": _r(speedup.low if speedup else None),
            "speedup_high": _r(speedup.high if speedup else None),
            "efficiency": _r(speedup.median / ranks if speedup else None),
            "serial_ips": _r(ranking.reference.median if ranking.reference else None), "reference": reference,
            "tied_with": list(entry.tied_with) if entry else [],
            "outputs_match": all(r.summary.outputs_match for r in measured if r.summary) if measured else
            TableRow.view(row).outputs_match,  # (the typical run's, as row_of took it)
            "flags": sorted({f.code for r in mine if r.summary for f in r.summary.flags}),
            "run_ids": [r.run_id for r in mine],
            **({"error": "; ".join(f"round {r.round}: {r.error}" for r in failed)} if failed else {}),
        })
        if retired and label in retired:
            row["status"] = "retired" if not failed else row["status"]
            row["error"] = "; ".join(filter(None, [row.get("error"), f"ran no more: {retired[label]}"]))
        rows.append(row)
    return sorted(rows, key=_rank)


def _rank(row: dict[str, Any]) -> tuple[bool, int, float]:
    """The table's order: by place (unplaced last), then the higher median speedup first."""
    r = TableRow.view(row)
    return r.place is None, r.place or 0, -(r.speedup or 0.0)


def _median_run(runs: list[Any]) -> Any:
    """The run whose img/s is the median of `runs`' (the lower of the middle two), None for none."""
    if not runs:
        return None
    middle = statistics.median_low([r.ips for r in runs])
    return next(r for r in runs if r.ips == middle)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def reference_line(host: str, options: Any, spread: Spread | None) -> str:
    """`serial on h0 (chunk 1, 1 thread(s), fp32): 8.12 img/s (7.90-8.31), 3 round(s)`: what every speedup
    divides by."""
    threads = options.threads if options.threads else "all cores'"
    figure = (f"{spread.text(unit=' img/s')}, {spread.rounds} round(s)" if spread else "not measured")
    return f"serial on {host} (chunk {options.chunk}, {threads} thread(s), {options.numerics}): {figure}"


def verdict_lines(ranking: Ranking) -> list[str]:
    """The verdict between each configuration and the next in the ranking (a tie named as a tie)."""
    names = [e.name for e in ranking.entries if e.speedup is not None or e.throughput is not None]
    return [ranking.verdict(a, b).text() for a, b in zip(names, names[1:], strict=False)]


def write_table(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """sweep.json (the rows, `meta`: the reference, rounds and verdicts among it), table.csv and table.md (the
    reference and the verdicts under the table, when `meta` has them)."""
    write_json_atomic(out / "sweep.json", {**meta, "rows": rows})
    flat = [{**r, "split_points": " ".join(v.split_points or []), "flags": " ".join(v.flags or []),
             "run_ids": " ".join(str(i) for i in v.run_ids or []), "tied_with": "; ".join(v.tied_with or []),
             "speedup_interval": _interval(v.speedup_low, v.speedup_high)}
            for r, v in zip(rows, map(TableRow.view, rows), strict=True)]
    written = TableMeta.view(meta)
    reference = SweepReference.view(written.reference) if isinstance(written.reference, dict) else None
    notes = ([f"Every speedup is over one reference, round by round: {reference.line}."]
             if reference is not None and reference.line else [])
    notes += [f"- {line}" for line in written.verdicts or []]
    notes += [f"Host lost: {LostHost.view(loss).line}" for loss in written.host_lost or [] if isinstance(loss, dict)]
    write_tables(out, flat, COLUMNS, MD_COLUMNS, notes)


def _interval(low: Any, high: Any) -> str | None:
    return f"{low:.2f}-{high:.2f}" if isinstance(low, float) and isinstance(high, float) else None


def write_tables(out: Path, rows: list[dict[str, Any]], columns: tuple[str, ...], shown: tuple[str, ...],
                 notes: list[str] | None = None) -> None:
    """A sweep's rows as table.csv (every column) and table.md (the `shown` ones, then `notes`), each written
    whole."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_bytes_atomic(out / "table.csv", text.getvalue().encode())
    below = "\n" + "\n".join(notes) + "\n" if notes else ""
    write_bytes_atomic(out / "table.md", (markdown_table(rows, shown) + below).encode())


def markdown_table(rows: list[dict[str, Any]], shown: tuple[str, ...] = MD_COLUMNS) -> str:
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in shown) + " |")
    return "\n".join(lines) + "\n"

