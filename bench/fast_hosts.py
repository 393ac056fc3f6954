"""Fast hosts: local hosts pinned to cores of their own (no CFS quota), `equal` and `balanced` stages and replicas
against one serial baseline, with the waterfall's fixed-cost terms (communication, runtime) per run.

    .venv/bin/python -m bench.fast_hosts                        # this machine: as many 1-core hosts as it has cores
    .venv/bin/python -m bench.fast_hosts --cores 4 --hosts 4    # a 16-core machine: 4 hosts x 4 cores, 4 threads
    .venv/bin/python -m bench.fast_hosts --vs-tree /tmp/old     # the same runs from another checkout, interleaved
    .venv/bin/python -m bench.fast_hosts --quick                # 4 images, 1 timed pass, 1 round

Every host gets `--cores` cores of its own (`cpus` in hosts.toml) and every rank `--cores` torch threads, so a
host is a machine apart with nothing but its own stage on it, as a Pi is; this machine kind's 2 cores give 2
one-core hosts, a 16-core machine 4 hosts of 4. The serial baseline is measured once per tree (cached for the
run of this script) and every configuration's speedup divides by it.

`--vs-tree PATH` runs the same configurations from a second checkout (e.g. `git worktree add /tmp/old HEAD~3`)
on an inventory of its own over the same cores, alternating the two trees' order every round, and prints per
configuration the ratio of the trees' throughputs and of their `communication` + `runtime` points: what a
change to the pipeline's fixed costs bought, measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import ROOT, add_quick, alternate, last_json, median_spread, quick_defaults, save_result

FIXED_TERMS = ("communication", "runtime")
"""The waterfall terms a microbatch's fixed costs show up in (`pictl.run.waterfall`)."""


def pinned_inventory(path: Path, hosts: int, cores: int) -> Path:
    """`hosts` local hosts, host i pinned to cores [i*cores, (i+1)*cores), work directories under `path`."""
    body = ['[cluster]\nname = "fast"\n', '[defaults]\ntransport = "local"\ninterface = "lo"\nslots = 1\n']
    for i in range(hosts):
        first = i * cores
        cpus = str(first) if cores == 1 else f"{first}-{first + cores - 1}"
        body.append(f'[[host]]\nname = "f{i}"\nworkdir = "{path}/f{i}"\ncpus = "{cpus}"\n')
    path.mkdir(parents=True, exist_ok=True)
    inventory = path / "hosts.toml"
    inventory.write_text("\n".join(body))
    return inventory


