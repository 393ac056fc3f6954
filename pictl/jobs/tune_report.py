"""What `pictl tune` leaves behind: `tune.json` (`TuneRecord`: rewritten after every measurement, and saying how
the tune ended), its ranked table (80 columns), the Pareto plots (throughput against agreement with the fp32
serial run, and against latency per image; each point exact or lossy), and the winner saved as a preset
(NAME.toml in the user's presets directory), so `pictl run --profile NAME` runs the winning configuration."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pictl import errors as E
from pictl.jobs.tune_verdicts import Measured, best_kept, ranked, winner
from pictl.planning.options import RunOptions
from pictl.planning.presets import preset_target
from pictl.records.runs import write_bytes_atomic, write_json_atomic
from pictl.summary_figures import Open
from pictl.text import figure

TUNE_FILE = "tune.json"


class TuneReference(Open):
    """tune.json's `reference`: the serial run every candidate is measured against."""

    host: str
    """The host it runs on (its rounds run there alone)."""
    numerics: str
    threads: int
    chunk: int
    screening_run_id: str | None
    screening_ips: float | None


class TunePlan(Open):
    """tune.json's `plan`: how many rounds the finalists were to be measured in (`runs compare` reads it)."""

    rounds: int
    max_rounds: int


class TuneMeta(Open):
    """What tune.json holds before its status and rows, each field given as the tune learns it and written in
    this order, only once given (`written`)."""

    started_at: float
    cluster: str
    """The hosts file the tune ran on."""
    options: dict[str, Any]
    """The base options (`RunOptions`)."""
    settings: dict[str, Any]
    """`TuneSettings`."""
    runs_root: str
    reference: TuneReference | None = None
    axes: dict[str, Any] | None = None
    """The threads and chunks searched (`Axes`)."""
    calibration: dict[str, Any] | None = None
    """What the first measurements corrected in the cost model (`Calibration`)."""
    int8_gains: dict[str, float] | None = None
    """Host -> int8's gain there (only with --allow-loss)."""
    decision: list[str] | None = None
    rounds: int | None = None
    """How many rounds the reference ran."""
    plan: TunePlan | None = None
    host_lost: list[dict[str, Any]] | None = None
    """The hosts the tune lost mid-run and went on without: host, detail, the run count it happened at, the hosts
    left and the `line` that said so (`TuneJob.without`)."""


class TuneRecord:
    """`tune.json` in the tune's directory: its options, settings and every row so far, with `status` (running,
    done, failed or interrupted) and, when it did not finish, the `error` that ended it."""

    def __init__(self, out: Path, meta: TuneMeta) -> None:
        self.path, self.meta, self.started = out / TUNE_FILE, meta, time.monotonic()

    def write(self, status: str, rows: list[Measured], error: BaseException | None = None) -> None:
        """Rewrite the file whole; OSError when the disk refuses it (the caller says what that costs)."""
        found, exact = winner(rows), best_kept([m for m in rows if m.exact])
        pipeline = best_kept([m for m in rows if m.candidate.replicas == 1 and m.candidate.stages > 1 and m.exact])
        write_json_atomic(self.path, {
            **self.meta.written(), "status": status, "elapsed_s": round(time.monotonic() - self.started, 1),
            **({"error": {"type": type(error).__name__, "message": str(error),
                          "exit_code": getattr(error, "exit_code", E.EXIT_INTERNAL)}} if error else {}),
            "winner": found.row() if found else None, "best_exact": exact.row() if exact else None,
            "best_pipeline": pipeline.row() if pipeline else None, "rows": [m.row() for m in ranked(rows)]})


PRESET_FIELDS = ("model", "num_classes", "stages", "replicas", "policy", "split", "numerics", "wire", "min_agreement",
                 "images", "chunk", "warmup", "repeats", "threads")
"""What a tuned preset fixes: the configuration and the measurement protocol it won under."""


def table(rows: list[Measured], best: Measured | None, base: RunOptions | None = None, *,
          unmeasured: int | None = None) -> str:
    """The rows measured in rounds first, best first, then those screened once, then the predicted rest
    (`ranked`; the best `unmeasured` of them, when given); fits 80 columns. A config names its threads (t) and
    chunk (c) where they differ from `base`'s; +i8 and +w are lossy."""
    shown = ranked(rows)
    left_out = 0
    if unmeasured is not None:
        waiting = [m for m in shown if not m.status]
        left_out = max(0, len(waiting) - unmeasured)
        shown = [m for m in shown if m.status] + waiting[:unmeasured]
    lines = ["| config        | img/s | x ref | interval    | n | agree | acc   | verdict |",
             "|---------------|-------|-------|-------------|---|-------|-------|---------|"]
    for m in shown:
        verdict = ("WINNER" if m is best else "serial" if m.reference else "kept" if m.kept else "no" if m.status
                   else "inexact" if m.why else "-")
        # (the reference's speedup is 1 by definition: an interval of 1.00-1.00 would read as no noise at all)
        interval = f"{m.interval[0]:.2f}-{m.interval[1]:.2f}" if m.interval and not m.reference else "-"
        lines.append(f"| {m.candidate.short(base):<13} | {figure(m.throughput_ips, '.1f'):>5} "
                     f"| {figure(m.speedup_vs_fp32):>5} | {interval:<11} | {len(m.rounds) or '-':>1} "
                     f"| {figure(m.agreement_vs_fp32, '.3f'):>5} | {figure(m.accuracy, '.3f'):>5} | {verdict:<7} |")
    if left_out:
        lines.append(f"... and {left_out} more predicted, not measured (tune.json has every row)")
    return "\n".join(lines)


