"""The optional sections of a run's report (`pictl.records.report`): other numerics than fp32, the re-cuts of a
run whose host drifted, and `balanced`'s refinement rounds; each is empty when the run had none."""

from __future__ import annotations

from pictl.figure_text import ips_text, speedup_text
from pictl.records.train_report import md_text
from pictl.summary import RunSummary
from pictl.summary_figures import Refinement


def numerics_lines(s: RunSummary) -> list[str]:
    """Under `--numerics` other than fp32: the two speedups apart, and what the numerics cost against fp32."""
    n = s.numerics
    if n is None:
        return []
    return [f"**numerics** `{md_text(n.kind)}` ({md_text(', '.join(n.engines) or 'serial only')}): the speedup "
            f"above is against a serial run in the same numerics ({ips_text(n.serial_ips)} img/s). Against the fp32 "
            f"serial run ({ips_text(n.fp32_serial_ips)} img/s): **{speedup_text(n.speedup_vs_fp32)}**; the numerics "
            f"alone, on one host: {speedup_text(n.numerics_gain)}."
            f" Top-1 agreement with fp32: {n.agreement_vs_fp32} over {n.compared_images} "
            f"image(s), mean |logit diff| {n.mean_abs_diff_vs_fp32}.", ""]


def recut_lines(s: RunSummary) -> list[str]:
    """The watch over the timed passes: each decision, why, and the img/s of the passes around a re-cut."""
    lines = []
    for r in s.recuts:
        then = (f"re-cut to {', '.join(map(md_text, r.next_split))} (predicted {r.next_predicted_ms} ms); "
                f"{r.ips_before} img/s before, {r.ips_after} after" if r.moved
                else "no split better by the margin: kept, with the corrected factors")
        lines.append(f"- after timed pass {r.after_pass + 1}: {md_text(r.reason)}; "
                     f"{', '.join(map(md_text, r.split_points))} measured {r.measured_ms} ms per microbatch against "
                     f"{r.expected_ms} expected; {then}.")
    if not lines:
        return []
    passes = ", ".join(f"{ips:g}" for ips in s.pass_ips)
    segments = segment_table(s) if not s.host_lost else []
    return ["**re-cuts** (a host drifted during the run; only the cut moved, so the outputs are still checked "
            "bit for bit):", "", *lines, "", f"img/s per timed pass: {passes}.", "", *segments,
            *([""] if segments else [])]


def segment_table(s: RunSummary) -> list[str]:
    """A run of more than one segment: each one's hosts, timed passes, split, img/s, speedup and how it ended."""
    if len(s.segments) < 2:
        return []
    return ["| segment | hosts | timed passes | split | img/s | speedup | ended by |",
            "|---|---|---|---|---|---|---|"] + [
        f"| {seg.index + 1} | {md_text(', '.join(dict.fromkeys(seg.hosts)) or '-')} | "
        f"{f'{seg.passes[0] + 1}-{seg.passes[1] + 1}' if seg.passes else '-'} | "
        f"{md_text(', '.join(seg.split_points) or '-')} | {ips_text(seg.ips)} | {speedup_text(seg.speedup)} | "
        f"{md_text((seg.ended_by or 'the end') + (f' ({seg.lost_host})' if seg.lost_host else ''))} |"
        for seg in s.segments]


def host_lost_lines(s: RunSummary) -> list[str]:
    """A run that lost a host and went on without it: each loss, what it cost, and the segments."""
    if not s.host_lost:
        return []
    lines = [f"- **{md_text(loss.host)}** lost after {loss.completed_passes} timed pass(es) "
             f"({md_text(loss.message or 'no word from it')}): the run went on with {loss.stages_after} stage(s) on "
             f"{md_text(', '.join(loss.hosts_after))}; {loss.replan_s if loss.replan_s is not None else '-'} s to "
             f"re-plan, {loss.lost_s if loss.lost_s is not None else '-'} s to the next segment's first output; "
             f"{loss.recomputed_images} image(s) computed again." for loss in s.host_lost]
    return ["**hosts lost** (each timed pass counts once, measured whole on the split that ran it; the outputs "
            "checked are the last segment's):", "", *lines, "", *segment_table(s), ""]


def refine_lines(refine: Refinement | None) -> list[str]:
    """`balanced`'s refinement rounds (each with the slowest stage's interval and the decision), and which
    round's split the timed passes ran."""
    lines = []
    for r in refine.rounds if refine else []:
        then = r.reason or (f"next {', '.join(r.next_split)}" if r.next_split else "refinement over")
        noise = (f" (slowest {md_text(max(r.measured_ms))}, {md_text(max(r.low_ms))}-{md_text(max(r.high_ms))} "
                 f"over {md_text(r.passes)} pass(es))" if r.measured_ms and r.low_ms and r.high_ms else "")
        lines.append(f"\nrefinement round {md_text(r.round)}: split "
                     f"{', '.join(map(md_text, r.split_points)) if r.split_points is not None else '-'}, predicted "
                     f"{md_text(r.predicted_ms)} ms, measured {md_text(r.measured_ms)} ms per stage{noise}; "
                     f"{md_text(then)}.")
    if refine and refine.chosen_round is not None:
        added = (f" Refinement added {md_text(refine.calibration_passes)} untimed pass(es), "
                 f"{md_text(refine.calibration_s)} s, to start-up." if refine.calibration_passes is not None else "")
        lines.append(f"\nThe timed passes ran round {md_text(refine.chosen_round)}'s split "
                     f"{', '.join(map(md_text, refine.chosen_split or []))}, measured {md_text(refine.measured_ms)} "
                     f"ms per stage over {md_text(refine.passes)} pass(es).{added}")
    return lines
