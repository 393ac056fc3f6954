"""The harness every benchmark script shares: its clusters, running pictl, rounds, verdicts and saved results.

- Clusters: `cluster(kind, ...)` is a context manager yielding an inventory: "shipped" (the repository's
  hosts.toml: 4 local hosts), "local" (N local hosts with work directories in a temporary directory), or
  "ssh" (the SSH test cluster of `tests/support/sshcluster.py`, root only, every host capped at a CPU
  share; stopped on the way out). The SSH cluster runs under its own tag (`BENCH_TAG`) so that a bench
  never tears down the cluster a test on the same machine is using.
- pictl: `Pictl` runs `python -m pictl ... --json` with runs and cache directories of its own and returns
  the JSON summary; any exit status it was not told to accept stops the bench with pictl's stderr. `known`
  takes a figure a finished run's typed summary must have (its fields are optional: a failed run has none).
- Rounds: `alternate` (A/B order flipped every round, so a steady drift cancels) and `median_spread`.
- Verdicts: `verdict` prints one PASS/FAIL line with the ratio and its spread.
- Results: `save_result` writes bench/results/<name>.json (or a given path).
- Quick mode: `add_quick` gives a script `--quick`, `quick_defaults` sets its small protocol, and
  `skip_loudly` / `is_root` let a script that needs root say so in one line.

Scripts run as modules from the repository root (`python -m bench.<name>`), so the repository is on the
import path and test support imports as `tests.support.<module>` (tests/ is a namespace package).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "hosts.toml"
RESULTS = ROOT / "bench" / "results"
REFERENCE = ROOT / "bench" / "reference.py"
"""The plain reference (no pictl code), a standalone script: it is copied to SSH hosts and run there."""
BENCH_TAG = "b"
"""The SSH test cluster's tag for benchmarks (`PICTL_SSHCLUSTER_TAG`): its own namespaces, logins and state."""
CLUSTER_KINDS = ("shipped", "local", "ssh")
T = TypeVar("T")


# ---- quick mode and root -------------------------------------------------------------------------------

