"""Start-up, warm against cold: how long `pictl run` takes to its first image, how much of a sweep is spent
outside warm-up and timed passes, and how the controller's fan-out scales with hosts.

    .venv/bin/python -m bench.startup                         # local cluster: first image, then a sweep
    sudo .venv/bin/python -m bench.startup --ssh --cpu 0.4    # also the emulated 4-host SSH cluster
    sudo .venv/bin/python -m bench.startup --fanout           # check, push, warm-up on 16 SSH hosts against 4
    .venv/bin/python -m bench.startup --quick                 # what `make bench` runs: 2 rounds, no sweep

First image: from the moment `python -m pictl run` is started (the controller's own imports included) to the
first image leaving the pipeline's last stage (its `first_output` record's time; the hosts share this
machine's clock; over SSH the hosts are this machine's namespaces). A first run of each mode caches profile,
plan and baseline and starts the warm processes, so what is compared is what every later run pays; warm and
cold alternate round by round (the machine's speed drifts).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Pictl, add_quick, cluster, describe, is_root, quick_defaults, save_result, skip_loudly


def first_image_s(pictl: Pictl, inventory: Path, extra: list[str]) -> tuple[float, dict[str, Any]]:
    """Seconds from starting `pictl run` to its first image, and the run's summary."""
    t0 = time.time()
    summary = pictl.run(inventory, *extra, ok=(0, 7))
    events = Path(summary["run_dir"]) / "events"
    first = min((json.loads(line)["t"] for f in events.glob("*.jsonl") if f.stem != "serial"
                 for line in f.read_text().splitlines() if '"event":"first_output"' in line), default=None)
    assert first is not None, f"no first_output in {events}"
    return first - t0, summary


def stop_warm(pictl: Pictl, inventory: Path) -> None:
    subprocess.run([sys.executable, "-m", "pictl", "stop", "--hosts", str(inventory)], env=pictl.env, cwd=ROOT,
                   capture_output=True, timeout=300)


def first_image(pictl: Pictl, inventory: Path, run_args: list[str], rounds: int) -> dict[str, Any]:
    for extra in ([], ["--cold"]):  # cache profile, plan and baseline (and the next warm process: stopped below)
        pictl.run(inventory, *run_args, *extra, ok=(0, 7))
    times: dict[str, list[float]] = {"warm": [], "cold": []}
    imports: dict[str, list[int]] = {"warm": [], "cold": []}
    for r in range(rounds):
        for mode in (("cold", "warm") if r % 2 else ("warm", "cold")):
            seconds, summary = first_image_s(pictl, inventory, [*run_args, *(["--cold"] if mode == "cold" else [])])
            times[mode].append(seconds)
            imports[mode].append(summary["startup"]["torch_imports"])
            print(f"round {r + 1} {mode}: first image after {seconds:.2f} s (pictl's own start-up record "
                  f"{summary['startup']['total_s']:.2f} s; torch imported {summary['startup']['torch_imports']} "
                  f"time(s); baseline reused {summary['serial_reused']})", flush=True)
    warm, cold = statistics.median(times["warm"]), statistics.median(times["cold"])
    print(f"median first image: warm {warm:.2f} s (range {min(times['warm']):.2f}-{max(times['warm']):.2f}), "
          f"cold {cold:.2f} s (range {min(times['cold']):.2f}-{max(times['cold']):.2f}): cold / warm "
          f"{cold / warm:.2f}x", flush=True)
    return {"warm_s": times["warm"], "cold_s": times["cold"], "warm_median_s": warm, "cold_median_s": cold,
            "torch_imports": imports}


