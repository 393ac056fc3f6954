"""`pictl report RUN_OR_SWEEP...`: a Markdown report with tables and charts, from what runs left on disk.

With pruned models among the sources (runs made with `--model ARTIFACT`, or
`pictl prune` job directories): a table of every model's parameters, MACs, top-1,
serial throughput and pipeline speedup, all against the unpruned serial baseline.
For a run: the headline figures, the serial baseline's age (and why a cached one
was not reused), the run's sanity flags, the per-stage table (with the balanced policy's
prediction where there is one), a stacked chart of each stage's time (computing,
waiting for input, blocked sending), and each link's bytes/s, average over the
timed passes and the fastest pass. For a sweep: its table and plots. For training jobs (`pictl train`):
a table of every job by mode, and per job where each rank's step time went, with its loss curve.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pictl import errors as E
from pictl.records.runs import SUMMARY_FILE, read_record, read_run_summary, writable_dir
from pictl.records.train_report import job_section, jobs_table
from pictl.summary import RunSummary, age_text


def _events(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run_dir / "events").glob("*.jsonl")):
        if path.stem == "serial":
            continue
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a crash: the rest still counts
    return out


def link_rates(summary: RunSummary, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bytes/s from each stage to the next: average over the timed passes, and the fastest pass."""
    seconds = {e["repeat"]: e["seconds"] for e in events if e.get("event") == "throughput"}
    links = []
    for st in summary.per_stage[:-1]:
        per_pass = {e["repeat"]: e["bytes_sent"] for e in events if e.get("event") == "progress"
                    and e.get("rank") == st.rank and e.get("phase") == "timed"}
        rates = [per_pass[r] / s for r, s in seconds.items() if r in per_pass and s > 0]
        total_s = sum(seconds.values())
        links.append({"from": f"{st.host} (rank {st.rank})", "to_rank": st.rank + 1,
                      "average_MBps": round((st.bytes_sent or 0) / total_s / 1e6, 2) if total_s else None,
                      "peak_MBps": round(max(rates) / 1e6, 2) if rates else None})
    return links