def legend(base: RunOptions) -> str:
    """What the table's columns are measured against, under it."""
    return (f"x ref: img/s over the reference, the fp32 serial run on one host ({base.threads} thread(s),\n"
            f"chunk {base.chunk}): over n rounds, the median of each round's img/s over that round's\n"
            "reference, and its 95 % interval; n -: one screening run. A winner is faster\n"
            "than the rest beyond the noise (pair by pair, round by round, at 99 %), or the\n"
            "simplest of a tie. agree: top-1 against the fp32 serial run; acc: on labelled\n"
            "images; tN, cN: threads, chunk; +i8, +wX: lossy")


def plot(out: Path, rows: list[Measured]) -> Path | None:
    """tune.png: throughput against agreement and against latency per image, for every measured candidate."""
    done = [m for m in rows if m.throughput_ips]
    if not done:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, value, label in ((left, lambda m: m.agreement_vs_fp32, "top-1 agreement with the fp32 serial run"),
                             (right, lambda m: m.latency_p50_ms, "latency per image, p50 (ms)")):
        for lossy, marker, colour in ((False, "o", "#1f77b4"), (True, "^", "#d62728")):
            pts = [m for m in done if (not m.exact) == lossy and value(m) is not None]
            ax.scatter([value(m) for m in pts], [m.throughput_ips for m in pts], marker=marker, color=colour,
                       label="lossy" if lossy else "exact")
            for m in pts:
                ax.annotate(m.candidate.short(), (value(m), m.throughput_ips), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("images / s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("pictl tune: every measured configuration")
    fig.tight_layout()
    path, image = out / "tune.png", io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, image.getvalue())  # whole or not at all: a full disk leaves no half a PNG
    return path


def preset_text(options: RunOptions, m: Measured, source: str, protocol: dict[str, int] | None = None) -> str:
    """A profile for `m`'s configuration: the split it was measured with fixed (`explicit`), so the preset runs
    what won, not what a later `balanced` would choose; measured by `protocol` (the user's images, warm-up and
    passes: `presets.protocol_of`), not by the tune's shorter one, unless the configuration cannot take it."""
    values: dict[str, Any] = {k: getattr(options, k) for k in PRESET_FIELDS}
    if m.candidate.stages > 1 and m.split_points:
        values["split"], values["policy"] = list(m.split_points), "explicit"
    else:
        values["split"], values["policy"] = [], "equal"
    spread = f", interval {figure(m.interval[0])}-{figure(m.interval[1])}" if m.interval else ""
    about = (f"pictl tune winner: {m.candidate.label}, {figure(m.throughput_ips)} img/s, "
             f"{figure(m.speedup_vs_fp32)}x the serial "
             f"run over {len(m.rounds)} round(s){spread}, on {source}")
    lines = [f"description = {json.dumps(about)}"]
    kept = _protocol_kept(options, protocol)
    values.update(kept or {})
    if protocol and not kept:
        lines.append(f"# {protocol['images']} images do not deal evenly over {options.replicas} replicas at chunk "
                     f"{options.chunk}: the tune's protocol ({options.images} images) is kept")
    # JSON's strings, numbers, booleans and lists of strings are TOML's too.
    lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _protocol_kept(options: RunOptions, protocol: dict[str, int] | None) -> dict[str, int] | None:
    """`protocol` when the winning configuration runs under it (replicas deal its microbatches evenly), else None."""
    if not protocol:
        return None
    try:
        RunOptions.model_validate({**options.model_dump(), **protocol})
    except ValidationError:
        return None
    return protocol


def save_preset(directory: Path, name: str, text: str, *, force: bool = False) -> Path:
    """`text` as DIRECTORY/NAME.toml where `preset_target` allows it (ConfigError otherwise, naming why); OSError
    when the disk refuses it (no partial file is left)."""
    path = preset_target(name, directory, force=force)
    directory.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, text.encode())
    return path


def finish(target: Path, rows: list[Measured], base: RunOptions, source: str, profiles: Path,
           save_as: str, *, force: bool = False, protocol: dict[str, int] | None = None
           ) -> tuple[Measured | None, Path | None]:
    """What a finished tune leaves: `tune.png`, `table.md` and, when a candidate beat the serial run, the winner
    saved as `SAVE_AS.toml` in `profiles` (the user's presets directory) with the user's `protocol`. Returns the
    winner and the preset's path (None, None: nothing won).
    RecordWriteFailed (the tune measured, but what it leaves could not be written) names the file."""
    found = winner(rows)
    try:
        plot(target, rows)
        write_bytes_atomic(target / "table.md", (table(rows, found, base) + "\n\n" + legend(base) + "\n").encode())
    except OSError as exc:
        raise E.RecordWriteFailed(f"the tune measured its candidates, but writing its table or plot in {target} "
                                  f"failed ({exc.strerror or exc})") from None
    if found is None:
        return None, None
    try:
        text = preset_text(found.candidate.options(base), found, source, protocol)
        return found, save_preset(profiles, save_as, text, force=force)
    except E.ConfigError as exc:  # it was checked before the tune measured: the folder changed since
        raise E.RecordWriteFailed(f"the tune measured its winner, but its preset was not saved: {exc}") from None
    except OSError as exc:
        raise E.RecordWriteFailed(f"the tune measured its winner, but {profiles / f'{save_as}.toml'} could not be "
                                  f"written ({exc.strerror or exc})") from None
