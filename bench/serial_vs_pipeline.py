"""Serial vs 2-stage pipeline throughput and memory, measured side by side in one run.

    .venv/bin/python -m bench.serial_vs_pipeline [--images 48] [--repeats 3] [--threads 1] [--quick]

Runs the real thing on the shipped local cluster (torchrun, gloo, one process per
stage) with a freshly measured serial baseline, then prints throughput, the
ratio, and each rank's peak RSS beside the serial run's. RSS includes the torch
and timm imports (reported separately), so the stage's own share is `peak - import`.
The verdict line passes when the pipeline's outputs match the serial run's.
`--quick`: 4 images, 1 timed pass.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from bench.harness import SHIPPED, add_quick, known, quick_defaults, verdict
from pictl.inventory import load_cluster
from pictl.planning.presets import resolve_options
from pictl.run.baselines import BaselineCache
from pictl.run.session import RunSession


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stages", type=int, default=2)
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), images=4, repeats=1)
    options = resolve_options(None, {"stages": args.stages, "images": args.images, "repeats": args.repeats,
                                     "warmup": 1, "threads": args.threads, "chunk": 1})
    with tempfile.TemporaryDirectory() as tmp:
        session = RunSession(load_cluster(SHIPPED), options, runs_root=Path(tmp) / "runs",
                             baseline_cache=BaselineCache(Path(tmp) / "cache"), reuse_baseline=False)
        s = asyncio.run(session.run())

    print(f"DeiT-S, {args.images} images x {args.repeats} timed passes, chunk 1, {args.threads} thread(s)/rank, "
          f"{args.stages} stages split at {', '.join(s.split_points)}")
    print(f"{'':14}{'img/s':>10}{'spread':>18}{'peak RSS MB':>14}{'import MB':>12}{'own MB':>10}")
    spread, ips = known(s.throughput_spread_ips, "throughput_spread_ips"), known(s.throughput_ips, "throughput_ips")
    serial_peak, serial_import = known(s.serial_peak_rss_mb, "serial_peak_rss_mb"), \
        known(s.serial_import_rss_mb, "serial_import_rss_mb")
    serial_own = serial_peak - serial_import
    print(f"{'serial':14}{known(s.serial_ips, 'serial_ips'):>10.2f}{'':>18}{serial_peak:>14.0f}"
          f"{serial_import:>12.0f}{serial_own:>10.0f}")
    print(f"{f'{args.stages}-stage':14}{ips:>10.2f}{f'{spread[0]:.2f}-{spread[1]:.2f}':>18}")
    owns = {}
    for st in s.per_stage:
        peak, imported = known(st.peak_rss_mb, "peak_rss_mb"), known(st.import_rss_mb, "import_rss_mb")
        owns[st.rank] = own = peak - imported
        print(f"{'  rank ' + str(st.rank):14}{'':>10}{'':>18}{peak:>14.0f}{imported:>12.0f}{own:>10.0f}")
    speedup = known(s.speedup, "speedup")
    print(f"speedup (pipeline / serial): {speedup:.2f}x   efficiency: {s.efficiency:.2f}   "
          f"outputs match: {s.outputs_match} (max |diff| {s.max_abs_diff})")
    for rank, own in owns.items():
        print(f"rank {rank} own memory / serial own memory: {own / serial_own:.2f}")
    ok = verdict(f"{args.stages}-stage pipeline / serial, outputs match", speedup,
                 (max(spread) - min(spread)) / ips, bool(s.outputs_match))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
