"""Push and start-up on the real SSH test cluster (4 sshd hosts in network namespaces; needs root).

    sudo .venv/bin/python -m bench.push_and_startup [--rounds 5] [--cpu 0.5] [--runs 2] [--quick]

In one run, side by side:
1. Sending the tree pictl pushes (`remote/`, `profiles/`) to 4 hosts: `pictl push`
   against `parallel-scp -r` (pssh) and 4 parallel `rsync -a` over ssh, each a
   fresh command line with the same key and known_hosts: first push into an empty
   directory, then an unchanged re-push. Median of --rounds.
2. The time from `pictl run --stages 4` to the first image done, split into
   connect, push, prepare, plan, baseline, launch, rendezvous, model load and
   first image (the run summary's `startup`): a first run (fresh baseline), then
   --runs - 1 more with the baseline reused.
--cpu caps every host with a CFS quota (e.g. 0.5 core) to look more like a Pi. `--quick`: 1 round, 1 run
(without root: skipped with a loud line).
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
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.harness import add_quick, is_root, quick_defaults, skip_loudly, ssh_cluster
from pictl.cluster.push import local_tree

if TYPE_CHECKING:  # (imported by `ssh_cluster`, under the benchmarks' own tag)
    from tests.support.sshcluster import SshCluster

PICTL = [sys.executable, "-m", "pictl"]


def ssh_options(cluster: SshCluster) -> list[str]:
    # The same trust as pictl: the cluster's known_hosts, checking on, key login only.
    return ["-o", f"IdentityFile={cluster.state / 'client_key'}", "-o",
            f"UserKnownHostsFile={cluster.state / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes"]


def timed(argv_list: list[list[str]], stdout: list[str] | None = None) -> float:
    """Start every command at once, wait for all; wall seconds. Any failure aborts the bench."""
    start = time.perf_counter()
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argv_list]
    for argv, proc in zip(argv_list, procs, strict=True):
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {(out + err)[-800:]}")
        if stdout is not None:
            stdout.append(out)
    return time.perf_counter() - start


def pictl_own_seconds(out: str) -> float:
    """`pictl push` reports its own time (connect + push, without starting Python)."""
    return float(out.strip().splitlines()[-1].rsplit(" in ", 1)[1].rstrip("s"))


def clear(cluster: SshCluster, sub: str) -> None:
    for i in range(cluster.n):
        shutil.rmtree(f"/home/{cluster.user(i)}/{sub}", ignore_errors=True)


def bench_push(cluster: SshCluster, tree: Path, rounds: int) -> dict[str, dict[str, float]]:
    hosts_file = cluster.state / "pssh-hosts"
    hosts_file.write_text("".join(f"{cluster.user(i)}@{cluster.address(i)}\n" for i in range(cluster.n)))
    opts = ssh_options(cluster)
    pssh = ["parallel-scp", "-r", "-h", str(hosts_file), *[x for o in opts[1::2] for x in ("-O", o)],
            str(tree) + "/.", "bench-pscp"]
    rsync = [["rsync", "-a", "--delete", "-e", "ssh " + " ".join(opts), f"{tree}/",
              f"{cluster.user(i)}@{cluster.address(i)}:bench-rsync/"] for i in range(cluster.n)]
    pictl = [[*PICTL, "push", "--hosts", str(cluster.inventory)]]
    tools = {"pictl push": (pictl, "pictl/code"), "parallel-scp -r": ([pssh], "bench-pscp"),
             "rsync -a (x4)": (rsync, "bench-rsync")}
    results: dict[str, dict[str, list[float]]] = {name: {"first": [], "again": []}
                                                  for name in [*tools, "  (pictl in-process)"]}
    for _ in range(rounds):
        for name, (argvs, target) in tools.items():  # interleaved: drift hits every tool alike
            clear(cluster, target)
            if name.startswith("parallel-scp"):
                for i in range(cluster.n):  # pscp copies into an existing directory
                    d = Path(f"/home/{cluster.user(i)}/bench-pscp")
                    d.mkdir()
                    shutil.chown(d, cluster.user(i), cluster.user(i))
            outs: list[str] = []
            results[name]["first"].append(timed(argvs, outs))
            results[name]["again"].append(timed(argvs, outs))
            if name == "pictl push":
                results["  (pictl in-process)"]["first"].append(pictl_own_seconds(outs[0]))
                results["  (pictl in-process)"]["again"].append(pictl_own_seconds(outs[1]))
    for target in ("bench-pscp", "bench-rsync"):
        clear(cluster, target)
    return {name: {k: statistics.median(v) for k, v in r.items()} for name, r in results.items()}


def bench_startup(cluster: SshCluster, runs: int) -> list[dict]:
    """`pictl run` as a user types it; its summary holds the start-up split."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PICTL_RUNS_DIR": f"{tmp}/runs", "PICTL_CACHE_DIR": f"{tmp}/cache"}
        for _ in range(runs):
            proc = subprocess.run([*PICTL, "run", "--hosts", str(cluster.inventory), "--stages", "4", "--images",
                                   "12", "--warmup", "0", "--repeats", "1", "--policy", "equal", "--headless",
                                   "--json"],
                                  capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise SystemExit(f"pictl run failed ({proc.returncode}): {proc.stderr[-1500:]}")
            summary = json.loads(proc.stdout)
            out.append({"serial_reused": summary["serial_reused"], **summary["startup"]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cpu", type=float, default=None, help="CPU cores per host (default: no cap)")
    add_quick(parser)
    args = quick_defaults(parser.parse_args(), rounds=1, runs=1)
    if not is_root():
        return skip_loudly("push_and_startup", "needs root for the SSH test cluster (sudo)")
    if missing := [tool for tool in ("parallel-scp", "rsync", "ssh") if not shutil.which(tool)]:
        return skip_loudly("push_and_startup", f"{', '.join(missing)} not installed (apt install pssh rsync "
                                               "openssh-client)")
    with ssh_cluster(4, cpu=args.cpu) as cluster:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            for name, data in local_tree().items():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                (tree / name).write_bytes(data)
            os.chmod(tmp, 0o755)
            files = len(local_tree())
            size = sum(len(d) for d in local_tree().values())
            push = bench_push(cluster, tree, args.rounds)
        startup = bench_startup(cluster, args.runs)
    cap = f"{args.cpu} core(s) per host" if args.cpu else "no CPU cap"
    print(f"push: {files} files, {size / 1024:.0f} KiB, to 4 hosts; median of {args.rounds} ({cap})")
    print(f"  {'tool':<18} {'first push s':>12} {'re-push s':>10} {'first vs pictl':>15} {'re-push vs pictl':>17}")
    ours = push["pictl push"]
    for name, r in push.items():
        print(f"  {name:<18} {r['first']:>12.3f} {r['again']:>10.3f} {r['first'] / ours['first']:>14.2f}x "
              f"{r['again'] / ours['again']:>16.2f}x")
    print("time to first image, `pictl run --stages 4` (seconds):")
    keys = [k for k in startup[0] if k != "serial_reused"]
    print("  " + " ".join(f"{k.removesuffix('_s'):>11}" for k in keys) + "  baseline")
    for row in startup:
        print("  " + " ".join(f"{row[k]:>11.2f}" for k in keys) + f"  {'reused' if row['serial_reused'] else 'fresh'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
