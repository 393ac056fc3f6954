"""The dashboard's own cost: CPU while 4 hosts stream progress at 200 events/s each, and key-press latency.

    .venv/bin/python -m bench.dashboard [--seconds 10] [--rate 200] [--hosts 4] [--rounds 3] [--presses 20] [--quick]

Four real processes (one per host of a local cluster, started through the local
transport as a run's ranks are) print progress records at the given rate; their
lines take the session's path into the app (parse_event -> RankEvent -> the
bridge -> the state -> 2 frames a second, progress drawn once a second). CPU is
this process's (the dashboard plus the line parsing), measured with the stream
on and off, in `--rounds` spans of each (this machine's speed wanders by a point
of a core between spans: the median and the range are printed). Latency: press
`?` and wait until the help panel is on screen, `--presses` times, while the stream runs. `--quick`: one
round of 1 s spans and 3 presses (a smoke run of the whole path, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import add_quick, quick_defaults, write_local_cluster
from pictl.cluster.transport import transport_for
from pictl.events import Placed, RankEvent, StagePlacement, parse_event
from pictl.inventory import Host, load_cluster
from pictl.planning.options import RunOptions
from pictl.tui.app import PictlApp
from pictl.tui.widgets.help_screen import HelpScreen
from pictl.tui.widgets.stage_list import StageList

EMITTER = """
import json, sys, time
rank, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
n, start = 0, time.time()
while time.time() - start < seconds:
    n += 1
    print(json.dumps({"v": 1, "event": "progress", "t": time.time(), "role": "pipeline", "rank": rank,
                      "stage": rank, "phase": "timed", "repeat": 0, "microbatches_total": 10**9,
                      "microbatches": n, "compute_s": n * 0.003, "wait_s": n * 0.001, "send_s": n * 0.0005,
                      "bytes_sent": n * 302592}), flush=True)
    time.sleep(max(0.0, start + n / rate - time.time()))
"""


async def stream(app: PictlApp, rate: float, seconds: float) -> int:
    sink = app.bridge  # the session's on_event in a real run
    count = 0

    async def one(host: Host) -> None:
        nonlocal count
        t = transport_for(host)
        proc = await t.start([sys.executable, "-c", EMITTER, str(host.name[1:]), str(rate), str(seconds)])
        try:
            async for channel, line in proc.lines():
                if channel == "stdout" and (rec := parse_event(line)) is not None:
                    sink(RankEvent(host.name, host.name, rec))
                    count += 1
            await proc.wait()
        finally:  # cancelled (the latency part): the emitter goes too, or the bench never ends
            await asyncio.shield(proc.stop(grace_s=1.0))

    await asyncio.gather(*(one(h) for h in app.cluster.hosts))
    return count


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--presses", type=int, default=20, help="key presses timed while streaming")
    add_quick(ap)
    args = quick_defaults(ap.parse_args(), seconds=1.0, rounds=1, presses=3)
    tmp = Path(tempfile.mkdtemp(prefix="pictl-bench-dash-"))
    cluster = load_cluster(write_local_cluster(tmp / "cluster", args.hosts))
    app = PictlApp(cluster, runs_root=tmp / "runs")
    print(f"{args.hosts} hosts x {args.rate:.0f} events/s: {args.rounds} x ({args.seconds:.0f} s idle, "
          f"{args.seconds:.0f} s streaming), then {args.presses} key presses while streaming", flush=True)
    async with app.run_test(size=(140, 44)) as pilot:
        # A run's panels, placed one rank per host as the session announces it (`Placed`, through the bridge).
        app.state.start_run(RunOptions(stages=args.hosts, chunk=1, warmup=0, repeats=1))
        app.bridge(Placed(tuple(StagePlacement(h.name, (rank,), 1) for rank, h in enumerate(cluster.hosts)),
                          serial_host=cluster.hosts[0].name, serial_threads=1))
        await app.query_one(StageList).reset(app.state)
        await pilot.pause(2)

        idle, busy, events, wall = [], [], 0, 0.0
        for _ in range(args.rounds):  # idle and streaming spans in turn: a drift in the machine's speed hits both
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(args.seconds)
            idle.append(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0))

            cpu0, wall0 = time.process_time(), time.perf_counter()
            events = await stream(app, args.rate, args.seconds)
            wall = time.perf_counter() - wall0
            busy.append(100 * (time.process_time() - cpu0) / wall)
        idle_pct, busy_pct = statistics.median(idle), statistics.median(busy)

        latencies = []
        task = asyncio.create_task(stream(app, args.rate, 60))
        await asyncio.sleep(1)
        for _ in range(args.presses):
            # Pilot.press waits for every queue to drain, which a stream never lets happen: post the key
            # the way the terminal driver does and time until the panel is laid out on the screen.
            start = time.perf_counter()
            app.simulate_key("question_mark")
            deadline = start + 5
            while not (isinstance(app.screen, HelpScreen) and (help_ := app.screen.query("#help"))
                       and help_.first().size.area):
                if time.perf_counter() > deadline:
                    raise SystemExit("the help screen never appeared")
                await asyncio.sleep(0.0005)
            latencies.append((time.perf_counter() - start) * 1000)
            app.simulate_key("escape")
            while isinstance(app.screen, HelpScreen):
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)
        # The stream goes on until every stage's panel has a throughput point: on a loaded machine an emitter
        # can start late enough that a stage had none yet when the presses were done (CI once: [1, 1, 0, 0]).
        deadline = time.perf_counter() + 30
        while not all(app.state.stages[r].ips for r in app.state.stages) and time.perf_counter() < deadline \
                and not task.done():
            await asyncio.sleep(0.1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        rendered = [len(app.state.stages[r].ips) for r in sorted(app.state.stages)]
        placed = [app.state.stages[r].host for r in sorted(app.state.stages)]

    print(f"dashboard CPU, {args.hosts} hosts x {args.rate:.0f} progress events/s ({events / wall:.0f} events/s "
          f"arrived over {wall:.1f} s):")
    print(f"  idle (host monitor only): {idle_pct:5.1f} % of one core (median of {args.rounds}; "
          f"{min(idle):.1f}-{max(idle):.1f})")
    print(f"  streaming:                {busy_pct:5.1f} % of one core (median of {args.rounds}; {min(busy):.1f}-"
          f"{max(busy):.1f}; {busy_pct / max(idle_pct, 0.1):.1f}x idle; target < 5 %)")
    print(f"key press -> screen updated (help panel), {args.presses} presses while streaming: median "
          f"{statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms (target: median < 50 ms)")
    print(f"  throughput points kept per stage: {rendered}")
    if placed != [h.name for h in cluster.hosts] or not all(rendered):  # the stream never reached the panels
        raise SystemExit(f"FAIL: stages placed on {placed}, throughput points per stage {rendered}")


if __name__ == "__main__":
    asyncio.run(main())
