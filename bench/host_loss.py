"""Fail in place, timed: a rank killed during the second timed pass, and how long until the run goes on.

    .venv/bin/python -m bench.host_loss [--hosts 3] [--images 24] [--repeats 4] [--rounds 3] [--quick]

A local cluster of --hosts hosts, DeiT-S as that many `equal` stages, chunk 2. In each round, a warm run and a cold
one (`--cold`), in alternating order: when the headless result says timed pass 1 is done, h1's rank (the process
itself, its pid from its `run_start` record) is SIGKILLed, and the run goes on with one stage fewer
(`--on-host-loss continue`, the default). Printed per start: the medians (and ranges) of

    detect     the kill -> the controller seeing the launch fail (a rank's exit read to its end)
    re-plan    failure seen -> the next segment's launch (every rank stopped, placed, split, staged)
    to image   the kill -> the next segment's first output at the controller (the goal: under 5 s warm)

and the share of the run's images computed again (the pass in flight). Every run's outputs must match the serial
run's, or the bench fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import Pictl, add_quick, alternate, quick_defaults, save_result, watched_run, write_local_cluster

PASS_DONE = "pictl pipeline: pass 1: "


def _rank_pid(run_dir: Path, host: str) -> int | None:
    events = run_dir / "events" / f"{host}.jsonl"
    for line in events.read_text().splitlines() if events.exists() else []:
        if '"event":"run_start"' in line:
            return int(json.loads(line)["pid"])
    return None


def killed_run(pictl: Pictl, inventory: Path, args: list[str]) -> dict[str, Any]:
    """One run whose h1 rank is killed once timed pass 1 is reported; its summary, with `killed_at`."""
    runs = Path(pictl.env["PICTL_RUNS_DIR"])
    before = set(runs.glob("*"))
    killed: list[float] = []

    def on_line(line: str) -> None:
        if killed or not line.startswith(PASS_DONE):
            return
        fresh = [d for d in runs.glob("*") if d not in before]
        pid = _rank_pid(fresh[0], "h1") if len(fresh) == 1 else None
        if pid is None:
            raise SystemExit("no run_start record from h1's rank")
        os.kill(pid, signal.SIGKILL)
        killed.append(time.time())

    summary = watched_run(pictl, inventory, args, on_line, ok=(0, 10))  # (10: SUSPECT on a busy machine)
    if not killed or not summary["outputs_match"] or not summary["host_lost"]:
        raise SystemExit(f"the run did not lose h1 and go on with its outputs checked: {summary.get('host_lost')}")
    return {**summary, "killed_at": killed[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--save", default=None)
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), images=12, repeats=3, rounds=1)
    pictl = Pictl()
    inventory = write_local_cluster(pictl.workdir / "cluster", args.hosts)
    common = ["--stages", str(args.hosts), "--policy", "equal", "--chunk", "2", "--images", str(args.images),
              "--repeats", str(args.repeats), "--warmup", "1"]
    pictl.run(inventory, *common, "--repeats", "1")  # the serial baseline cached, the warm processes started
    found: dict[str, list[dict[str, float]]] = {"warm": [], "cold": []}
    for k in range(args.rounds):
        for start in alternate(["warm", "cold"], k):
            s = killed_run(pictl, inventory, [*common, *(["--cold"] if start == "cold" else [])])
            loss = s["host_lost"][0]
            found[start].append({"detect_s": loss["failed_at"] - s["killed_at"], "replan_s": loss["replan_s"],
                                 "to_image_s": loss["failed_at"] + loss["lost_s"] - s["killed_at"],
                                 "recomputed_share": loss["recomputed_images"] / (args.images * args.repeats)})
            print(f"round {k + 1} {start}: " + ", ".join(f"{n} {v:.3f}" for n, v in found[start][-1].items()))
    print(f"\nlocal cluster, {args.hosts} hosts, DeiT-S {args.hosts} equal stages, chunk 2, {args.images} images x "
          f"{args.repeats} timed passes; h1's rank killed in timed pass 2, {args.rounds} round(s)")
    for start, rows in found.items():
        cells = []
        for name in ("detect_s", "replan_s", "to_image_s", "recomputed_share"):
            xs = [r[name] for r in rows]
            cells.append(f"{name} {statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]")
        print(f"{start}: " + "; ".join(cells))
    if args.save:
        print(f"saved: {save_result(args.save, {'args': vars(args), 'found': found})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
