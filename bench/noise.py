"""How much this machine's own speed wanders: the noise every throughput figure here carries.

    .venv/bin/python -m bench.noise [--seconds 60] [--runs 6] [--run-seconds 20] [--quick]

Two parts, each a serial loop like `bench/reference.py serial` (the whole model,
one image per forward, one thread) but written here, since it must pin itself to
a CPU and timestamp every image, which reference.py does not:
1. one copy pinned to each CPU, all at once, for `--seconds`: each copy's speed
   per second (mean, spread, lowest and highest) and how the copies' speeds
   correlate. A correlation near 1 means the machine slows down as a whole (then
   runs side by side would see the same noise); near 0, each CPU wanders on its
   own.
2. `--runs` separate processes one after another, `--run-seconds` each: how much
   a whole run's mean moves from one process to the next, which is what a
   speedup (a ratio of two runs) inherits.

Prints the figures; no pictl code runs. `--quick`: 5 s at once, then 2 runs of 2 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

from bench.harness import add_quick, quick_defaults

LOOP = """
import json, os, sys, time, timm, torch
cpu, seconds = int(sys.argv[1]), float(sys.argv[2])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
torch.set_num_threads(1)
model = timm.create_model("deit_small_patch16_224", pretrained=False).eval()
x = torch.randn(1, 3, 224, 224)
done = []
with torch.no_grad():
    for _ in range(3):
        model(x)
    end = time.time() + seconds
    while time.time() < end:
        model(x)
        done.append(time.time())
print(json.dumps(done))
"""


def _loops(cpus: list[int], seconds: float) -> list[list[float]]:
    procs = [subprocess.Popen([sys.executable, "-c", LOOP, str(c), str(seconds)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}) for c in cpus]
    return [json.loads(p.communicate()[0]) for p in procs]


def per_second(done: list[float], start: float, end: float) -> list[float]:
    """Images per second in each whole second of [start, end): from the durations of the images that finished
    in it (a count of whole images would step by 1/6 of the speed at 6 img/s)."""
    windows: list[list[float]] = [[] for _ in range(int(end - start))]
    for before, t in itertools.pairwise(done):
        if start <= t < start + len(windows):
            windows[int(t - start)].append(t - before)
    return [len(w) / sum(w) if w else 0.0 for w in windows]  # no image finished in a second: under 1 img/s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--run-seconds", type=float, default=20.0)
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), seconds=5.0, runs=2, run_seconds=2.0)
    cpus = sorted(os.sched_getaffinity(0))
    runs = _loops(cpus, args.seconds)
    start, end = max(r[0] for r in runs) + 1, min(r[-1] for r in runs)  # the span every copy was running
    series = [per_second(r, start, end) for r in runs]
    print(f"{len(cpus)} pinned copies at once for {end - start:.0f} s, images per second:")
    for cpu, s in zip(cpus, series, strict=True):
        mean = statistics.fmean(s)
        print(f"  CPU {cpu}: mean {mean:.2f}, spread (sd/mean) {statistics.pstdev(s) / mean:.1%}, "
              f"lowest {min(s):.2f}, highest {max(s):.2f}")
    if len(series) > 1:
        pairs = [(a, b) for i, a in enumerate(series) for b in series[i + 1:]]
        corr = [statistics.correlation(a, b) for a, b in pairs]
        print(f"  correlation of the copies' per-second speeds: {', '.join(f'{c:.2f}' for c in corr)}")
    means = []
    for _ in range(args.runs):
        (done,) = _loops([-1], args.run_seconds)
        means.append((len(done) - 1) / (done[-1] - done[0]))
        time.sleep(1)
    print(f"{args.runs} runs of {args.run_seconds:g} s one after another, img/s: "
          f"{', '.join(f'{m:.2f}' for m in means)}; spread (sd/mean) "
          f"{statistics.stdev(means) / statistics.fmean(means):.1%}, range {min(means):.2f}-{max(means):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