def add_quick(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: few images, one round, the local cluster (what `make bench` runs)")


def quick_defaults(args: argparse.Namespace, **small: Any) -> argparse.Namespace:
    """With --quick, replace the protocol by the small one given (the script's own flags otherwise)."""
    if getattr(args, "quick", False):
        for name, value in small.items():
            setattr(args, name, value)
    return args


def is_root() -> bool:
    return os.geteuid() == 0


def skip_loudly(script: str, reason: str) -> int:
    """One line nobody misses, and a success exit: the quick mode ran what it could here."""
    print(f"!!! bench.{script} SKIPPED: {reason.upper()}", flush=True)
    return 0


# ---- clusters -----------------------------------------------------------------------------------------

def write_local_cluster(path: Path, hosts: int) -> Path:
    """A local inventory of `hosts` hosts whose work directories live under `path`."""
    body = ['[cluster]\nname = "bench"\n', '[defaults]\ntransport = "local"\ninterface = "lo"\nslots = 1\n']
    body += [f'[[host]]\nname = "h{i}"\nworkdir = "{path}/h{i}"\n' for i in range(hosts)]
    path.mkdir(parents=True, exist_ok=True)
    inventory = path / "hosts.toml"
    inventory.write_text("\n".join(body))
    return inventory


@contextmanager
def ssh_cluster(hosts: int = 4, *, cpu: float | None = None, period_ms: float = 10.0,
                slow_host: int | None = None) -> Iterator[Any]:
    """The SSH test cluster (root), every host capped at `cpu` cores (a CFS quota per `period_ms`; host
    `slow_host` at half), up for the block and down after it, also when the block fails or the bench is stopped
    (SIGTERM from `timeout` or `kill`, SIGHUP from a closed terminal: their default ends the process at once,
    leaving namespaces, logins and sshds behind)."""
    os.environ.setdefault("PICTL_SSHCLUSTER_TAG", BENCH_TAG)  # read when sshcluster is imported
    from tests.support.sshcluster import SshCluster, down

    def stopped(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    before = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}
    cluster = SshCluster(hosts)
    cluster.cfs_period_us = int(period_ms * 1000)
    try:
        cluster.up(cpu=cpu)
        if slow_host is not None and cpu is not None:
            cluster.set_cpu(slow_host, cpu / 2)
        yield cluster
    finally:
        down()
        for sig, handler in before.items():
            signal.signal(sig, handler)


@contextmanager
def cluster(kind: str, hosts: int = 4, *, cpu: float | None = None, period_ms: float = 10.0,
            slow_host: int | None = None, inventory: Path | None = None) -> Iterator[Path]:
    """An inventory of the given kind (see the module docstring); `inventory` overrides "shipped"."""
    if kind == "shipped":
        yield inventory or SHIPPED
    elif kind == "local":
        with tempfile.TemporaryDirectory(prefix="pictl-bench-cluster-") as tmp:
            yield write_local_cluster(Path(tmp), hosts)
    elif kind == "ssh":
        with ssh_cluster(max(4, hosts), cpu=cpu, period_ms=period_ms, slow_host=slow_host) as c:
            yield c.inventory
    else:
        raise ValueError(f"cluster kind {kind!r}: one of {', '.join(CLUSTER_KINDS)}")


def describe(kind: str, cpu: float | None, period_ms: float = 10.0) -> str:
    if kind == "ssh":
        return f"the SSH test cluster ({cpu} core(s) per host, CFS period {period_ms:g} ms)"
    return "the shipped local cluster" if kind == "shipped" else "a local cluster (uncapped)"


# ---- running pictl ------------------------------------------------------------------------------------

def last_json(out: str, what: str) -> dict:
    """The last JSON object line of a command's output (the result line of bench/reference.py and co.)."""
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{what}: no result\n{out[-2000:]}")


class Pictl:
    """`python -m pictl` with runs and cache directories of its own (a temporary directory unless given)."""

    def __init__(self, workdir: Path | None = None, *, cache: str | Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="pictl-bench-"))
        self.env = {**os.environ, "PICTL_RUNS_DIR": str(self.workdir / "runs"),
                    "PICTL_CACHE_DIR": str(cache or self.workdir / "cache")}

    def __call__(self, *args: str, ok: Sequence[int] = (0,), timeout: float = 3600) -> dict:
        """The JSON result of `pictl <args> --json`; stops the bench when its exit status is not in `ok`."""
        proc = subprocess.run([sys.executable, "-m", "pictl", *map(str, args), "--json"], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode not in ok:
            raise SystemExit(f"pictl {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout)

    def run(self, inventory: Path, *args: str, ok: Sequence[int] = (0,), timeout: float = 3600) -> dict:
        """The summary of one headless `pictl run` on `inventory`."""
        return self("run", "--hosts", str(inventory), *args, "--headless", ok=ok, timeout=timeout)


def watched_run(pictl: Pictl, inventory: Path | str, args: Sequence[str], on_line: Callable[[str], None], *,
                ok: Sequence[int] = (0,)) -> dict:
    """The summary of one headless `pictl run`, calling `on_line` with each line of its progress (stderr) as it
    comes: a benchmark acts on the run while it runs (slows a host after a pass, kills a rank)."""
    proc = subprocess.Popen([sys.executable, "-m", "pictl", "run", "--hosts", str(inventory), *args, "--headless",
                             "--json"], env=pictl.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()
    err = []
    for line in proc.stderr or []:
        err.append(line)
        on_line(line)
    proc.wait()
    reader.join()
    if proc.returncode not in ok:
        raise SystemExit(f"pictl run {' '.join(args)} failed ({proc.returncode}):\n{''.join(err)[-3000:]}")
    return json.loads(out[0])


def known(value: T | None, what: str) -> T:
    """A figure a finished run's summary must have (typed as optional: a failed run has none)."""
    if value is None:
        raise SystemExit(f"the run's summary has no {what}")
    return value


def flags(summary: dict) -> list[str]:
    return [f["code"] for f in summary.get("flags") or []]


# ---- rounds and verdicts ------------------------------------------------------------------------------

def alternate(items: Sequence[Any], round_index: int) -> list[Any]:
    """Round r's order: as given on even rounds, reversed on odd ones, so that a speed drifting steadily
    within a round biases the two orders equally and oppositely."""
    return list(items) if round_index % 2 == 0 else list(reversed(items))


def median_spread(xs: Sequence[float]) -> tuple[float, float]:
    """The median and the spread (max - min) / median."""
    mid = statistics.median(xs)
    return mid, (max(xs) - min(xs)) / mid if mid else 0.0


def verdict(what: str, ratio: float, spread: float, ok: bool, why: str = "") -> bool:
    """Print the one verdict line: PASS or FAIL, the ratio and its spread; `ok` returned."""
    print(f"{'PASS' if ok else 'FAIL'} {what}: ratio {ratio:.3f} (spread {spread:.1%})" + (f"; {why}" if why else ""),
          flush=True)
    return ok


# ---- results ------------------------------------------------------------------------------------------

def save_result(name_or_path: str | Path, data: Any) -> Path:
    """Write `data` as JSON to bench/results/<name>.json (a bare name) or to the path given."""
    path = Path(name_or_path)
    if path.parent == Path(".") and path.suffix != ".json":
        path = RESULTS / f"{path}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path
