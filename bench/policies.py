"""equal vs balanced vs a plain torch.distributed.pipelining run, side by side in one invocation.

    .venv/bin/python -m bench.policies --cluster local [--stages 2] [--images 48]           # no root
    sudo .venv/bin/python -m bench.policies --cluster ssh [--cpu 0.4] [--period-ms 10] [--stages 2,3,4]
                                            [--images 96] [--slow-host 2] [--rounds 1]
    .venv/bin/python -m bench.policies --quick     (local, 2 stages, 4 images, 1 timed pass, no one-shot run)

For each stage count, against one serial baseline (pictl's, measured once and reused by every run),
in turn: the plain reference (`bench/reference.py pipeline`: ScheduleGPipe at the block-boundary
equal split, no pictl code in the loop, launched with torchrun on the same hosts, as
`bench/check_speedup.py` does), `pictl run --policy
equal`, `pictl run` (balanced, refined during the run) and `pictl run --no-refine` (the one-shot
split). Each is printed as img/s, as a ratio to the serial baseline and as a ratio to the plain
reference; the plain serial loop is measured too, so the two serial baselines can be compared.
`--rounds 2` runs the whole sequence twice (interleaved), for a spread.

`--cluster local` is the shipped kind of cluster: one local host per stage on this machine.
`--cluster ssh` starts the 4-host SSH test cluster (root: network namespaces, sshd, cgroups) with
every host capped at --cpu cores (a CFS quota enforced per --period-ms; host --slow-host at half).
Then, per balanced run, where the time went: each stage's predicted and measured compute per
microbatch, its wait and send, and each refinement round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.check_speedup import equal_blocks, place_reference, reference_pipeline, reference_serial
from bench.harness import add_quick, cluster, is_root, quick_defaults, skip_loudly
from pictl.inventory import load_cluster


def pictl_run(inventory: Path, env: dict, stages: int, images: int, repeats: int, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pictl", "run", "--hosts", str(inventory), "--stages", str(stages),
                           "--images", str(images), "--warmup", "1", "--repeats", str(repeats), "--threads", "1",
                           "--headless", "--json", *extra], env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"pictl run {' '.join(extra)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def stage_lines(s: dict) -> list[str]:
    out = []
    for r in (s.get("refine") or {}).get("rounds", []):
        out.append(f"    refine {r['round']}: {', '.join(r['split_points'])}: predicted "
                   f"{'/'.join(f'{v:.1f}' for v in r['predicted_ms'])}, measured "
                   f"{'/'.join(f'{v:.1f}' for v in r['measured_ms'])} ms; {r.get('reason') or '-'}")
    for st in s["per_stage"]:
        err = st.get("prediction_error")
        out.append(f"    rank {st['rank']} {st['host']:>7}: compute {st['measured_ms']:7.1f} ms (predicted "
                   f"{st.get('predicted_ms') or 0:7.1f}, error {'-' if err is None else format(err, '+.1%')}), "
                   f"wait {st['wait_ms']:6.1f}, send {st['send_ms']:6.1f} ms per microbatch")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", choices=("local", "ssh"), default="local")
    parser.add_argument("--cpu", type=float, default=0.4)
    parser.add_argument("--period-ms", type=float, default=10.0)
    parser.add_argument("--stages", default="2")
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--slow-host", type=int, default=None)
    parser.add_argument("--no-one-shot", action="store_true", help="skip the --no-refine runs")
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), cluster="local", stages="2", images=4, repeats=1, rounds=1,
                          no_one_shot=True)
    if args.cluster == "ssh" and not is_root():
        return skip_loudly("policies", "--cluster ssh needs root (the SSH test cluster)")
    stage_counts = [int(s) for s in args.stages.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="pictl-bench-"))
    env = {**os.environ, "PICTL_RUNS_DIR": str(tmp / "runs"), "PICTL_CACHE_DIR": str(tmp / "cache")}
    protocol = ["--images", str(args.images), "--warmup", "1", "--repeats", str(args.repeats), "--threads", "1"]
    results: dict[tuple[int, str], list[dict]] = {}
    with cluster(args.cluster, max(stage_counts), cpu=args.cpu, period_ms=args.period_ms,
                 slow_host=args.slow_host) as inventory:
        hosts = list(load_cluster(inventory).hosts)
        scripts = [place_reference(h) for h in hosts]
        serial = pictl_run(inventory, env, 1, args.images, args.repeats)
        plain_serial = reference_serial(hosts[0], scripts[0], protocol, 1)
        for _ in range(args.rounds):
            for stages in stage_counts:
                results.setdefault((stages, "plain"), []).append(
                    reference_pipeline(hosts[:stages], scripts[:stages], equal_blocks(stages), protocol, 1))
                for label, extra in (("equal", ["--policy", "equal"]), ("balanced", []),
                                     ("one-shot", ["--no-refine"])):
                    if label == "one-shot" and args.no_one_shot:
                        continue
                    results.setdefault((stages, label), []).append(
                        pictl_run(inventory, env, stages, args.images, args.repeats, *extra))
    caps = f"{args.cpu} core(s) per host, CFS period {args.period_ms:g} ms" if args.cluster == "ssh" else "uncapped"
    slow = f", h{args.slow_host} at half" if args.slow_host is not None else ""
    print(f"{args.cluster} cluster ({caps}{slow}); {args.images} images, chunk 1, 1 thread per rank, 1 warm-up and "
          f"{args.repeats} timed passes, {args.rounds} round(s)")
    print(f"serial baseline: pictl {serial['throughput_ips']:.2f} img/s {serial['throughput_spread_ips']}, "
          f"plain loop {plain_serial['mean_ips']:.2f} img/s ({plain_serial['mean_ips'] / serial['throughput_ips']:.3f} "
          f"of pictl's)")
    print(f"{'stages':>6} {'run':>9} {'img/s':>7} {'spread':>13} {'x serial':>8} {'x plain':>7} {'eff':>5}  split")
    for stages in stage_counts:
        plain = statistics.fmean(r["mean_ips"] for r in results[(stages, "plain")])
        for label in ("plain", "equal", "balanced", "one-shot"):
            runs = results.get((stages, label))
            if not runs:
                continue
            if label == "plain":
                ips = [x for r in runs for x in r["ips"]]
                split = ", ".join(runs[0]["split"])
            else:
                ips = [x for r in runs for x in r["throughput_spread_ips"]]
                split = ", ".join(runs[-1]["split_points"])
            mean = statistics.fmean(r["mean_ips"] if label == "plain" else r["throughput_ips"] for r in runs)
            speedup = mean / serial["throughput_ips"]
            print(f"{stages:>6} {label:>9} {mean:7.2f} {min(ips):6.2f}-{max(ips):<6.2f} {speedup:7.2f}x "
                  f"{mean / plain:6.2f}x {speedup / stages:5.2f}  {split}")
    for (stages, label), runs in results.items():
        if label in ("balanced", "one-shot", "equal"):
            print(f"\n{stages} stages, {label} (last round): split {', '.join(runs[-1]['split_points'])}")
            print("\n".join(stage_lines(runs[-1])))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
