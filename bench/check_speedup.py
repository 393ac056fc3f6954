"""An independent check of pictl's speedup: pictl against a plain reference, same hosts, one invocation.

    .venv/bin/python -m bench.check_speedup [--hosts hosts.toml] [--stages 2] [--images 12] [--repeats 20]
        [--rounds 12] [--save rounds.json]
    sudo .venv/bin/python -m bench.check_speedup --ssh [--cpu 0.4] [--period-ms 10] --stages 4 [--rounds 8]
    .venv/bin/python -m bench.check_speedup --pool saved1.json saved2.json   (rounds of earlier --save runs)
    .venv/bin/python -m bench.check_speedup --quick     (1 round of 4 images x 2 passes on the shipped cluster)

Per round, on the same hosts and with the same protocol (model, split, images,
chunk, threads, warm-up and timed passes): the plain serial reference on the
first host (the whole timm model in a loop: `bench/reference.py serial`),
`pictl run --fresh-baseline` (its serial baseline, then its pipeline), and the
plain pipeline reference (`bench/reference.py pipeline`: the eager timm model cut
at the same block boundaries into torch.distributed.pipelining `PipelineStage`s,
ScheduleGPipe over gloo, one `torchrun` per host, started with plain `ssh` on SSH
hosts; its output is checked against the whole model's). The order alternates:
odd rounds run plain serial, pictl, plain pipeline (each plain run next to the
pictl phase it is compared with); even rounds plain pipeline, plain serial, pictl,
so that a speed drifting steadily within a round biases the two orders' ratios
equally and oppositely and cancels in their geometric mean. No pictl code runs in
the reference's loop. Prints each side's serial and pipeline throughput, both
speedups and their ratio (pictl / reference: 1.00 means pictl's figure is what a
plain run gets), and the ratio taken apart: pictl's serial over the plain loop's
(serial factor) and pictl's pipeline over the plain pipeline's (pipeline factor).

Two ratios per round: of the means of the timed passes (pictl's reported
speedup, the lab's protocol) and of each run's fastest pass. This machine kind's
speed wanders on its own (a serial loop alone, pinned to one CPU, ran 25 % slower
for 7 s stretches and then recovered; passes of one run spread 15-45 %), so one
round's ratio scatters by 10-20 %. Many short passes give each run a few passes
outside those stretches, and the fastest pass each compares the two tools at the
machine's least disturbed speed; the means carry whatever the noise did to each
of the four runs. Over the rounds the script prints each ratio's geometric mean
with a 95 % bootstrap interval, and says whether that interval lies within 5 %
of 1 (a systematic cost or gain of pictl's would move both ratios).

`--ssh` starts the SSH test cluster (root; `tests/support/sshcluster.py`) with every host
capped at `--cpu` cores, and stops it afterwards. The shipped `hosts.toml` is the
local cluster: no root needed. The last line is the harness's PASS/FAIL verdict on the
ratio of the means (PASS: the interval lies within 5 % of 1); it does not set the exit status.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import harness
from bench.check_verdict import AGREEMENT, ORDERS, geometric_mean_ci, pooled, verdict
from bench.harness import REFERENCE, SHIPPED, Pictl, last_json
from pictl.inventory import Host, load_cluster  # reads hosts.toml; not in any timed loop

_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def _word(value: str) -> str:
    return '"$HOME"/' + shlex.quote(value[2:]) if value.startswith("~/") else shlex.quote(value)


def on_host(host: Host, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The command line that runs `argv` on `host`: as is on a local host, through plain ssh(1) otherwise
    (with the inventory's key and known_hosts; host keys are checked)."""
    if host.transport == "local":
        return ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if host.port:
        ssh += ["-p", str(host.port)]
    if host.key:
        ssh += ["-i", str(Path(host.key).expanduser())]
    if host.known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={Path(host.known_hosts).expanduser()}"]
    words = ["env", *(f"{k}={v}" for k, v in (env or {}).items()), *argv] if env else argv
    return [*ssh, f"{host.user}@{host.address}" if host.user else host.address, " ".join(map(_word, words))]


