"""Training across hosts, every mode side by side in one invocation: `pictl sweep --train`.

    sudo .venv/bin/python -m bench.train [--cpu 0.4] [--period-ms 10] [--model deit_small_patch16_224]
                                         [--batch-size 8] [--chunks 1,4,8] [--steps 4]
    .venv/bin/python -m bench.train --cluster local ...          (no root: this machine's local hosts)
    .venv/bin/python -m bench.train --quick       (local, ViT-Tiny, 2 stages, batch 4 in 2 chunks, 2 steps)

On the 4-host SSH test cluster with every host capped at --cpu cores (a CFS quota enforced per
--period-ms: four slow devices on this machine), one job each of: single (per chunk count), pipeline
with GPipe and with 1F1B over 4 stages at each chunk count, and ddp over 4 replicas (at chunk counts
its 4 ranks share evenly). The global batch is the same everywhere, so the chunk count sets the
microbatch. Every job checks its first losses against single's. Printed: samples/s, the ratio to single
at the same chunk count, and each job's time per step by category (the mean over its ranks, and the
busiest rank's comm share), from the sweep's own table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import add_quick, cluster, is_root, quick_defaults, skip_loudly

CATEGORIES = ("data", "forward", "backward", "optimizer", "comm", "idle")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", choices=("local", "ssh"), default="ssh")
    parser.add_argument("--cpu", type=float, default=0.4)
    parser.add_argument("--period-ms", type=float, default=10.0)
    parser.add_argument("--slow-host", type=int, default=None)
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chunks", default="1,4,8")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=4)
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), cluster="local", model="vit_tiny_patch16_224", stages=2,
                          batch_size=4, chunks="2", steps=2)
    if args.cluster == "ssh" and not is_root():
        return skip_loudly("train", "--cluster ssh needs root (the SSH test cluster)")
    tmp = Path(tempfile.mkdtemp(prefix="pictl-bench-train-"))
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp / "runs"), "PICTL_CACHE_DIR": str(tmp / "cache")}
    out = tmp / "sweep"
    with cluster(args.cluster, args.stages, cpu=args.cpu, period_ms=args.period_ms,
                 slow_host=args.slow_host) as inventory:
        proc = subprocess.run(
            [sys.executable, "-m", "pictl", "sweep", "--train", "--hosts", str(inventory), "--out", str(out),
             "--modes", "single,pipeline,ddp", "--schedules", "gpipe,1f1b", "--stages", str(args.stages),
             "--chunks", args.chunks, "--model", args.model, "--batch-size", str(args.batch_size),
             "--steps", str(args.steps), "--train-images", str(args.batch_size * args.steps), "--threads", "1",
             "--eval-images", str(args.batch_size),
             "--json"], env=env, capture_output=True, text=True, timeout=7200)
    if proc.returncode not in (0, 3):
        raise SystemExit(f"pictl sweep --train failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(proc.stdout)
    caps = f"{args.cpu} core(s) per host, CFS period {args.period_ms:g} ms" if args.cluster == "ssh" else "uncapped"
    print(f"{args.cluster} cluster ({caps}); {args.model}, batch {args.batch_size}, {args.steps} steps (1 warm-up), "
          f"1 thread per rank, synthetic data, fp32")
    print("| mode | ranks | chunks | microbatch | samples/s | x single | loss check | "
          + " | ".join(f"{c} ms" for c in CATEGORIES) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(CATEGORIES))
    for r in result["rows"]:
        mode = r["mode"] + (f" {r['schedule']}" if r.get("schedule") else "")
        ms = r.get("per_step_ms") or {}
        print(f"| {mode} | {r['stages']} | {r['chunks']} | {r.get('microbatch')} | {r.get('samples_per_s')} | "
              f"{r.get('speedup') or '-'} | {r.get('loss_agreement') or '-'} | "
              + " | ".join("-" if ms.get(c) is None else f"{ms[c]:.0f}" for c in CATEGORIES) + " |")
    for why in result.get("skipped", []):
        print(f"left out: {why}")
    print(f"sweep directory (table, samples_vs_chunks.png, time_breakdown.png): {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
