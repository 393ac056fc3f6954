"""The verdict of `bench.check_speedup`: over its rounds, each ratio's geometric mean with a 95 %
bootstrap interval, and whether pictl's speedup lies within 5 % of the plain reference's; and the same over
the rounds of several saved checks (`--pool`).

    .venv/bin/python -m bench.check_verdict [SAVED ...]    (default: bench/results/check_speedup_*.json, by cluster)
    .venv/bin/python -m bench.check_verdict --quick        (the saved local checks only)

Run as a script, it prints the pooled verdict of saved checks without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

from bench.harness import RESULTS, add_quick

ORDERS = ("plain serial, pictl, plain pipeline", "plain pipeline, plain serial, pictl")

AGREEMENT = 0.05
"""The issue's bar: pictl's speedup within 5 % of the plain reference's."""


def geometric_mean_ci(xs: list[float], resamples: int = 20000, seed: int = 0) -> tuple[float, float, float]:
    """The geometric mean of ratios and its 95 % percentile bootstrap interval over the rounds (a ratio and
    its inverse weigh alike; no assumption on how the rounds scatter)."""
    logs = [math.log(x) for x in xs]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    return (math.exp(statistics.fmean(logs)), math.exp(means[int(0.025 * resamples)]),
            math.exp(means[int(0.975 * resamples) - 1]))


def verdict(rounds: list[dict]) -> str:
    """Over the rounds, for the ratio of the means (pictl's reported speedup) and of the fastest passes: the
    geometric mean with its 95 % interval, median and range, and whether the interval lies within AGREEMENT
    of 1; the serial and pipeline factors the same way."""
    def line(what: str, xs: list[float]) -> str:
        gm, lo, hi = geometric_mean_ci(xs)
        return (f"{what}: geometric mean {gm:.3f} (95 % interval {lo:.3f}-{hi:.3f}), median "
                f"{statistics.median(xs):.3f}, range {min(xs):.3f}-{max(xs):.3f} over {len(xs)} round(s)")

    def answer(what: str, xs: list[float]) -> str:
        _, lo, hi = geometric_mean_ci(xs)
        if 1 - AGREEMENT <= lo and hi <= 1 + AGREEMENT:
            return f"{what}: within {AGREEMENT:.0%} of the plain reference's (the whole interval is)"
        if hi < 1 - AGREEMENT or lo > 1 + AGREEMENT:
            return f"{what}: differs from the plain reference's by more than {AGREEMENT:.0%}"
        return f"{what}: undecided at {AGREEMENT:.0%} (the interval reaches past it; more rounds narrow it)"

    ratios, best = [r["ratio"] for r in rounds], [r["ratio_best"] for r in rounds]
    # Each order's own mean: far apart, the speed drifted within rounds (the overall mean cancels a steady drift).
    by_order = [line(f"  rounds in the order {o}", [r["ratio"] for r in rounds if r.get("order") == o])
                for o in ORDERS if any(r.get("order") == o for r in rounds)]
    return "\n".join([
        line("speedup ratio pictl / reference, means of the timed passes (pictl's reported speedup)", ratios),
        *by_order,
        line("  serial factor (pictl's serial / the plain loop's)", [r["serial_factor"] for r in rounds]),
        line("  pipeline factor (pictl's pipeline / the plain one's)", [r["pipeline_factor"] for r in rounds]),
        line("speedup ratio pictl / reference, fastest pass of each run", best),
        answer("pictl's speedup (means)", ratios),
        answer("pictl's speedup (fastest passes)", best)])


def pooled(saved: list[Path]) -> str:
    """The verdict over the rounds of several saved checks: each round compares pictl with the reference
    within its own minutes, so rounds of checks run at other times (the machine at another speed) pool;
    each file's protocol is printed so that only like checks are pooled."""
    rounds, heads = [], []
    for path in saved:
        data = json.loads(path.read_text())
        a = data["args"]
        where = f"the SSH test cluster at {a.get('cpu')} core(s) per host" if a.get("ssh") == "True" else a.get("hosts")
        heads.append(f"{path}: {len(data['rounds'])} round(s); {a.get('stages')} stages, {a.get('images')} images x "
                     f"{a.get('repeats')} passes, on {where}")
        rounds += data["rounds"]
    return "\n".join([*heads, verdict(rounds)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("saved", type=Path, nargs="*", help="saved checks to pool (default: bench/results, by cluster)")
    add_quick(parser)
    args = parser.parse_args()
    if args.saved:
        print(pooled(args.saved))
        return 0
    groups = ["local2"] if args.quick else ["local2", "ssh4"]
    found = 0
    for group in groups:  # only like checks pool: one verdict per cluster and stage count
        saved = sorted(RESULTS.glob(f"check_speedup_{group}_*.json"))
        if saved:
            print(pooled(saved))
            found += len(saved)
    if not found:  # a verdict over nothing is no verdict
        raise SystemExit(f"no saved checks of {' or '.join(groups)} in {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