class Tree:
    """One checkout's pictl, on an inventory and with a cache (its serial baseline) of its own."""

    def __init__(self, name: str, root: Path, scratch: Path, hosts: int, cores: int) -> None:
        self.name, self.root = name, root
        self.inventory = pinned_inventory(scratch / name, hosts, cores)
        path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "PICTL_RUNS_DIR": str(scratch / name / "runs"),
                    "PICTL_CACHE_DIR": str(scratch / name / "cache"), "PYTHONPATH": path}

    def run(self, args: list[str]) -> dict:
        proc = subprocess.run([sys.executable, "-m", "pictl", "run", "--hosts", str(self.inventory), *args,
                               "--headless", "--json"], env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=1800)
        if proc.returncode not in (0, 10):  # 10: SUSPECT, still a measured summary (its flags are printed)
            raise SystemExit(f"[{self.name}] pictl run {' '.join(args)} failed ({proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        return last_json(proc.stdout, f"[{self.name}] pictl run {' '.join(args)}")


def configurations(hosts: int) -> dict[str, list[str]]:
    return {f"{hosts} stages equal": ["--stages", str(hosts), "--policy", "equal"],
            f"{hosts} stages balanced": ["--stages", str(hosts), "--policy", "balanced"],
            f"{hosts} replicas": ["--stages", "1", "--replicas", str(hosts)]}


def points(summary: dict, term: str) -> float:
    return sum(t["points"] for t in (summary.get("waterfall") or {}).get("terms", []) if t["term"] == term)


def bottleneck_ms(summary: dict) -> dict[str, float]:
    """The waterfall's bottleneck rank's wire counters, in ms per image: where its communication goes."""
    w = summary.get("waterfall") or {}
    stages = summary.get("per_stage") or []
    if w.get("bottleneck_rank") is None or not stages:
        return {}
    st = stages[w["bottleneck_rank"]]
    per = summary["images"] * summary["repeats"] / (summary.get("replicas") or 1) / 1000
    keys = ("recv_post_s", "recv_wait_s", "first_wait_s", "send_post_s", "drain_s", "compute_s", "pass_s")
    return {k.removesuffix("_s"): round((st.get(k) or 0.0) / per, 3) for k in keys}


def figures(summary: dict) -> dict:
    return {"speedup": summary["speedup"], "throughput_ips": summary["throughput_ips"],
            "serial_ips": summary["serial_ips"], "outputs_match": summary.get("outputs_match"),
            "split_points": summary.get("split_points"),
            "terms": {t["term"]: t["points"] for t in (summary.get("waterfall") or {}).get("terms", [])},
            "fixed_points": sum(points(summary, t) for t in FIXED_TERMS),
            "per_image_ms": (summary.get("waterfall") or {}).get("per_image_ms"),
            "bottleneck": bottleneck_ms(summary),
            "flags": [f["code"] for f in summary.get("flags") or []]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cpus = len(os.sched_getaffinity(0))
    parser.add_argument("--cores", type=int, default=max(1, cpus // 4), help="cores (and threads) per host")
    parser.add_argument("--hosts", type=int, default=0, help="hosts (default: as many as fit, at most 4)")
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="configurations to run (default: all), e.g. 'balanced'")
    parser.add_argument("--vs-tree", type=Path, help="a second checkout to measure side by side")
    parser.add_argument("--save", help="result name or path (default: print only)")
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), images=4, repeats=1, rounds=1)
    hosts = args.hosts or min(4, cpus // args.cores)
    if hosts < 2 or hosts * args.cores > cpus:
        print(f"bench.fast_hosts: {hosts} hosts x {args.cores} cores do not fit the {cpus} cores this process may "
              f"use", file=sys.stderr)
        return 2
    protocol = ["--images", str(args.images), "--warmup", "1", "--repeats", str(args.repeats),
                "--threads", str(args.cores), "--chunk", "1"]
    chosen = {k: v for k, v in configurations(hosts).items()
              if not args.only or any(o in k for o in args.only)}
    print(f"{hosts} local hosts x {args.cores} pinned cores, {args.cores} threads per rank, {args.images} images, "
          f"{args.repeats} timed passes, {args.rounds} round(s)", flush=True)
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory(prefix="pictl-bench-fast-") as tmp:
        trees = [Tree("this", ROOT, Path(tmp), hosts, args.cores)]
        if args.vs_tree:
            trees.append(Tree("other", args.vs_tree.resolve(), Path(tmp), hosts, args.cores))
        for r in range(args.rounds):
            for name, config in chosen.items():
                for tree in alternate(trees, r):
                    f = figures(tree.run(protocol + config))
                    results.setdefault(name, {}).setdefault(tree.name, []).append(f)
                    terms = ", ".join(f"{t} {p:+.2f}" for t, p in f["terms"].items() if abs(p) >= 0.01)
                    print(f"round {r + 1} [{tree.name}] {name}: {f['speedup']:.2f}x ({f['throughput_ips']:.1f} img/s, "
                          f"serial {f['serial_ips']:.1f}); outputs match {f['outputs_match']}; {terms}; flags "
                          f"{','.join(f['flags']) or 'none'}", flush=True)
                    print(f"    bottleneck rank, ms per image: {f['bottleneck']}", flush=True)
    print("\nmedians (spread = (max - min) / median):")
    for name, per_tree in results.items():
        for tree_name, runs in per_tree.items():
            s, sp = median_spread([x["speedup"] for x in runs])
            fixed = statistics.median(x["fixed_points"] for x in runs)
            print(f"  [{tree_name}] {name}: {s:.2f}x (spread {sp:.1%}), communication + runtime {fixed:+.3f} points")
        if len(per_tree) == 2:
            pairs = list(zip(per_tree["this"], per_tree["other"], strict=True))
            tput, tsp = median_spread([a["throughput_ips"] / b["throughput_ips"] for a, b in pairs])
            print(f"  {name}: this / other throughput {tput:.3f} (spread {tsp:.1%}); fixed-cost points this "
                  f"{statistics.median(a['fixed_points'] for a, _ in pairs):+.3f} against other "
                  f"{statistics.median(b['fixed_points'] for _, b in pairs):+.3f}")
    if args.save:
        saved = save_result(args.save, {"hosts": hosts, "cores": args.cores, "cpus": cpus, "images": args.images,
                                        "repeats": args.repeats, "results": results})
        print(f"saved {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
