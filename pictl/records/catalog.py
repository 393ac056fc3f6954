"""Runs as data: every run directory under the runs root, found by id, filtered, compared and exported.

What `pictl runs`, `pictl report`, `pictl traces` and the dashboard's history share: one way to turn a
run reference (an id, a unique id prefix, or a directory) into its directory, one row per run with the
figures people sort and filter by, and one set of columns for side-by-side comparison and CSV.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from pictl.errors import ConfigError
from pictl.records.runs import CONFIG_FILE, SUMMARY_FILE
from pictl.summary import baseline_text

COLUMNS = ("run_id", "started", "status", "model", "stages", "policy", "chunk", "images", "split", "throughput_ips",
           "serial_ips", "speedup", "efficiency", "outputs_match", "wire", "agreement", "accuracy", "baseline", "flags",
           "run_dir")
"""What a row holds, in the order `runs`, `compare` and the CSV show it."""
SORT_KEYS = ("started", "speedup", "throughput_ips", "stages", "status")


def resolve_run(root: Path, ref: str) -> Path:
    """The run directory `ref` names: a directory (with a config or summary), an id under `root`, or a prefix
    of exactly one id there (`20261123-1810`)."""
    given = Path(ref).expanduser()
    if given.is_dir() and _is_run_dir(given):
        return given
    if "/" not in ref and ref not in (".", ".."):
        exact = root / ref
        if exact.is_dir() and _is_run_dir(exact):
            return exact
        matches = [p for p in sorted(root.glob(f"{ref}*/")) if _is_run_dir(p)] if root.is_dir() else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ConfigError(f"run '{ref}': {len(matches)} runs start so in {root} "
                              f"({', '.join(p.name for p in matches[:4])}{', ...' if len(matches) > 4 else ''})")
    raise ConfigError(f"run '{ref}': no such run (not a run directory, nor an id in {root}; see `pictl runs`)")


def _is_run_dir(path: Path) -> bool:
    return (path / SUMMARY_FILE).is_file() or (path / CONFIG_FILE).is_file() or (path / "sweep.json").is_file()


def load_runs(root: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Summaries of the runs under `root`, newest first; a run without a readable summary is listed as such.
    Trace grabs another process made (`pictl traces`) are on disk but not in the summary: added here."""
    paths = sorted((p for p in root.glob("*/") if (p / CONFIG_FILE).is_file() or (p / SUMMARY_FILE).is_file()),
                   reverse=True) if root.is_dir() else []
    runs = []
    for path in paths[:limit]:
        try:
            summary = json.loads((path / SUMMARY_FILE).read_text())
            if not isinstance(summary, dict):
                raise ValueError("not an object")
        except (OSError, ValueError):
            summary = {"status": "no summary (running or lost)", "run_id": path.name}
        summary.setdefault("run_dir", str(path))
        summary.setdefault("run_id", path.name)
        known = {g.get("directory") for g in summary.get("traces") or []}
        for grab_file in sorted(path.glob("traces*/summary.json")):
            try:
                grab = json.loads(grab_file.read_text())
            except (OSError, ValueError):
                continue
            if grab.get("directory") not in known:
                summary["traces"] = [*(summary.get("traces") or []), grab]
        runs.append(summary)
    return runs


def row(summary: dict[str, Any]) -> dict[str, Any]:
    """One run's comparable figures (None where the run did not get that far)."""
    baseline = summary.get("baseline") or {}
    wire = summary.get("wire") or {}
    started = summary.get("started_at")
    return {
        "run_id": summary.get("run_id"),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if started else None,
        "status": summary.get("status"),
        "model": summary.get("model"),
        "stages": summary.get("stages"),
        "policy": summary.get("policy"),
        "chunk": summary.get("chunk"),
        "images": summary.get("images"),
        "split": ",".join(summary.get("split_points") or []) or None,
        "throughput_ips": _rounded(summary.get("throughput_ips")),
        "serial_ips": _rounded(summary.get("serial_ips")),
        "speedup": _rounded(summary.get("speedup"), 3),
        "efficiency": _rounded(summary.get("efficiency"), 3),
        "outputs_match": summary.get("outputs_match"),
        # A lossy wire's runs pass by top-1 agreement, never by identity: the row says which wire it was.
        "wire": f"{wire.get('format')}{' (lossy wire)' if wire.get('lossy') else ''}" if wire else None,
        "agreement": summary.get("agreement"),
        "accuracy": summary.get("accuracy"),
        "baseline": ("reused" if baseline.get("reused") else "measured") if baseline else None,
        "flags": ",".join(dict.fromkeys(f.get("code", "?") for f in summary.get("flags") or [])) or None,
        "run_dir": summary.get("run_dir"),
    }