def stage_chart(summary: RunSummary, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = summary.per_stage
    labels = [f"{st.rank}\n{st.host}" for st in stages]
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stages)), 3.5))
    bottom = [0.0] * len(stages)
    for key, color in (("compute_s", "#4c72b0"), ("wait_s", "#dd8452"), ("send_s", "#55a868")):
        values = [getattr(st, key) or 0.0 for st in stages]
        ax.bar(labels, values, bottom=bottom, label=key.removesuffix("_s"), color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    return _finish(plt, fig, ax, "seconds (timed passes)", "where each stage's time went", path)


def _finish(plt, fig, ax, ylabel: str, title: str, path: Path) -> Path:  # noqa: ANN001
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def wire_chart(summary: RunSummary, path: Path) -> Path:
    """Per link: MB uncompressed beside MB on the wire (the timed passes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert summary.wire is not None
    links = summary.wire.links
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(links)), 3.5))
    xs = range(len(links))
    ax.bar([x - 0.2 for x in xs], [(k.raw_bytes or 0) / 1e6 for k in links], width=0.4, label="fp32")
    ax.bar([x + 0.2 for x in xs], [(k.wire_bytes or 0) / 1e6 for k in links], width=0.4, label="on the wire")
    ax.set_xticks(list(xs), [f"{k.link}\n{k.format}" for k in links])
    return _finish(plt, fig, ax, "MB (timed passes)", "what each link carried", path)


def _wire_lines(s: RunSummary, out: Path) -> list[str]:
    """With `--wire` other than fp32: how the outputs were judged, and each link's bytes and bandwidth."""
    if s.wire is None or s.wire.format == "fp32":
        return []
    judged = (f"**lossy wire** `{s.wire.format}`: top-1 agreement with the serial run {s.agreement} (at least "
              f"{s.wire.min_agreement} passes), mean |logit diff| {s.mean_abs_diff}." if s.wire.lossy
              else f"wire `{s.wire.format}` (exact).")
    lines = [judged, "", "| link | cut | format | MB on the wire | MB raw | ratio | compress s | decompress s | "
                         "average MB/s | peak MB/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k in s.wire.links:
        def mb(v: float | None) -> str:
            return "-" if v is None else f"{v / 1e6:.2f}"
        lines.append(f"| {k.link} | {k.cut} | {k.format} | {mb(k.wire_bytes)} | {mb(k.raw_bytes)} | {k.ratio} | "
                     f"{k.compress_s} | {k.decompress_s} | {mb(k.avg_Bps)} | {mb(k.peak_Bps)} |")
    chart = wire_chart(s, out / f"{s.run_id}-wire.png")
    return [*lines, "", f"![wire bytes per link]({chart.name})", ""]


def _run_section(run_dir: Path, out: Path) -> list[str]:
    s = read_run_summary(run_dir / SUMMARY_FILE)
    extra = s.model_extra or {}
    lines = [f"## Run {s.run_id}", "",
             f"{s.stages} stage(s), policy {s.policy}, split {', '.join(s.split_points) or '-'}; "
             f"{extra.get('images')} images, chunk {extra.get('chunk')}, {extra.get('threads')} thread(s); "
             f"status **{s.status}**.", "",
             "| throughput img/s | serial img/s | speedup | efficiency | outputs match |", "|---|---|---|---|---|",
             f"| {s.throughput_ips} | {s.serial_ips} | {s.speedup} | {s.efficiency} | "
             f"{s.outputs_match} |", "", *_wire_lines(s, out), *_baseline_and_flags(s)]
    if s.stages > 1:
        # Per microbatch: the stage's compute (what `balanced` predicts), and apart from it the time it
        # waited for input and was blocked on sends.
        lines += ["| rank | host | first module | compute ms | wait ms | send ms | MB sent | predicted ms | "
                  "error |", "|---|---|---|---|---|---|---|---|---|"]
        for st in s.per_stage:
            mb = None if st.bytes_sent is None else round(st.bytes_sent / 1e6, 1)
            error = st.prediction_error
            lines.append(f"| {st.rank} | {st.host} | {(st.modules or ['-'])[0]} | {st.measured_ms} | "
                         f"{st.wait_ms} | {st.send_ms} | {mb} | {st.predicted_ms} | "
                         f"{'-' if error is None else format(error, '+.1%')} |")
        for r in (extra.get("refine") or {}).get("rounds", []):
            then = f"next {', '.join(r['next_split'])}" if r.get("next_split") else "kept"
            lines.append(f"\nrefinement round {r['round']}: split {', '.join(r['split_points'])}, predicted "
                         f"{r['predicted_ms']} ms, measured {r['measured_ms']} ms per stage; {then}.")
        chart = stage_chart(s, out / f"{s.run_id}-stages.png")
        lines += ["", f"![per-stage time]({chart.name})", "", "| link | average MB/s | fastest pass MB/s |",
                  "|---|---|---|"]
        for link in link_rates(s, _events(run_dir)):
            lines.append(f"| {link['from']} -> rank {link['to_rank']} | {link['average_MBps']} | "
                         f"{link['peak_MBps']} |")
    return [*lines, ""]


def _baseline_and_flags(s: RunSummary) -> list[str]:
    """How old the serial baseline is, whether it was reused (or why not), and the run's sanity flags."""
    base = s.baseline
    lines = []
    if base and s.serial_reused:
        lines += [f"Serial baseline: reused, measured on {base.host} {age_text(base.age_s)} before this run.", ""]
    elif base:
        why = f"; a cached one was not reused: {base.not_reused_because}" if base.not_reused_because else ""
        lines += [f"Serial baseline: measured on {base.host} for this run{why}.", ""]
    if s.flags:
        lines += ["**Sanity flags** (these numbers are suspect):", "",
                  *(f"- `{f.code}`: {f.message}" for f in s.flags), ""]
    elif "flags" in s.model_fields_set:
        lines += ["No sanity flags.", ""]
    return lines


def _sweep_section(sweep_dir: Path, out: Path) -> list[str]:
    lines = [f"## Sweep {sweep_dir.name}", "", (sweep_dir / "table.md").read_text(), ""]
    for png in sorted(sweep_dir.glob("*.png")):
        target = out / f"{sweep_dir.name}-{png.name}"
        shutil.copyfile(png, target)
        lines += [f"![{png.stem}]({target.name})", ""]
    return lines


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def models_section(runs: list[dict[str, Any]], prunes: list[dict[str, Any]]) -> list[str]:
    """The course's Part 3 table: each model's size, accuracy, serial throughput and pipeline speedup,
    all speedups against the unpruned model's serial baseline (the same yardstick for every row)."""
    rows: dict[str, dict[str, Any]] = {}
    for job in prunes:
        key = job["artifact"]
        rows.setdefault(key, {"name": f"pruned {job['importance']} {job['ratio']}", **job})
        rows.setdefault("base", {"name": f"{job['base_model']} (unpruned)", "params": job["params_base"],
                                 "macs": job["macs_base"], "top1": job["top1_before"]})
    for run in runs:
        art = run.get("artifact")
        key = art["path"] if art else "base"
        row = rows.setdefault(key, {"name": f"pruned {art['importance']} {art['ratio']}" if art
                                    else f"{run['model']} (unpruned)"})
        if art:
            row.update({k: art[k] for k in ("params", "macs", "top1_pruned")}, top1=art["top1"])
            rows.setdefault("base", {"name": f"{art['base_model']} (unpruned)"}).update(
                params=art["params_base"], macs=art["macs_base"], top1=art["top1_before"])
        row["serial_ips"] = run["serial_ips"] or row.get("serial_ips")
        if run["stages"] > 1 and run["status"] == "ok":
            row.setdefault("pipelines", []).append((run["stages"], run["throughput_ips"], run["serial_ips"]))
    if len(rows) < 2:
        return []
    base_serial = rows.get("base", {}).get("serial_ips")
    lines = ["## Models: pruned against unpruned", "",
             "Top-1 is measured on the pruning job's held-out data; speedups are against the unpruned "
             "model's serial throughput" + ("" if base_serial else " (no unpruned run given: own serial)") + ".",
             "", "| model | parameters | GMACs | top-1 after pruning | top-1 | serial img/s | serial vs unpruned | "
             "pipeline stages: speedup |", "|---|---|---|---|---|---|---|---|"]
    for key in ["base", *sorted(k for k in rows if k != "base")]:
        r = rows.get(key)
        if r is None:
            continue
        serial = r.get("serial_ips")
        # Speedup against the unpruned serial run when there is one, else against the run's own.
        pipes = ", ".join(f"{n}: {ips / (base_serial or own):.2f}x"
                          for n, ips, own in sorted(r.get("pipelines", [])) if ips and (base_serial or own))
        size = (f"{r['params']:,} | {r['macs'] / 1e9:.2f}" if r.get("params") else "- | -")
        vs_base = f"{serial / base_serial:.2f}x" if serial and base_serial else "-"
        lines.append(f"| {r['name']} | {size} | {_pct(r.get('top1_pruned'))} | {_pct(r.get('top1'))} | "
                     f"{serial or '-'} | {vs_base} | {pipes or '-'} |")
    return [*lines, ""]


def _load(src: Path) -> dict[str, Any]:
    path = src / SUMMARY_FILE
    summary = read_record(path)
    if "run_id" in summary:
        return read_run_summary(path).model_dump(mode="json", by_alias=True, exclude_unset=True)
    if not isinstance(summary.get("job_id"), str):
        raise E.ConfigError(f"{path}: neither a run's nor a pruning job's summary, nor a training job's "
                            "(no run_id, no job_id)")
    return summary


def write_report(sources: list[Path], out: Path) -> Path:
    """report.md (and its charts) in `out`; every source is checked before anything is written."""
    writable_dir(out, "--out")
    for src in sources:
        if not ((src / SUMMARY_FILE).is_file() or (src / "sweep.json").is_file()):
            raise E.ConfigError(f"{src}: not a run directory (summary.json), a sweep directory (sweep.json) "
                                f"or a pruning job")
    summaries = {src: _load(src) for src in sources if (src / SUMMARY_FILE).is_file()}
    trains = [s for s in summaries.values() if s.get("kind") == "train"]
    prunes = [s for s in summaries.values() if "job_id" in s and s.get("status") == "ok" and s.get("kind") != "train"]
    runs = [s for s in summaries.values() if "run_id" in s]
    try:
        out.mkdir(parents=True, exist_ok=True)
        lines = ["# pictl report", "", *models_section(runs, prunes), *(jobs_table(trains) if trains else [])]
        for src in sources:
            if (src / "sweep.json").is_file():
                lines += _sweep_section(src, out)
            elif "run_id" in summaries[src]:
                lines += _run_section(src, out)
            elif summaries[src].get("kind") == "train":
                lines += job_section(summaries[src], out)
        report = out / "report.md"
        report.write_text("\n".join(lines))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # A summary from another pictl version, or edited by hand: name it, do not crash on it.
        raise E.ConfigError(f"a source holds a record this pictl cannot read ({type(exc).__name__}: {exc})") \
            from None
    except OSError as exc:  # a sweep without its table, an --out that fills up
        raise E.ConfigError(f"{exc.filename or out}: {exc.strerror or exc}") from None
    return report
