"""`python -m bench` (`make bench`): every benchmark script's quick mode, one after another, with a verdict each.

A quick run is a smoke run of the script's whole path (its cluster, its runs, its verdict), not a figure:
the figures in the README come from each script's full protocol. A script that needs what this machine lacks
(root for the SSH cluster) says so in one loud line and counts as skipped, never as passed.

    python -m bench [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICK = ("check_verdict", "dashboard", "reference", "ceiling", "prune", "int8", "train_memory", "noise", "train",
         "waterfall", "startup", "serial_vs_pipeline", "check_speedup", "policies", "compare", "wire_agreement",
         "numerics", "tune", "recut", "train_wire", "wire", "push_and_startup", "models", "host_loss", "fast_hosts",
         "generate")
"""Every script, cheapest quick mode first (tests/functional/test_bench.py: none is left out)."""


def run(name: str) -> tuple[str, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", f"bench.{name}", "--quick"], cwd=ROOT, capture_output=True,
                          text=True)
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        print(out[-3000:], flush=True)
        return "FAIL", took
    return ("SKIPPED" if "SKIPPED:" in out else "PASS"), took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=QUICK, help="these scripts only")
    ap.add_argument("--list", action="store_true", help="list the scripts and stop")
    args = ap.parse_args()
    if args.list:
        print("\n".join(QUICK))
        return 0
    verdicts = {}
    for name in args.only or QUICK:
        print(f"bench.{name} --quick ...", flush=True)
        verdicts[name] = run(name)
        print(f"  {verdicts[name][0]} in {verdicts[name][1]:.0f} s", flush=True)
    print("\n".join(f"{v:8} {t:5.0f} s  bench.{n}" for n, (v, t) in verdicts.items()))
    return 1 if any(v == "FAIL" for v, _ in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
