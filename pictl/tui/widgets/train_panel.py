"""The run panel while a training job runs: the step, the loss (latest, and its curve), samples/s, each
rank's time per step by category, top-1 per epoch, and at the end the loss check and the trained model."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from pictl.tui.state import DashboardState
from pictl.tui.train_state import CATEGORIES

BARS = "▁▂▃▄▅▆▇█"
COLORS = {"data": "grey50", "forward": "blue", "backward": "dark_orange", "optimizer": "green", "comm": "red",
          "idle": "grey30"}
WIDTH = 24


def sparkline(values: list[float], width: int = WIDTH) -> str:
    """The last `width` values as block characters, scaled between their min and max."""
    shown = values[-width:]
    if not shown:
        return ""
    lo, hi = min(shown), max(shown)
    return "".join(BARS[int((v - lo) / (hi - lo) * (len(BARS) - 1)) if hi > lo else 0] for v in shown)


def stacked(ms: dict[str, float], scale: float) -> Text:
    """One rank's step as a bar of `WIDTH` cells at most, a colour per category."""
    bar = Text()
    for c in CATEGORIES:
        cells = round(ms[c] / scale * WIDTH) if scale else 0
        bar.append("█" * cells, style=COLORS[c])
    return bar


def train_grid(state: DashboardState, phase_line: str) -> Table:
    job = state.train
    assert job is not None
    o, done = job.options, job.summary
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    style = {"failed": "bold red", "stopped": "yellow", "done": "green"}.get(state.phase, "cyan")
    grid.add_row("train", Text(phase_line, style=style))
    how = o.mode + (f" ({o.schedule})" if o.mode == "pipeline" else "")
    grid.add_row("job", f"{how}, {o.model}, batch {o.batch_size} as {o.chunks} microbatch(es)"
                        + (", bf16" if o.amp else "")
                        + (f", wire {o.wire}" if o.wire != "fp32" else "")
                        + (", activations recomputed" if o.checkpoint_activations else "")
                        + (f", {o.workers} loader worker(s)" if o.workers else ""))
    if job.step:
        frac = job.step / max(job.steps or job.step, 1)
        filled = round(frac * 20)
        grid.add_row("step", f"{job.step}/{job.steps or '?'} {'█' * filled}{'░' * (20 - filled)}"
                             + (f"  {job.rate:.1f} samples/s" if job.rate else ""))
        grid.add_row("loss", f"{job.losses[-1]:.4f}  {sparkline(job.losses)}")
    if job.ranks:
        scale = max(sum(ms.values()) for ms in job.ranks.values())
        for rank in sorted(job.ranks):
            ms = job.ranks[rank]
            grid.add_row(f"rank {rank}", Text.assemble(stacked(ms, scale), f"  {sum(ms.values()):.0f} ms "
                                                       f"{job.hosts.get(rank, '')}"))
        grid.add_row("", Text.assemble(*((f"{c} ", COLORS[c]) for c in CATEGORIES)))
    for e in job.evals[-3:]:
        grid.add_row(f"top-1 e{e.epoch}", f"{e.top1:.2%}")
    if done:
        check = done.agreement
        if check:
            reported = check.enforced is False  # a lossy wire: the distance is reported, not judged
            verdict = "agree" if check.passed else ("moved by the wire" if reported else "DIFFER")
            grid.add_row("vs single", Text(f"losses {verdict} (max rel. diff {check.max_rel_diff})",
                                           style="green" if check.passed else ("yellow" if reported
                                                                                else "bold red")))
        for link in done.links:  # per step: bytes each way, the sender's bandwidth
            sender = link.sender
            grid.add_row(f"link {link.link}", f"{link.format}: {link.forward_bytes_per_step / 1e3:.1f} kB "
                         f"forward, {link.backward_bytes_per_step / 1e3:.1f} kB back per step; "
                         f"{sender.avg_MBps or 0:.2f} MB/s average, {sender.peak_MBps or 0:.2f} peak")
        if done.checkpoint:
            grid.add_row("model", str(done.checkpoint.path))
        if done.job_dir:
            grid.add_row("record", str(done.job_dir))
    return grid
