"""equal vs balanced on slow emulated devices: the sweep on the SSH test cluster, each host CPU-capped.

    sudo .venv/bin/python bench/policies.py [--cpu 0.4] [--stages 1,2,3,4] [--images 24]

Starts the 4-host sshd cluster with every host capped at --cpu cores (cgroup CFS
quota), runs `pictl sweep --policy equal,balanced` on it in one invocation (one
serial baseline, then each stage count with each policy), and prints the sweep
table: throughput, speedup and efficiency per configuration, side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sshcluster import SshCluster, down  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", type=float, default=0.4)
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = SshCluster(4)
    cluster.up(cpu=args.cpu)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PICTL_RUNS_DIR": f"{tmp}/runs", "PICTL_CACHE_DIR": f"{tmp}/cache"}
            proc = subprocess.run([sys.executable, "-m", "pictl", "sweep", "--hosts", str(cluster.inventory),
                                   "--stages", args.stages, "--policy", "equal,balanced", "--images",
                                   str(args.images), "--warmup", "1", "--repeats", str(args.repeats),
                                   "--out", f"{tmp}/sweep"], env=env, capture_output=True, text=True)
            print(f"{args.cpu} core(s) per host, {args.images} images, {args.repeats} timed passes")
            print(proc.stdout)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
    finally:
        down()


if __name__ == "__main__":
    sys.exit(main())