def sweep_share(pictl: Pictl, inventory: Path, cold: bool, images: int, repeats: int) -> dict[str, Any]:
    """A sweep's wall time, and the share of it outside the runs' warm-up and timed passes."""
    out = pictl.workdir / f"sweep-{'cold' if cold else 'warm'}-{time.time():.0f}"
    t0 = time.perf_counter()
    result = pictl("sweep", "--hosts", str(inventory), "--stages", "1,2,3,4", "--policy", "equal,balanced",
                   "--images", str(images), "--repeats", str(repeats), "--out", str(out), *(["--cold"] if cold else []),
                   "--rounds", "1", "--max-rounds", "1", ok=(0, 7))  # one run a point: start-up, not a ranking
    wall = time.perf_counter() - t0
    measuring = 0.0
    sweep = json.loads((Path(result["sweep_dir"]) / "sweep.json").read_text())
    for run_id in [r["reference"]["run_id"] for r in sweep["rounds"]] + [
            run["run_id"] for r in sweep["rounds"] for run in r["runs"].values()]:  # (every run: under the runs root)
        if not run_id:
            continue
        summary = json.loads((pictl.workdir / "runs" / run_id / "summary.json").read_text())
        passes = (summary.get("warmup") or 0) + (summary.get("repeats") or 0)
        if summary.get("throughput_ips"):
            measuring += passes * summary["images"] / summary["throughput_ips"]
        if not summary.get("serial_reused") and summary.get("serial_ips"):
            measuring += passes * summary["images"] / summary["serial_ips"]
    share = 1 - measuring / wall
    print(f"sweep 1,2,3,4 stages x equal,balanced, {images} images x {repeats} passes, {'cold' if cold else 'warm'}: "
          f"{wall:.1f} s, of which "
          f"{measuring:.1f} s warm-up and timed passes: {share:.0%} outside them", flush=True)
    return {"wall_s": wall, "measuring_s": measuring, "outside_share": share}


def fanout(pictl: Pictl, cpu: float) -> dict[str, Any]:
    """`pictl check`, `pictl push` and `pictl warm` on 4 and on 16 SSH hosts: the wall time of each."""
    found: dict[str, Any] = {}
    for hosts in (4, 16):
        with cluster("ssh", hosts, cpu=cpu) as inventory:
            for command in ("check", "push", "warm"):
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "pictl", command, "--hosts", str(inventory)],
                                      env=pictl.env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
                found[f"{command}_{hosts}"] = seconds = time.perf_counter() - t0
                print(f"{hosts} hosts: pictl {command} {seconds:.2f} s (exit {proc.returncode})", flush=True)
            stop_warm(pictl, inventory)
    for command in ("check", "push", "warm"):
        ratio = found[f"{command}_16"] / found[f"{command}_4"]
        print(f"pictl {command}: 16 hosts / 4 hosts = {ratio:.2f}x", flush=True)
        found[f"{command}_ratio"] = ratio
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ssh", action="store_true", help="the emulated 4-host SSH cluster (root)")
    parser.add_argument("--cpu", type=float, default=0.4, help="cores per SSH host")
    parser.add_argument("--fanout", action="store_true", help="16 SSH hosts against 4 (root)")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--no-first-image", action="store_true")
    parser.add_argument("--sweep-images", type=int, default=48, help="images per pass in the sweep (run's default)")
    parser.add_argument("--sweep-repeats", type=int, default=3, help="timed passes per sweep run (run's default)")
    parser.add_argument("--images", type=int, default=8, help="images per pass in the first-image runs")
    parser.add_argument("--save", help="write the figures to bench/results/NAME.json")
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), rounds=2, no_sweep=True, ssh=False, fanout=False)
    pictl = Pictl()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M")}
    run_args = ["--stages", "2", "--split", "blocks.6", "--images", str(args.images), "--warmup", "0",
                "--repeats", "1"]
    with cluster("local", 4) as inventory:
        if not args.no_first_image:
            print(f"first image, {describe('local', None)}, 2 stages, {args.images} images:", flush=True)
            results["local"] = first_image(pictl, inventory, run_args, args.rounds)
        if not args.no_sweep:
            # Each mode on a cache of its own: both measure their serial baselines and profiles.
            cold_pictl, warm_pictl = Pictl(pictl.workdir / "cold"), Pictl(pictl.workdir / "warm")
            results["sweep"] = {"cold": sweep_share(cold_pictl, inventory, True, args.sweep_images, args.sweep_repeats),
                                "warm": sweep_share(warm_pictl, inventory, False, args.sweep_images,
                                                    args.sweep_repeats)}
        stop_warm(pictl, inventory)
    if args.ssh or args.fanout:
        if not is_root():
            return skip_loudly("startup", "--ssh and --fanout need root (the SSH test cluster)")
    if args.ssh:
        with cluster("ssh", 4, cpu=args.cpu) as inventory:
            print(f"first image, {describe('ssh', args.cpu)}, 4 stages:", flush=True)
            ssh_args = ["--stages", "4", "--policy", "equal", "--images", str(args.images), "--warmup", "0",
                        "--repeats", "1"]
            results["ssh"] = first_image(pictl, inventory, ssh_args, args.rounds)
            stop_warm(pictl, inventory)
    if args.fanout:
        results["fanout"] = fanout(pictl, 0.1)
    if args.save:
        print(f"saved {save_result(args.save, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
