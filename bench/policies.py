"""equal vs balanced on slow emulated devices: the sweep on the SSH test cluster, each host CPU-capped.

    sudo .venv/bin/python bench/policies.py [--cpu 0.4] [--period-ms 10] [--stages 1,2,3,4] [--images 96]
                                            [--slow-host 2]

Starts the 4-host sshd cluster with every host capped at --cpu cores (a cgroup
CFS quota, enforced per --period-ms: within a period a host runs at full speed
until its quota is spent, so the kernel's 100 ms lets short stages burst, while
10 ms makes every host uniformly slow, as a slow CPU is), runs `pictl sweep
--policy equal,balanced` on it in one invocation (one serial baseline, then
each stage count with each policy), and prints the sweep table: throughput,
speedup and efficiency per configuration, side by side.
Then, per pipeline run, where the efficiency went: each stage's predicted and
measured ms per microbatch, its compute / wait / send split over the timed
passes, and the compute / send / receive-wait / idle shares from profiler
traces of --trace-steps steps (an extra untimed pass).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshcluster import SshCluster, down  # noqa: E402


def breakdown(sweep: Path) -> None:
    """Per pipeline run: where each stage's time went, from the summary and from the traces."""
    for summary_file in sorted(sweep.glob("runs/*/summary.json")):
        s = json.loads(summary_file.read_text())
        if s["stages"] < 2 or s["status"] != "ok":
            continue
        # GPipe fills and drains the pipeline once per pass: with M microbatches, S stages can be busy
        # at most M / (M + S - 1) of the pass even when perfectly balanced.
        microbatches = -(-s["images"] // s["chunk"])
        bound = microbatches / (microbatches + s["stages"] - 1)
        print(f"\n{s['stages']} stages, {s['policy']}: {s['throughput_ips']:.2f} img/s, speedup {s['speedup']:.2f}x, "
              f"efficiency {s['efficiency']:.2f} (fill/drain bound {bound:.2f}, {s['efficiency'] / bound:.2f} of it); "
              f"split {', '.join(s['split_points'])}")
        shares = (s.get("traces") or [{}])[0].get("per_rank", {})
        print(f"  {'rank':>4} {'host':>4} {'params':>7} {'pred ms':>8} {'meas ms':>8} {'compute':>8} {'wait':>6} "
              f"{'send':>6}   traced window: compute / send / recv-wait / idle %")
        all_params = sum(st["params"] for st in s["per_stage"]) or 1
        for st in s["per_stage"]:
            busy = [st.get(k) or 0.0 for k in ("compute_s", "wait_s", "send_s")]
            total = sum(busy) or 1.0
            tr = shares.get(str(st["rank"]), {})
            print(f"  {st['rank']:>4} {st['host']:>4} {100 * st['params'] / all_params:6.1f}% "
                  f"{st.get('predicted_ms') or 0:8.1f} {st.get('measured_ms') or 0:8.1f} "
                  f"{100 * busy[0] / total:7.0f}% {100 * busy[1] / total:5.0f}% {100 * busy[2] / total:5.0f}%   "
                  + (" / ".join(f"{tr.get(k, 0):.0f}" for k in ("compute_pct", "send_pct", "recv_wait_pct", "idle_pct"))
                     if tr else "-"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", type=float, default=0.4)
    parser.add_argument("--period-ms", type=float, default=10.0,
                        help="CFS period of the quota (10: uniformly slow hosts; the kernel's default is 100)")
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trace-steps", type=int, default=8)
    parser.add_argument("--slow-host", type=int, default=None,
                        help="cap this host (0-3) at half the others' quota: balanced should give it half the work")
    args = parser.parse_args()
    cluster = SshCluster(4)
    cluster.cfs_period_us = int(args.period_ms * 1000)
    cluster.up(cpu=args.cpu)
    if args.slow_host is not None:
        cluster.set_cpu(args.slow_host, args.cpu / 2)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PICTL_RUNS_DIR": f"{tmp}/runs", "PICTL_CACHE_DIR": f"{tmp}/cache"}
            proc = subprocess.run([sys.executable, "-m", "pictl", "sweep", "--hosts", str(cluster.inventory),
                                   "--stages", args.stages, "--policy", "equal,balanced", "--images",
                                   str(args.images), "--warmup", "1", "--repeats", str(args.repeats),
                                   "--trace-steps", str(args.trace_steps),
                                   "--out", f"{tmp}/sweep"], env=env, capture_output=True, text=True)
            slow = f" (h{args.slow_host}: {args.cpu / 2})" if args.slow_host is not None else ""
            print(f"{args.cpu} core(s) per host{slow} (CFS period {args.period_ms:g} ms), {args.images} images, "
                  f"{args.repeats} timed passes")
            print(proc.stdout)
            breakdown(Path(f"{tmp}/sweep"))
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
    finally:
        down()


if __name__ == "__main__":
    sys.exit(main())