def _rounded(value: Any, digits: int = 2) -> Any:
    return round(value, digits) if isinstance(value, float) else value


@dataclass(frozen=True)
class RunFilter:
    """`pictl runs`' filters; None matches anything."""

    since: str | None = None
    """A date (2026-11-23) or date and time; runs started at or after it."""
    stages: int | None = None
    policy: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None:
            _since_epoch(self.since)  # refused here, before anything is listed

    def matches(self, r: dict[str, Any]) -> bool:
        return ((self.stages is None or r["stages"] == self.stages)
                and (self.policy is None or r["policy"] == self.policy)
                and (self.status is None or str(r["status"]).startswith(self.status))
                and (self.since is None or (r["started"] or "") >= _normal(self.since)))


def _normal(since: str) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_since_epoch(since)))


def _since_epoch(since: str) -> float:
    for pattern in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"):
        try:
            return time.mktime(time.strptime(since, pattern))
        except ValueError:
            continue
    raise ConfigError(f"--since: {since!r} is not a date (2026-11-23) or a date and time (2026-11-23 18:05)")


def table_rows(root: Path, where: RunFilter, sort: str = "started", reverse: bool = True) -> list[dict[str, Any]]:
    if sort not in SORT_KEYS:
        raise ConfigError(f"--sort: {sort!r} is not one of {', '.join(SORT_KEYS)}")
    rows = [r for r in map(row, load_runs(root)) if where.matches(r)]
    # None sorts last whichever way: a failed run has no speedup, and it is not the best one.
    present = sorted((r for r in rows if r[sort] is not None), key=lambda r: r[sort], reverse=reverse)
    return present + [r for r in rows if r[sort] is None]


def compare_rows(paths: list[Path]) -> list[dict[str, Any]]:
    """The named runs' rows, in the order given (`pictl runs compare A B`)."""
    rows = []
    for path in paths:
        found = load_runs(path.parent)
        summary = next((s for s in found if Path(s["run_dir"]).resolve() == path.resolve()), None)
        if summary is None or "no summary" in str(summary.get("status")):
            raise ConfigError(f"run '{path.name}': no summary yet (still running, or cut short)")
        rows.append(row(summary))
    return rows


def to_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r[k] is None else r[k] for k in COLUMNS})
    return out.getvalue()


def fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _outputs(s: dict[str, Any]) -> str:
    wire = s.get("wire") or {}
    if not wire.get("lossy"):
        return str(s.get("outputs_match"))
    agreed = fmt(s.get("agreement"), ".2%")
    return f"{s.get('outputs_match')} (lossy wire {wire.get('format')}: top-1 agreement {agreed})"


def run_details(s: dict[str, Any]) -> Table:
    """One run as label/value lines: `pictl runs show` and the dashboard's history."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in (("run", s.get("run_id")), ("status", s.get("status")), ("directory", s.get("run_dir")),
                         ("model", s.get("model")), ("stages", s.get("stages")),
                         ("split", ", ".join(s.get("split_points") or []) or "-"), ("policy", s.get("policy")),
                         ("pipeline", f"{fmt(s.get('throughput_ips'))} img/s"),
                         ("serial", f"{fmt(s.get('serial_ips'))} img/s{baseline_text(s)}"),
                         ("speedup", f"{fmt(s.get('speedup'))}x"),
                         ("outputs match", _outputs(s)), ("accuracy", s.get("accuracy"))):
        grid.add_row(label, "-" if value is None else str(value))
    if s.get("error"):
        grid.add_row(Text("error", style="red"), Text(str(s["error"].get("message")), style="red"))
    for i, flag in enumerate(s.get("flags") or []):
        grid.add_row(Text("flags" if i == 0 else "", style="bold yellow"),
                     Text(f"{flag['code']}: {flag['message']}", style="yellow"))
    for st in s.get("per_stage", []):
        grid.add_row(f"stage {st['rank']}", f"{st.get('host')}  compute {fmt(st.get('compute_s'))}s  "
                     f"wait {fmt(st.get('wait_s'))}s  send {fmt(st.get('send_s'))}s")
    for grab in s.get("traces", []):
        grid.add_row("traces", str(grab.get("timeline") or grab.get("directory")))
        for rank, share in sorted(grab.get("per_rank", {}).items()):
            grid.add_row("", f"rank {rank}: compute {share['compute_pct']:.0f}%  send {share['send_pct']:.0f}%  "
                             f"recv-wait {share['recv_wait_pct']:.0f}%  idle {share['idle_pct']:.0f}%")
    return grid
