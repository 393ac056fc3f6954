"""A pipeline that keeps its balance: a host's CPU halved halfway through the timed passes (as throttling
would), then restored, with and without re-cutting, beside a fresh `balanced` run on the slowed cluster.

    sudo .venv/bin/python -m bench.recut [--cpu 0.4] [--images 24] [--repeats 16] [--slow-host 2]
                                         [--slow-at 4] [--restore-at 10] [--quick]

The 4-host SSH test cluster, every host at --cpu cores, DeiT-S as 4 `balanced` stages, chunk 1. Each run is
watched as it goes: when its `--slow-at`-th timed pass has ended, host --slow-host's quota is halved; when
its `--restore-at`-th has, it is restored. In turn: `pictl run` (re-cutting, the default), the same with
`--no-recut`, and a fresh `balanced` run started with the host already halved (its refinement sees the slow
host from the start: what a re-cut should reach). Printed: every timed pass's img/s for the two watched runs,
the re-cuts, and the ratios that matter: the re-cutting run's passes between its re-cut and the restore
against the fresh run's passes (at least 0.9 is the goal), and against the same passes without re-cutting.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import Pictl, add_quick, is_root, quick_defaults, save_result, skip_loudly, ssh_cluster, watched_run

PASS = re.compile(r"pictl pipeline: pass (\d+): ")


def on_passes(events: dict[int, Any]) -> Callable[[str], None]:
    """A progress-line hook calling events[k]() when timed pass k (1-based) has been reported."""
    def on_line(line: str) -> None:
        if (m := PASS.search(line)) and (k := int(m.group(1))) in events:
            events.pop(k)()
    return on_line


def between_passes_s(run_dir: str, skip: set[int]) -> list[float]:
    """Seconds from the last image leaving timed pass k to the first entering pass k + 1 (both on the hosts' wall
    clocks: the test cluster's hosts share one), for every k not in `skip` (a re-cut's rebuild). With re-cutting
    on, the gap holds the watch: rank 0 reporting the pass, the controller's answer, its broadcast."""
    sides: dict[str, dict[int, list[float]]] = {"enter": {}, "leave": {}}
    for events in Path(run_dir, "events").glob("*.jsonl"):
        for line in events.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") == "mb_times" and rec["side"] in sides and rec["phase"] == "timed":
                sides[rec["side"]].setdefault(rec["repeat"], []).extend(rec["base"] + t for t in rec["times"])
    enter, leave = sides["enter"], sides["leave"]
    return [min(enter[k + 1]) - max(leave[k]) for k in sorted(leave) if k + 1 in enter and k not in skip]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=float, default=0.4)
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--slow-host", type=int, default=2)
    ap.add_argument("--slow-at", type=int, default=4)
    ap.add_argument("--restore-at", type=int, default=10)
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=12, repeats=12, slow_at=3, restore_at=8)
    if not is_root():
        return skip_loudly("bench/recut.py", "needs root for the SSH test cluster (sudo)")
    pictl = Pictl()
    common = ["--stages", "4", "--policy", "balanced", "--chunk", "1", "--images", str(args.images), "--threads",
              "1"]
    runs: dict[str, dict] = {}
    with ssh_cluster(4, cpu=args.cpu) as cluster:
        inventory = str(cluster.inventory)
        pictl.run(cluster.inventory, *common, "--repeats", "2")  # profiles and link costs measured once, cached

        def slow() -> None:
            cluster.set_cpu(args.slow_host, args.cpu / 2)

        def restore() -> None:
            cluster.set_cpu(args.slow_host, args.cpu)

        for name, extra in (("recut", []), ("no-recut", ["--no-recut"])):
            runs[name] = watched_run(pictl, inventory, [*common, "--repeats", str(args.repeats), *extra],
                                     on_passes({args.slow_at: slow, args.restore_at: restore}))
            restore()
        slow()
        runs["fresh on the slowed cluster"] = pictl.run(cluster.inventory, *common, "--repeats", "4")
        restore()
    moved = [r for r in runs["recut"]["recuts"] if r["moved"]]
    print(f"\nDeiT-S, 4 balanced stages, chunk 1, {args.images} images a pass, hosts at {args.cpu:g} core; host "
          f"{args.slow_host} halved after timed pass {args.slow_at}, restored after pass {args.restore_at}")
    print(f"{'pass':>4} {'re-cutting':>11} {'no re-cut':>10}")
    for k, (a, b) in enumerate(zip(runs["recut"]["pass_ips"], runs["no-recut"]["pass_ips"], strict=False), 1):
        print(f"{k:>4} {a:>11.2f} {b:>10.2f}")
    for r in runs["recut"]["recuts"]:
        print(f"decision after pass {r['after_pass'] + 1}: {r['reason']}; {', '.join(r['split_points'])} -> "
              f"{', '.join(r['next_split'])}" + ("" if r["moved"] else " (kept)"))
    fresh = runs["fresh on the slowed cluster"]
    print(f"fresh balanced run on the slowed cluster: {fresh['throughput_ips']:.2f} img/s at "
          f"{', '.join(fresh['split_points'])}")
    result: dict[str, Any] = {"args": vars(args), "runs": runs}
    if moved:
        first = moved[0]["after_pass"] + 2  # the pass after the re-cut's cold one, 0-based
        end = args.restore_at  # passes [first, restore_at) ran the new split on the slowed host
        ours = runs["recut"]["pass_ips"][first:end]
        theirs = runs["no-recut"]["pass_ips"][first:end]
        if ours and theirs:
            mean = sum(ours) / len(ours)
            print(f"re-cut passes {first + 1}..{end}: {mean:.2f} img/s = {mean / fresh['throughput_ips']:.3f} of "
                  f"the fresh run's, {mean / (sum(theirs) / len(theirs)):.3f} of the same passes without re-cutting")
            result["ratio_to_fresh"] = mean / fresh["throughput_ips"]
            result["ratio_to_no_recut"] = mean / (sum(theirs) / len(theirs))
    else:
        print("no re-cut happened")
    # What the controller's watch costs between passes (outside every timed pass): the same gap with it and without.
    recut_at = {r["after_pass"] for r in runs["recut"]["recuts"] if r["moved"]}
    gaps = {name: between_passes_s(runs[name]["run_dir"], recut_at if name == "recut" else set())
            for name in ("recut", "no-recut")}
    if all(gaps.values()):
        with_watch, without = (statistics.median(gaps[n]) * 1000 for n in ("recut", "no-recut"))
        print(f"between timed passes (median, ms): {with_watch:.1f} with the controller's watch, {without:.1f} without "
              f"({len(gaps['recut'])} and {len(gaps['no-recut'])} gaps; the watch's round trip: "
              f"{with_watch - without:+.1f} ms a pass)")
        result["between_passes_ms"] = {"recut": with_watch, "no_recut": without}
    if args.save:
        print(f"saved: {save_result(args.save, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
