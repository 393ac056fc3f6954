"""The speedup waterfall of real runs, side by side: `equal` and `balanced` (or any policies), one table of
terms per run with the residual, and the latency per image beside the throughput.

    sudo .venv/bin/python -m bench.waterfall --ssh [--cpu 0.4] --stages 4 --images 96     # the SSH test cluster
    .venv/bin/python -m bench.waterfall --stages 2 --images 48                           # the shipped local cluster
    .venv/bin/python -m bench.waterfall --quick      # 2 stages, 4 images, 1 timed pass, a local cluster of its own

`--ssh` starts the SSH test cluster (root; `tests/support/sshcluster.py`) with every host capped at `--cpu` cores (a
CFS quota, 10 ms period), runs, and stops it. Each policy runs `--rounds` times in alternating order (the
machine's speed drifts: compare within one run of this script); the serial baseline is measured once and
reused by every run (it is the same for all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import add_quick, cluster, describe, is_root, quick_defaults, skip_loudly
from pictl.run.waterfall import ALL_TERMS, waterfall_line

ROOT = Path(__file__).resolve().parent.parent

def pictl_run(inventory: Path, policy: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "pictl", "run", "--hosts", str(inventory), "--stages", str(args.stages),
           "--policy", policy, "--images", str(args.images), "--warmup", "1", "--repeats", str(args.repeats),
           "--headless", "--json"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 7):
        raise SystemExit(f"pictl run --policy {policy} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def table(summary: dict) -> str:
    w = summary["waterfall"]
    lat = summary.get("latency") or {}
    pipe, serial = lat.get("pipeline") or {}, lat.get("serial") or {}
    lines = [f"{summary['policy']}: split {', '.join(summary['split_points'])}; pipeline "
             f"{summary['throughput_ips']:.2f} img/s, serial {summary['serial_ips']:.2f} img/s; "
             f"latency p50/p95/p99 {pipe.get('p50_ms', 0):.0f}/{pipe.get('p95_ms', 0):.0f}/{pipe.get('p99_ms', 0):.0f}"
             f" ms (serial {serial.get('p50_ms', 0):.0f}/{serial.get('p95_ms', 0):.0f}/{serial.get('p99_ms', 0):.0f})",
             "  " + waterfall_line(w), f"  {'term':<15} {'points':>8} {'share of gap':>13}"]
    for t in w["terms"]:
        share = "-" if t["share"] is None else f"{t['share']:.1%}"
        lines.append(f"  {t['term']:<15} {t['points']:>+8.3f} {share:>13}")
    residual = next(t for t in w["terms"] if t["term"] == "residual")
    lines.append(f"  residual / N = {abs(residual['points']) / w['stages']:.1%}; flags: "
                 + (", ".join(f["code"] for f in summary.get("flags") or []) or "none"))
    return "\n".join(lines)


def run_all(inventory: Path, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PICTL_RUNS_DIR": f"{tmp}/runs", "PICTL_CACHE_DIR": args.cache or f"{tmp}/cache"}
        out = []
        for r in range(args.rounds):
            order = args.policies if r % 2 == 0 else list(reversed(args.policies))
            for policy in order:
                summary = pictl_run(inventory, policy, args, env)
                out.append(summary)
                print(f"round {r + 1}, " + table(summary), flush=True)
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ssh", action="store_true", help="start the SSH test cluster (root) and run there")
    parser.add_argument("--cpu", type=float, default=0.4, help="--ssh: cores per host (a CFS quota)")
    parser.add_argument("--hosts", type=Path, default=ROOT / "hosts.toml")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--policies", nargs="+", default=["equal", "balanced"])
    parser.add_argument("--cache", help="a cache directory to keep (profiles, baselines) between invocations")
    parser.add_argument("--save", type=Path, help="write every run's summary to this JSON file")
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), stages=2, images=4, repeats=1, rounds=1, ssh=False)
    kind = "ssh" if args.ssh else "local" if args.quick else "shipped"
    if kind == "ssh" and not is_root():
        return skip_loudly("waterfall", "--ssh needs root (the SSH test cluster)")
    with cluster(kind, args.stages, cpu=args.cpu, inventory=args.hosts) as inventory:
        print(f"on {describe(kind, args.cpu)}", flush=True)
        runs = run_all(inventory, args)
    assert all(t in ALL_TERMS for r in runs for t in (x["term"] for x in r["waterfall"]["terms"]))
    if args.save:
        args.save.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
