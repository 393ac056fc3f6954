"""How much parallel work this machine really does: the ceiling on any N-stage speedup on one machine.

    .venv/bin/python -m bench.ceiling [--copies 2] [--images 48] [--rounds 3] [--quick]

A pipeline of N stages on one machine with N cores can only be N times faster
than the serial run if N copies of the same loop run side by side as fast as one
alone. On a VM, shared caches, memory bandwidth, SMT siblings or a busy host make
them slower. Per round: the plain serial loop of `bench/reference.py` (the whole
timm model, 1 thread) alone, then `--copies` of it at once (each started the same
way, each timing its own passes). Prints, per round, one copy's img/s alone, each
concurrent copy's, and their ratio; then the ceiling on an N-stage pipeline's
speedup on this machine: N x (concurrent / alone) x the fill/drain bound
M / (M + N - 1) at M = --images microbatches. Rounds alternate nothing: the
machine's state drifts, so read the spread over rounds. `--quick`: 4 images, 1 timed
pass, 1 round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from bench.harness import REFERENCE, add_quick, last_json, quick_defaults


def loops(copies: int, args: argparse.Namespace) -> list[float]:
    """Mean img/s of each of `copies` serial loops run at the same time."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, str(REFERENCE), "serial", "--model", args.model, "--images", str(args.images),
            "--warmup", "1", "--repeats", str(args.repeats), "--threads", "1"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(copies)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        if p.returncode:
            raise SystemExit(f"reference serial failed:\n{stderr[-3000:]}")
        out.append(last_json(stdout, "reference serial")["mean_ips"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=2, help="loops at once (the stage count to bound)")
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), images=4, repeats=1, rounds=1)
    print(f"{args.model}, 1 thread, {args.images} images, 1 warm-up + {args.repeats} timed passes; "
          f"{args.copies} copies at once against one alone; {os.cpu_count()} CPUs", flush=True)
    ratios = []
    for r in range(args.rounds):
        alone = loops(1, args)[0]
        together = loops(args.copies, args)
        ratio = statistics.fmean(together) / alone
        ratios.append(ratio)
        print(f"round {r + 1}: alone {alone:.2f} img/s | at once {', '.join(f'{x:.2f}' for x in together)} img/s "
              f"| ratio {ratio:.3f}", flush=True)
    n, m = args.copies, args.images
    bound = m / (m + n - 1)
    ceilings = [n * x * bound for x in ratios]
    print(f"ratio concurrent / alone: median {statistics.median(ratios):.3f} (rounds: "
          f"{', '.join(f'{x:.3f}' for x in ratios)}); ceiling on a {n}-stage speedup here: "
          f"{n} x ratio x fill/drain bound {bound:.3f} = median {statistics.median(ceilings):.2f}x "
          f"(rounds: {', '.join(f'{x:.2f}' for x in ceilings)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
