"""Training jobs in `pictl report`: one table of every job (mode by mode) and, per job, where each rank's
step time went (a stacked chart and its table) beside the loss curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote import protocol as P

CATEGORIES = tuple(k.removesuffix("_s") for k in P.TRAIN_TIME_KEYS)
COLORS = ("#8c8c8c", "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#dddddd")


def _num(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def jobs_table(jobs: list[dict[str, Any]]) -> list[str]:
    """Every job, grouped by mode: throughput, losses, top-1 and the loss check against single."""
    lines = ["## Training jobs", "", "| mode | ranks | chunks | microbatch | samples/s | loss first -> last | "
             "top-1 | loss check vs single | job |", "|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(jobs, key=lambda s: (("single", "pipeline", "ddp").index(s["mode"]), s.get("stages") or 0,
                                         s.get("chunks") or 0)):
        losses = s.get("losses") or []
        check = s.get("agreement")
        verdict = "-" if not check else f"{'agree' if check['passed'] else 'DIFFER'} ({check['max_rel_diff']})"
        mode = s["mode"] + (f" ({s['schedule']})" if s.get("schedule") else "") + (" bf16" if s.get("amp") else "")
        lines.append(f"| {mode} | {s.get('stages') or '-'} | {s['chunks']} | {s['microbatch']} | "
                     f"{_num(s.get('samples_per_s'))} | "
                     f"{_num(losses[0]['loss'], '.4f') if losses else '-'} -> "
                     f"{_num(losses[-1]['loss'], '.4f') if losses else '-'} | "
                     f"{_num(s.get('top1'), '.1%')} | {verdict} | {s['job_id']} |")
    return [*lines, ""]


def breakdown_chart(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = summary.get("breakdown") or []
    fig, (ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r['rank']}\n{r['host']}" for r in ranks]
    bottom = [0.0] * len(ranks)
    for category, color in zip(CATEGORIES, COLORS, strict=True):
        values = [r["per_step_ms"][category] or 0.0 for r in ranks]
        ax.bar(labels, values, bottom=bottom, label=category, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("ms per step")
    ax.set_title(f"{summary['mode']}: where each rank's step went")
    ax.legend(fontsize=7)
    losses = summary.get("losses") or []
    loss_ax.plot([r["step"] for r in losses], [r["loss"] for r in losses], "-", label="loss")
    check = summary.get("agreement") or {}
    ref = [(r["step"], r["reference"]) for r in check.get("per_step", [])]
    if ref:
        loss_ax.plot([s for s, _ in ref], [v for _, v in ref], "x", label="single (reference)")
    loss_ax.set_xlabel("step")
    loss_ax.set_title("loss")
    loss_ax.legend(fontsize=7)
    loss_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def job_section(summary: dict[str, Any], out: Path) -> list[str]:
    s = summary
    how = s["mode"] + (f" ({s['schedule']})" if s.get("schedule") else "")
    lines = [f"## Training job {s['job_id']}", "",
             f"- {s['status']}: {how} on {s.get('stages') or '-'} rank(s), model {s['model']}, batch "
             f"{s['batch_size']} as {s['chunks']} microbatch(es) of {s['microbatch']}, {s.get('steps_done')} "
             f"step(s){', bf16 autocast' if s.get('amp') else ''}",
             f"- samples/s (timed steps): {_num(s.get('samples_per_s'))}; top-1 by epoch: "
             + (", ".join(f"{e['epoch']}: {e['top1']:.1%}" for e in s.get("evals") or []) or "-")]
    if s.get("agreement"):
        c = s["agreement"]
        lines.append(f"- loss check against {c['against']}: {'passed' if c['passed'] else 'FAILED'} over "
                     f"{c['steps']} step(s), largest relative difference {c['max_rel_diff']} "
                     f"(tolerance {c['tolerance']})")
    if s.get("error"):
        lines.append(f"- error: {s['error'].get('message')}")
    lines += ["", "| rank | host | " + " | ".join(f"{c} ms" for c in CATEGORIES) + " |",
              "|---|---|" + "---|" * len(CATEGORIES)]
    for r in s.get("breakdown") or []:
        lines.append(f"| {r['rank']} | {r['host']} | " + " | ".join(
            f"{_num(r['per_step_ms'][c], '.1f')} ({_num(r['share'][c], '.0%')})" for c in CATEGORIES) + " |")
    if s.get("breakdown"):
        chart = breakdown_chart(s, out / f"{s['job_id']}-breakdown.png")
        lines += ["", f"![time per step and loss]({chart.name})"]
    return [*lines, ""]