def place_reference(host: Host) -> str:
    """Put reference.py on the host; its path there."""
    if host.transport == "local":
        return str(REFERENCE)
    where = f"{host.workdir.rstrip('/')}/bench-reference"
    subprocess.run(on_host(host, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/reference.py"', "sh", where]),
                   input=REFERENCE.read_bytes(), check=True, capture_output=True)
    return f"{where}/reference.py"


def _env(host: Host, threads: int) -> dict[str, str]:
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    if host.interface:
        env["GLOO_SOCKET_IFNAME"] = host.interface
    return env


def reference_serial(host: Host, script: str, protocol: list[str], threads: int) -> dict:
    proc = subprocess.run(on_host(host, [host.python_path(), script, "serial", *protocol], _env(host, threads)),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"reference serial on {host.name} failed:\n{proc.stderr[-3000:]}")
    return last_json(proc.stdout, "reference serial")


def reference_pipeline(hosts: list[Host], scripts: list[str], split: list[str], protocol: list[str],
                       threads: int) -> dict:
    """One torchrun per host (static rendezvous on the first), like pictl's launch; the last rank's result."""
    master = hosts[0]
    port = subprocess.run(on_host(master, [master.python_path(), "-c", _FREE_PORT]), capture_output=True,
                          text=True, check=True).stdout.strip()
    procs = []
    for i, (host, script) in enumerate(zip(hosts, scripts, strict=True)):
        argv = [host.python_path(), "-m", "torch.distributed.run", f"--nnodes={len(hosts)}", "--nproc-per-node=1",
                f"--node-rank={i}", "--rdzv-backend=static", f"--master-addr={master.rendezvous_address}",
                f"--master-port={port}", "--max-restarts=0", script, "pipeline", "--split", ",".join(split),
                *protocol]
        procs.append(subprocess.Popen(on_host(host, argv, _env(host, threads)), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    outs = [p.communicate(timeout=1800) for p in procs]
    for host, p, (_, err) in zip(hosts, procs, outs, strict=True):
        if p.returncode:
            raise SystemExit(f"reference pipeline on {host.name} failed:\n{err[-3000:]}")
    result = last_json(outs[-1][0], "reference pipeline")
    if not result.get("matches_model"):
        raise SystemExit(f"reference pipeline: its output differs from the whole model's: {result}")
    return result


def pictl_run(inventory: Path, stages: int, split: list[str], args: argparse.Namespace, tmp: str) -> dict:
    return Pictl(Path(tmp)).run(inventory, "--stages", str(stages), "--split", ",".join(split), "--model", args.model,
                                "--images", str(args.images), "--chunk", str(args.chunk), "--warmup", str(args.warmup),
                                "--repeats", str(args.repeats), "--threads", str(args.threads), "--fresh-baseline")


def equal_blocks(stages: int, blocks: int = 12) -> list[str]:
    """Stages of (nearly) equal block counts: the split both sides use."""
    return [f"blocks.{round(blocks * k / stages)}" for k in range(1, stages)]


def compare(inventory: Path, args: argparse.Namespace) -> list[dict]:
    hosts = list(load_cluster(inventory).hosts)
    if args.stages > len(hosts):
        raise SystemExit(f"--stages {args.stages}: {inventory} has {len(hosts)} hosts (one stage per host)")
    hosts = hosts[: args.stages]
    split = equal_blocks(args.stages)
    protocol = ["--model", args.model, "--images", str(args.images), "--chunk", str(args.chunk),
                "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    scripts = [place_reference(h) for h in hosts]
    print(f"{args.model}, {args.stages} stages split at {', '.join(split)}, {args.images} images, chunk {args.chunk}, "
          f"{args.threads} thread(s), {args.warmup} warm-up + {args.repeats} timed passes; hosts "
          f"{', '.join(h.name for h in hosts)} from {inventory}", flush=True)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # Odd rounds: the plain serial loop just before pictl's run (serial baseline, then pipeline), the
            # plain pipeline just after it. Even rounds: the plain pipeline, then the plain loop, then pictl.
            # A speed that drifts inside a round (later runs faster, say) lowers the first order's ratio and
            # raises the second's by as much, so alternating cancels a steady drift in the geometric mean.
            if r % 2 == 0:
                ref_serial = reference_serial(hosts[0], scripts[0], protocol, args.threads)
                ours = pictl_run(inventory, args.stages, split, args, tmp)
                ref_pipe = reference_pipeline(hosts, scripts, split, protocol, args.threads)
            else:
                ref_pipe = reference_pipeline(hosts, scripts, split, protocol, args.threads)
                ref_serial = reference_serial(hosts[0], scripts[0], protocol, args.threads)
                ours = pictl_run(inventory, args.stages, split, args, tmp)
            row = {**round_row(ours, ref_serial, ref_pipe), "order": ORDERS[r % 2]}
            rounds.append(row)
            print(f"round {r + 1} ({row['order']}): serial img/s pictl {row['pictl_serial']:.2f} "
                  f"reference {row['ref_serial']:.2f} "
                  f"(x{row['serial_factor']:.3f}) | pipeline img/s pictl {row['pictl_pipeline']:.2f} reference "
                  f"{row['ref_pipeline']:.2f} (x{row['pipeline_factor']:.3f}) | speedup pictl "
                  f"{row['pictl_speedup']:.2f}x reference {row['ref_speedup']:.2f}x | ratio {row['ratio']:.3f} "
                  f"(fastest passes {row['ratio_best']:.3f})"
                  f"  (pictl's flags: {', '.join(row['flags']) or 'none'})"
                  + (f"  noisy: {'; '.join(row['disturbed'])}" if row["disturbed"] else ""), flush=True)
            if args.save:  # after every round: an interrupted check keeps the rounds it finished
                harness.save_result(args.save, {"args": {k: str(v) for k, v in vars(args).items()},
                                                "rounds": rounds})
    for h, script in zip(hosts, scripts, strict=True):
        if h.transport != "local":
            subprocess.run(on_host(h, ["rm", "-rf", str(Path(script).parent)]), capture_output=True)
    print(verdict(rounds))
    ratios = [r["ratio"] for r in rounds]
    gm, lo, hi = geometric_mean_ci(ratios)
    harness.verdict("pictl's speedup / the plain reference's (means, geometric mean over rounds)", gm,
                    (max(ratios) - min(ratios)) / gm, 1 - AGREEMENT <= lo and hi <= 1 + AGREEMENT,
                    f"95 % interval {lo:.3f}-{hi:.3f}, bar {AGREEMENT:.0%}")
    return rounds


def pictl_passes(ours: dict) -> dict[str, list[float]]:
    """Every timed pass's img/s of pictl's run, serial and pipeline, from the events in its run directory."""
    passes: dict[str, list[float]] = {"serial": [], "pipeline": []}
    for path in sorted(Path(ours["run_dir"], "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("event") == "throughput" and ev.get("role") in passes:
                passes[ev["role"]].append(ev["ips"])
    return passes


def round_row(ours: dict, ref_serial: dict, ref_pipe: dict) -> dict:
    """One round's figures: each side's serial and pipeline throughput (mean of the timed passes, and the
    fastest pass), both speedups, their ratio, and the ratio taken apart: pictl's serial over the plain serial
    loop measured just before it, and pictl's pipeline over the plain pipeline measured just after it
    (ratio = pipeline factor / serial factor), which says on which side a difference lies."""
    passes = pictl_passes(ours)
    row = {"pictl_serial": ours["serial_ips"], "pictl_pipeline": ours["throughput_ips"],
           "pictl_speedup": ours["speedup"], "ref_serial": ref_serial["mean_ips"], "ref_pipeline": ref_pipe["mean_ips"],
           "pictl_serial_best": max(passes["serial"]), "pictl_pipeline_best": max(passes["pipeline"]),
           "ref_serial_best": max(ref_serial["ips"]), "ref_pipeline_best": max(ref_pipe["ips"]),
           "flags": [f["code"] for f in ours.get("flags", [])],
           "passes": {"pictl_serial": passes["serial"], "pictl_pipeline": passes["pipeline"],
                      "ref_serial": ref_serial["ips"], "ref_pipeline": ref_pipe["ips"]}}
    row["ref_speedup"] = row["ref_pipeline"] / row["ref_serial"]
    row["ratio"] = row["pictl_speedup"] / row["ref_speedup"]
    row["serial_factor"] = row["pictl_serial"] / row["ref_serial"]
    row["pipeline_factor"] = row["pictl_pipeline"] / row["ref_pipeline"]
    row["ratio_best"] = (row["pictl_pipeline_best"] / row["pictl_serial_best"]) / \
        (row["ref_pipeline_best"] / row["ref_serial_best"])
    row["disturbed"] = disturbances(ours, ref_serial, ref_pipe)
    return row


SPREAD_LIMIT = 0.10


def disturbances(ours: dict, ref_serial: dict, ref_pipe: dict) -> list[str]:
    """What shows the machine's own noise in a round: a run whose timed passes spread by more than 10 %."""
    out = []
    for what, ips in (("pictl pipeline", ours["throughput_spread_ips"]), ("pictl serial", ours["serial_spread_ips"]),
                      ("reference serial", ref_serial["ips"]), ("reference pipeline", ref_pipe["ips"])):
        if ips and (max(ips) - min(ips)) / statistics.fmean(ips) > SPREAD_LIMIT:
            out.append(f"{what} passes spread {(max(ips) - min(ips)) / statistics.fmean(ips):.0%}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=Path, default=SHIPPED)
    parser.add_argument("--ssh", action="store_true", help="start the SSH test cluster (root) and use it")
    parser.add_argument("--cpu", type=float, default=0.4, help="--ssh: cores per host (a CFS quota)")
    parser.add_argument("--period-ms", type=float, default=10.0, help="--ssh: the quota's CFS period")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--images", type=int, default=12)
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20, help="timed passes (many short ones: see above)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--save", type=Path, help="also write every round's figures to this JSON file")
    parser.add_argument("--pool", type=Path, nargs="+", metavar="SAVED",
                        help="run nothing: the verdict over the rounds of earlier --save files together")
    harness.add_quick(parser)
    args = harness.quick_defaults(parser.parse_args(), ssh=False, stages=2, images=4, repeats=2, rounds=1)
    if args.pool:
        print(pooled(args.pool))
        return 0
    if not args.ssh:
        compare(args.hosts, args)
        return 0
    with harness.ssh_cluster(max(4, args.stages), cpu=args.cpu, period_ms=args.period_ms) as cluster:
        print(f"SSH test cluster: {cluster.n} hosts at {args.cpu} core(s) each (CFS period {args.period_ms:g} ms)")
        compare(cluster.inventory, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
