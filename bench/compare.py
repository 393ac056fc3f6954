"""Does a comparison rank configurations right while other work comes and goes? `pictl sweep`'s rounds under a
busy loop switched on and off, against the same configurations measured quiet.

    .venv/bin/python -m bench.compare [--repeats 10] [--rounds 3] [--quiet-rounds 5] [--images 8] [--quick]
                                      [--save F]

Three configurations on the shipped cluster (4 local hosts; seeded random weights, 1 thread per rank), measured
by `pictl sweep`'s engine (`pictl.jobs.sweep_rounds`: one serial reference, interleaved rounds, each run handed
its round's reference): the serial DeiT-S run (the reference itself, 1x by definition), DeiT-S in 2 stages
(about 1.4-1.8x here) and a smaller model, DeiT-Tiny, alone on the reference's host (about 3x: what a user
weighing a smaller or pruned model against a split one compares). The sweep's own statistics rank them.
First one sweep with no load of the bench's own (`--quiet-rounds` rounds) gives the quiet ranking. Then
`--repeats` sweeps run while a busy loop pinned to one CPU is switched on and off at uneven intervals (0.5-3 s
each way, `tests/support/load.py`), each of `--rounds` interleaved rounds; each repeat's ranking (by median
speedup over the round's reference) is compared with the quiet one. Prints every repeat's speedups with their
intervals and verdicts, the count of repeats that agree (PASS at 9 of 10 or more, in proportion for other
counts), and how many verdicts ever named the wrong winner.
`--quick`: 4 images, 2 rounds, one repeat (a smoke run; the figure comes from the full protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import SHIPPED, add_quick, quick_defaults, save_result


async def one_sweep(work: Path, name: str, images: int, rounds: int) -> dict[str, Any]:
    """The three configurations in `rounds` rounds; the rows, verdicts and rounds `pictl sweep` would write."""
    from pictl.inventory import load_cluster
    from pictl.jobs.sweep import SweepPoint, options_for, reference_of
    from pictl.jobs.sweep_rounds import REFERENCE, Entry, RoundsPlan, SweepRounds
    from pictl.jobs.sweep_table import sweep_rows, verdict_lines
    from pictl.planning.presets import resolve_options

    cluster = load_cluster(SHIPPED)
    base = resolve_options(None, {"images": images, "warmup": 1, "repeats": 1, "threads": 1})
    reference = reference_of(cluster, base, [SweepPoint(1, 1, "serial")])
    tiny = resolve_options(None, {**base.model_dump(), "model": "deit_tiny_patch16_224", "stages": 1, "split": [],
                                 "policy": "equal"})
    points = [SweepPoint(1, 1, "serial"), SweepPoint(2, 1, "equal"), SweepPoint(1, 1, "serial")]
    entries = [Entry("DeiT-S, serial", reference.options, reference.cluster),
               Entry("DeiT-S, 2 stages", options_for(base, points[1]), cluster),
               Entry("DeiT-Tiny, serial", tiny, reference.cluster)]
    aliases = {"DeiT-S, serial": REFERENCE}
    engine = SweepRounds(reference, entries, RoundsPlan(rounds, rounds), sweep_dir=work / name,
                         runs_root=work / "runs", aliases=aliases, wait=True)
    measured = await engine.run()
    ranking = engine.ranking()
    labels = [e.label for e in entries]
    runs = {label: measured.reference if label in aliases else measured.runs.get(label, []) for label in labels}
    return {"rows": sweep_rows(points, labels, runs, ranking, "serial DeiT-S on the first host"),
            "verdicts": verdict_lines(ranking), **measured.to_json()}


def ranking(sweep: dict[str, Any]) -> list[str]:
    """The configurations by median speedup over the reference, fastest first."""
    return [r["label"] for r in sorted(sweep["rows"], key=lambda r: -(r["speedup"] or 0.0))]


def shown(sweep: dict[str, Any]) -> str:
    return "; ".join(f"{r['label']} {r['speedup']:.2f}x ({r['speedup_low'] or 0:.2f}-{r['speedup_high'] or 0:.2f})"
                     for r in sorted(sweep["rows"], key=lambda r: -(r["speedup"] or 0.0)))


def wrong_winners(sweep: dict[str, Any], quiet: list[str]) -> list[str]:
    """Verdicts that named a winner the quiet ranking puts below the loser."""
    found = []
    for line in sweep["verdicts"]:
        if " is faster than " in line:
            fast, rest = line.split(" is faster than ", 1)
            slow = next((label for label in quiet if rest.startswith(label + " by ")), None)
            if slow is not None and fast in quiet and quiet.index(fast) > quiet.index(slow):
                found.append(line)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10, help="loaded sweeps")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each loaded sweep")
    ap.add_argument("--quiet-rounds", type=int, default=5, help="rounds of the quiet sweep")
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--save", type=Path, help="write every sweep's rows, verdicts and rounds here (JSON)")
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=4, rounds=2, quiet_rounds=2, repeats=1)
    # Ctrl-C (SIGINT) stops it cleanly even where it was started in the background, which ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from tests.support.load import ToggledLoad

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pictl-bench-compare-") as tmp:
        work = Path(tmp)
        os.environ["PICTL_RUNS_DIR"], os.environ["PICTL_CACHE_DIR"] = str(work / "runs"), str(work / "cache")
        quiet = asyncio.run(one_sweep(work, "quiet", args.images, args.quiet_rounds))
        order = ranking(quiet)
        print(f"quiet ({args.quiet_rounds} rounds): {' > '.join(order)}\n  {shown(quiet)}", flush=True)
        loaded, agree, wrong = [], 0, []
        for k in range(1, args.repeats + 1):
            with ToggledLoad(on_s=(0.5, 3.0), off_s=(0.5, 3.0), seed=k) as load:
                sweep = asyncio.run(one_sweep(work, f"loaded-{k}", args.images, args.rounds))
            same = ranking(sweep) == order
            agree += same
            wrong += wrong_winners(sweep, order)
            loaded.append({**sweep, "load": {"cpu": load.cpu, "switches": load.switches, "busy_s": load.busy_s}})
            print(f"repeat {k} ({load.switches} switches, load on {load.busy_s:.0f} s): "
                  f"{'agrees' if same else 'DISAGREES'}: {' > '.join(ranking(sweep))}\n  {shown(sweep)}", flush=True)
            for line in sweep["verdicts"]:
                print(f"    {line}", flush=True)
    need = max(1, -(-9 * args.repeats // 10))  # 9 of 10, in proportion for other counts
    print(f"{'PASS' if agree >= need and not wrong else 'FAIL'}: the ranking under toggled load agreed with the "
          f"quiet one in {agree} of {args.repeats} repeat(s) (need {need}); verdicts naming the wrong winner: "
          f"{len(wrong)}; {time.monotonic() - started:.0f} s", flush=True)
    for line in wrong:
        print(f"  wrong: {line}", flush=True)
    if args.save:
        save_result(args.save, {"args": {k: str(v) for k, v in vars(args).items()}, "quiet": quiet,
                                "loaded": loaded, "agree": agree, "wrong": wrong})
    if args.quick:
        return 0  # a smoke run: one repeat says nothing of the rate
    return 0 if agree >= need and not wrong else 1


if __name__ == "__main__":
    raise SystemExit(main())
